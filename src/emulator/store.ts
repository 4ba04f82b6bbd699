// Buckets are folders under the root and objects are files, read afresh on every request so a test
// can rewrite a file behind the emulator's back. Names a file cannot hold go to a side store.
// The Store finds objects and commits and removes them under a per-bucket lock; what an object's file
// says is in stored-object.ts, and what a file cannot say is kept beside it (attributes.ts,
// content-encodings.ts).
import { randomBytes } from 'node:crypto';
import type { BigIntStats } from 'node:fs';
import { promises as fsp, renameSync, rmSync } from 'node:fs';
import path from 'node:path';
import { AttributeStore, NO_ATTRS, type NewAttrs, type ObjectAttrs } from './attributes.js';
import { EncodingStore } from './content-encodings.js';
import { statOrNull } from './file-stat.js';
import { FolderEntries } from './folder-entries.js';
import { SIDE_DIR, isFileSystemName } from './names.js';
import { fileSlotFree, moveInto, pruneEmptyParents } from './object-placement.js';
import { SideStore } from './side-store.js';
import { ensureNewer, generationOf, openObject, statObject, type OpenedObject, type StoredObject } from './stored-object.js';

/** Sees the current object (null: none) and its attributes; throws to refuse a write. */
export type WriteCheck = (cur: StoredObject | null, attrs: ObjectAttrs) => void;

export class Store {
  private readonly locks = new Map<string, Promise<void>>();

  /** Metageneration, contentType and custom metadata, per object generation. */
  readonly attrs = new AttributeStore((b) => this.bucketDir(b), (b) => this.tempPath(b));
  /** Content-Encodings, per object generation. */
  readonly encodings = new EncodingStore((b) => this.bucketDir(b), (b) => this.tempPath(b));
  /** Objects whose names a file cannot hold, and the index of those names. */
  readonly side = new SideStore((b) => this.bucketDir(b), (b) => this.tempPath(b));
  /** Bucket folders' entries in name order, for listings. */
  readonly folders = new FolderEntries();

  constructor(readonly root: string) {}

  bucketDir(bucket: string): string {
    return path.join(this.root, bucket);
  }

  async bucketStat(bucket: string): Promise<BigIntStats | null> {
    const st = await statOrNull(this.bucketDir(bucket));
    return st && st.isDirectory() ? st : null;
  }

  async listBuckets(): Promise<string[]> {
    const ents = await fsp.readdir(this.root, { withFileTypes: true });
    const out: string[] = [];
    for (const e of ents) {
      if (e.name.startsWith('.')) continue;
      if (e.isDirectory() || (e.isSymbolicLink() && (await statOrNull(path.join(this.root, e.name)))?.isDirectory())) {
        out.push(e.name);
      }
    }
    return out;
  }

  async createBucket(bucket: string): Promise<void> {
    await fsp.mkdir(this.bucketDir(bucket), { recursive: true });
  }

  async stat(bucket: string, name: string): Promise<StoredObject | null> {
    const p = await this.locate(bucket, name);
    return p === null ? null : statObject(bucket, name, p);
  }

  /** Opens the backing file so headers, hashes and body all describe the same version. */
  async open(bucket: string, name: string): Promise<OpenedObject | null> {
    const p = await this.locate(bucket, name);
    return p === null ? null : openObject(bucket, name, p);
  }

  /** A fresh temp path inside the bucket folder: same file system, so the final rename is atomic. */
  async tempPath(bucket: string): Promise<string> {
    const dir = path.join(this.bucketDir(bucket), SIDE_DIR, 'tmp');
    await fsp.mkdir(dir, { recursive: true });
    return path.join(dir, `${Date.now()}-${randomBytes(8).toString('hex')}`);
  }

  /**
   * Moves a fully written temp file into place as `name`. `check` sees the current object and its
   * attributes (for preconditions) under the bucket lock, so two racing uploads cannot both pass
   * ifGenerationMatch=0; whatever it throws aborts the commit and reaches the caller. `contentEncoding` is
   * the object's Content-Encoding metadata (e.g. 'gzip'), or null for identity; `attrs` its contentType
   * and custom metadata (metageneration 1, as every new generation has).
   */
  async commit(bucket: string, name: string, tmp: string, check: WriteCheck, contentEncoding: string | null = null, attrs: NewAttrs | null = null): Promise<StoredObject> {
    return this.locked(bucket, () => this.commitHeld(bucket, name, tmp, check, contentEncoding, attrs));
  }

  /** commit() for a caller that already holds the bucket lock (a move: delete and create in one step). */
  async commitHeld(bucket: string, name: string, tmp: string, check: WriteCheck, contentEncoding: string | null, attrs: NewAttrs | null): Promise<StoredObject> {
    const cur = await this.stat(bucket, name);
    check(cur, cur ? await this.attrs.get(cur) : NO_ATTRS);
    await ensureNewer(tmp, cur ? BigInt(cur.generation) : null);
    // Recorded before the rename (a rename keeps the mtime, so the generation), so no reader sees the
    // new object without its encoding and attributes.
    const tmpGeneration = generationOf(await fsp.stat(tmp, { bigint: true }));
    const record = async (generation: string): Promise<void> => {
      await this.encodings.set(bucket, name, contentEncoding === null ? null : { generation, contentEncoding });
      await this.attrs.set(bucket, name, attrs === null ? null : { generation, metageneration: '1', ...attrs });
    };
    await record(tmpGeneration);
    const dest = await this.place(bucket, name, tmp);
    const obj = await statObject(bucket, name, dest);
    if (!obj) throw new Error(`object vanished right after commit: ${dest}`);
    // A copy across file systems sets the mtime with less precision: record the generation it got.
    if ((contentEncoding !== null || attrs !== null) && obj.generation !== tmpGeneration) await record(obj.generation);
    return obj;
  }

  /** Deletes `name`; returns false if it did not exist. `check` may throw to refuse. */
  async remove(bucket: string, name: string, check: WriteCheck): Promise<boolean> {
    return this.locked(bucket, () => this.removeHeld(bucket, name, check));
  }

  /** remove() for a caller that already holds the bucket lock. */
  async removeHeld(bucket: string, name: string, check: WriteCheck): Promise<boolean> {
    const cur = await this.stat(bucket, name);
    if (!cur) return false;
    check(cur, await this.attrs.get(cur));
    this.folders.change(path.dirname(cur.path), path.basename(cur.path), false, () => rmSync(cur.path, { force: true }));
    await this.encodings.set(bucket, name, null);
    await this.attrs.set(bucket, name, null);
    const side = await this.side.names(bucket);
    if (side.has(name)) {
      await this.side.writeNames(bucket, [...side].filter((n) => n !== name));
    } else {
      await pruneEmptyParents(path.dirname(cur.path), this.bucketDir(bucket));
    }
    return true;
  }

  /** Runs `fn` holding the bucket's lock: every change to a bucket's objects and side files is made under it. */
  async locked<T>(bucket: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.locks.get(bucket) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((r) => (release = r));
    const tail = prev.then(() => mine);
    this.locks.set(bucket, tail);
    await prev;
    try {
      return await fn();
    } finally {
      release();
      if (this.locks.get(bucket) === tail) this.locks.delete(bucket);
    }
  }

  private async locate(bucket: string, name: string): Promise<string | null> {
    if ((await this.side.names(bucket)).has(name)) return this.side.objectPath(bucket, name);
    return isFileSystemName(name) ? path.join(this.bucketDir(bucket), name) : null;
  }

  /**
   * Moves the committed temp file to where `name` lives: its own path under the bucket folder when a
   * file can hold it there (leaving the side store if it was in it), else the side store. Returns the
   * object's file.
   */
  private async place(bucket: string, name: string, tmp: string): Promise<string> {
    const side = await this.side.names(bucket);
    const dir = this.bucketDir(bucket);
    if (isFileSystemName(name) && (await fileSlotFree(dir, name))) {
      const dest = path.join(dir, name);
      await fsp.mkdir(path.dirname(dest), { recursive: true });
      await this.moveIntoFolder(tmp, dest);
      if (side.has(name)) {
        await this.side.writeNames(bucket, [...side].filter((n) => n !== name));
        await fsp.rm(this.side.objectPath(bucket, name), { force: true });
      }
      return dest;
    }
    const dest = this.side.objectPath(bucket, name);
    await fsp.mkdir(path.dirname(dest), { recursive: true });
    await moveInto(tmp, dest);
    if (!side.has(name)) await this.side.writeNames(bucket, [...side, name]);
    return dest;
  }

  /** moveInto, keeping the destination folder's cached sorted entries current (see FolderEntries.change). */
  private async moveIntoFolder(tmp: string, dest: string): Promise<void> {
    try {
      this.folders.change(path.dirname(dest), path.basename(dest), true, () => renameSync(tmp, dest));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EXDEV') throw e;
      this.folders.forget(path.dirname(dest));
      await moveInto(tmp, dest);
    }
  }
}
