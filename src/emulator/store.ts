// Buckets are folders under the root and objects are files, read afresh on every request so a test
// can rewrite a file behind the emulator's back. Names a file cannot hold go to a side store.
import { createHash, randomBytes } from 'node:crypto';
import type { BigIntStats } from 'node:fs';
import { promises as fsp, renameSync, rmSync, statSync } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { AttributeStore, NO_ATTRS, type NewAttrs, type ObjectAttrs } from './attributes.js';
import { SIDE_DIR, compareNames, isFileSystemName } from './names.js';

export interface StoredObject {
  bucket: string;
  name: string;
  /** The backing file. */
  path: string;
  ino: bigint;
  size: number;
  mtimeNs: bigint;
  /** The mtime in microseconds, as a decimal string. */
  generation: string;
}

/** Sees the current object (null: none) and its attributes; throws to refuse a write. */
export type WriteCheck = (cur: StoredObject | null, attrs: ObjectAttrs) => void;

export interface OpenedObject {
  obj: StoredObject;
  fh: FileHandle;
}

/** What a walk does with a folder: ignore it, list inside it, or report it as one prefix. */
export type DirDecision = 'skip' | 'descend' | 'collapse';

/** One entry of a bucket folder, as a listing walks it: `key` is the name, plus '/' for a folder. */
export interface SortedEntry {
  name: string;
  key: string;
  kind: 'file' | 'dir' | 'link';
  link: boolean;
}

/** Folders whose sorted entries are kept; each costs its entries' names. */
const FOLDER_CACHE_MAX = 10_000;

const INDEX = 'index.json';
/** Per bucket: name -> the Content-Encoding its upload declared, for the generation that upload made. */
const ENCODINGS = 'encodings.json';

/** What the encodings file holds for one name; it applies only while the object has that generation. */
interface StoredEncoding {
  generation: string;
  contentEncoding: string;
}

/**
 * The Content-Encodings of a bucket's objects. An entry counts only for the generation it was written
 * for, so a file rewritten behind the emulator's back (a new mtime, so a new generation) is identity.
 */
export class ContentEncodings {
  constructor(private readonly entries: ReadonlyMap<string, StoredEncoding>) {}

  of(obj: StoredObject): string | null {
    const e = this.entries.get(obj.name);
    return e && e.generation === obj.generation ? e.contentEncoding : null;
  }
}

export class Store {
  private readonly locks = new Map<string, Promise<void>>();
  private readonly indexCache = new Map<string, { key: string; names: Set<string> }>();
  private readonly encodingsCache = new Map<string, { key: string; entries: Map<string, StoredEncoding> }>();
  private readonly folderCache = new Map<string, { stamp: string; entries: readonly SortedEntry[] }>();
  private readonly folderReads = new Map<string, Promise<readonly SortedEntry[]>>();

  /** Metageneration, contentType and custom metadata, per object generation. */
  readonly attrs = new AttributeStore((b) => this.bucketDir(b), (b) => this.tempPath(b));

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
    return p === null ? null : this.statPath(bucket, name, p);
  }

  async statPath(bucket: string, name: string, p: string): Promise<StoredObject | null> {
    const st = await statOrNull(p);
    return st && st.isFile() ? toObject(bucket, name, p, st) : null;
  }

  /**
   * The same as statPath, synchronously: a listing stats a thousand files per page, and an awaited
   * bigint stat costs about ten times a synchronous one in this process.
   */
  statPathSync(bucket: string, name: string, p: string): StoredObject | null {
    let st: BigIntStats | undefined;
    try {
      st = statSync(p, { bigint: true, throwIfNoEntry: false });
    } catch (e) {
      if (isMissing(e)) return null;
      throw e;
    }
    return st && st.isFile() ? toObject(bucket, name, p, st) : null;
  }

  /** Opens the backing file so headers, hashes and body all describe the same version. */
  async open(bucket: string, name: string): Promise<OpenedObject | null> {
    const p = await this.locate(bucket, name);
    return p === null ? null : this.openPath(bucket, name, p);
  }

  async openPath(bucket: string, name: string, p: string): Promise<OpenedObject | null> {
    let fh: FileHandle;
    try {
      fh = await fsp.open(p, 'r');
    } catch (e) {
      if (isMissing(e)) return null;
      throw e;
    }
    try {
      const st = await fh.stat({ bigint: true });
      if (!st.isFile()) {
        await fh.close();
        return null;
      }
      return { obj: toObject(bucket, name, p, st), fh };
    } catch (e) {
      await fh.close();
      throw e;
    }
  }

  /** Names held in the side store (read from its index on every call, cached by the index's stat). */
  async sideNames(bucket: string): Promise<Set<string>> {
    const p = path.join(this.bucketDir(bucket), SIDE_DIR, INDEX);
    const st = await statOrNull(p);
    if (!st) return new Set();
    const key = `${st.ino}:${st.size}:${st.mtimeNs}`;
    const cached = this.indexCache.get(p);
    if (cached && cached.key === key) return cached.names;
    let names = new Set<string>();
    try {
      const parsed: unknown = JSON.parse(await fsp.readFile(p, 'utf8'));
      if (Array.isArray(parsed)) names = new Set(parsed.filter((n): n is string => typeof n === 'string'));
    } catch {
      // A hand-damaged index reads as empty rather than failing every request.
    }
    this.indexCache.set(p, { key, names });
    return names;
  }

  /** The bucket's Content-Encodings (read afresh when the file changed, like the side index). */
  async contentEncodings(bucket: string): Promise<ContentEncodings> {
    return new ContentEncodings(await this.encodingEntries(bucket));
  }

  private async encodingEntries(bucket: string): Promise<Map<string, StoredEncoding>> {
    const p = path.join(this.bucketDir(bucket), SIDE_DIR, ENCODINGS);
    const st = await statOrNull(p);
    if (!st) return new Map();
    const key = `${st.ino}:${st.size}:${st.mtimeNs}`;
    const cached = this.encodingsCache.get(p);
    if (cached && cached.key === key) return cached.entries;
    const entries = new Map<string, StoredEncoding>();
    try {
      const parsed: unknown = JSON.parse(await fsp.readFile(p, 'utf8'));
      for (const [name, v] of Object.entries(parsed as Record<string, Partial<StoredEncoding>>)) {
        if (typeof v?.generation === 'string' && typeof v.contentEncoding === 'string') entries.set(name, { generation: v.generation, contentEncoding: v.contentEncoding });
      }
    } catch {
      // A hand-damaged file reads as "no encodings" rather than failing every request.
    }
    this.encodingsCache.set(p, { key, entries });
    return entries;
  }

  /** Records (or, with null, forgets) `name`'s Content-Encoding for one generation. Call under the bucket lock. */
  private async setEncoding(bucket: string, name: string, value: StoredEncoding | null): Promise<void> {
    const entries = new Map(await this.encodingEntries(bucket));
    if (value === null && !entries.has(name)) return;
    if (value === null) entries.delete(name);
    else entries.set(name, value);
    const p = path.join(this.bucketDir(bucket), SIDE_DIR, ENCODINGS);
    await fsp.mkdir(path.dirname(p), { recursive: true });
    const tmp = await this.tempPath(bucket);
    await fsp.writeFile(tmp, JSON.stringify(Object.fromEntries(entries)));
    await fsp.rename(tmp, p);
  }

  sidePath(bucket: string, name: string): string {
    const digest = createHash('sha256').update(name, 'utf8').digest('hex');
    return path.join(this.bucketDir(bucket), SIDE_DIR, 'objects', digest);
  }

  /**
   * One folder's files and sub-folders, sorted as GCS sorts names (a folder by its name plus '/'), so a
   * listing can binary-search to its start and stop after one page: paging through a folder of 100,000
   * files then costs a page's work per request, not the folder's. Cached by the folder's own stat (an
   * added, removed or renamed entry changes its mtime); a symlink's kind is looked up on each use.
   */
  async sortedEntries(abs: string): Promise<readonly SortedEntry[]> {
    const st = await statOrNull(abs);
    if (!st || !st.isDirectory()) return [];
    const stamp = folderStamp(st);
    const hit = this.folderCache.get(abs);
    if (hit && hit.stamp === stamp) return hit.entries;
    // Concurrent pages of one large folder share one read of it.
    const key = `${abs}\0${stamp}`;
    let reading = this.folderReads.get(key);
    if (!reading) {
      reading = this.readSorted(abs, stamp).finally(() => this.folderReads.delete(key));
      this.folderReads.set(key, reading);
    }
    return reading;
  }

  private async readSorted(abs: string, stamp: string): Promise<readonly SortedEntry[]> {
    const entries: SortedEntry[] = [];
    for (const ent of await readdirOrEmpty(abs)) {
      if (ent.name.startsWith(SIDE_DIR)) continue;
      const kind = ent.isFile() ? 'file' : ent.isDirectory() ? 'dir' : ent.isSymbolicLink() ? 'link' : null;
      if (kind === null) continue;
      // A link's kind decides its sort key; it is read now and re-checked when the link is used.
      const linkKind = kind === 'link' ? await entryKind(ent, path.join(abs, ent.name)) : kind;
      if (linkKind === 'other') continue;
      entries.push({ name: ent.name, key: linkKind === 'dir' ? `${ent.name}/` : ent.name, kind, link: kind === 'link' });
    }
    entries.sort((a, b) => compareNames(a.key, b.key));
    this.folderCache.set(abs, { stamp, entries });
    if (this.folderCache.size > FOLDER_CACHE_MAX) this.folderCache.delete(this.folderCache.keys().next().value!);
    return entries;
  }

  /** The kind of a sorted entry now (a symlink is followed), with the set of link targets on its path. */
  async resolveEntry(abs: string, e: SortedEntry, targets: ReadonlySet<string>): Promise<{ kind: 'file' | 'dir' | 'other'; targets: ReadonlySet<string> | null }> {
    if (!e.link) return { kind: e.kind === 'dir' ? 'dir' : 'file', targets };
    const p = path.join(abs, e.name);
    const st = await statOrNull(p);
    if (!st) return { kind: 'other', targets: null };
    if (st.isFile()) return { kind: 'file', targets };
    if (!st.isDirectory()) return { kind: 'other', targets: null };
    const id = `${st.dev}:${st.ino}`;
    // Symlinked folders are followed, but never into one already on the current path (a loop).
    if (targets.has(id)) return { kind: 'other', targets: null };
    return { kind: 'dir', targets: new Set([...targets, id]) };
  }

  /** True when the folder holds at least one file, at any depth. */
  async folderHasFile(abs: string, targets: ReadonlySet<string>): Promise<boolean> {
    const entries = await this.sortedEntries(abs);
    const dirs: { p: string; targets: ReadonlySet<string> }[] = [];
    for (const e of entries) {
      const r = await this.resolveEntry(abs, e, targets);
      if (r.kind === 'file') return true;
      if (r.kind === 'dir' && r.targets) dirs.push({ p: path.join(abs, e.name), targets: r.targets });
    }
    for (const d of dirs) if (await this.folderHasFile(d.p, d.targets)) return true;
    return false;
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
    const tmpGeneration = ((await fsp.stat(tmp, { bigint: true })).mtimeNs / 1000n).toString();
    const record = async (generation: string): Promise<void> => {
      await this.setEncoding(bucket, name, contentEncoding === null ? null : { generation, contentEncoding });
      await this.attrs.set(bucket, name, attrs === null ? null : { generation, metageneration: '1', ...attrs });
    };
    await record(tmpGeneration);
    const side = await this.sideNames(bucket);
    const dir = this.bucketDir(bucket);
    let dest: string;
    if (isFileSystemName(name) && (await fileSlotFree(dir, name))) {
      dest = path.join(dir, name);
      await fsp.mkdir(path.dirname(dest), { recursive: true });
      await this.moveIntoFolder(tmp, dest);
      if (side.has(name)) {
        await this.writeIndex(bucket, [...side].filter((n) => n !== name));
        await fsp.rm(this.sidePath(bucket, name), { force: true });
      }
    } else {
      dest = this.sidePath(bucket, name);
      await fsp.mkdir(path.dirname(dest), { recursive: true });
      await moveInto(tmp, dest);
      if (!side.has(name)) await this.writeIndex(bucket, [...side, name]);
    }
    const obj = await this.statPath(bucket, name, dest);
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
    this.changeFolder(path.dirname(cur.path), path.basename(cur.path), false, () => rmSync(cur.path, { force: true }));
    await this.setEncoding(bucket, name, null);
    await this.attrs.set(bucket, name, null);
    const side = await this.sideNames(bucket);
    if (side.has(name)) {
      await this.writeIndex(bucket, [...side].filter((n) => n !== name));
    } else {
      await pruneEmptyParents(path.dirname(cur.path), this.bucketDir(bucket));
    }
    return true;
  }

  private async locate(bucket: string, name: string): Promise<string | null> {
    if ((await this.sideNames(bucket)).has(name)) return this.sidePath(bucket, name);
    return isFileSystemName(name) ? path.join(this.bucketDir(bucket), name) : null;
  }

  private async writeIndex(bucket: string, names: string[]): Promise<void> {
    const p = path.join(this.bucketDir(bucket), SIDE_DIR, INDEX);
    await fsp.mkdir(path.dirname(p), { recursive: true });
    const tmp = await this.tempPath(bucket);
    await fsp.writeFile(tmp, JSON.stringify(names));
    await fsp.rename(tmp, p);
  }

  /** moveInto, keeping the destination folder's cached sorted entries current (see changeFolder). */
  private async moveIntoFolder(tmp: string, dest: string): Promise<void> {
    try {
      this.changeFolder(path.dirname(dest), path.basename(dest), true, () => renameSync(tmp, dest));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EXDEV') throw e;
      this.folderCache.delete(path.dirname(dest));
      await moveInto(tmp, dest);
    }
  }

  /**
   * A file added to or removed from folder `dir` by the emulator itself, made synchronously between two
   * stats of the folder, so its cached sorted entries are patched rather than read again: re-reading and
   * sorting a 10,000-file folder for each listing after each upload made writing a Zarr store quadratic
   * (15 -> 4 files/s as the folder grew). A folder changed behind the emulator's back (its stamp is not
   * the cached one), or whose stamp did not move, is read again on its next listing.
   */
  private changeFolder(dir: string, name: string, added: boolean, change: () => void): void {
    const before = stampSync(dir);
    change();
    const hit = this.folderCache.get(dir);
    if (!hit) return;
    const after = stampSync(dir);
    if (before === null || after === null || hit.stamp !== before || after === before) {
      this.folderCache.delete(dir);
      return;
    }
    this.folderCache.set(dir, { stamp: after, entries: withFile(hit.entries, name, added) });
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
}

/** Index of the first sorted entry whose key is at or after `key` (entries.length if none). */
export function firstKeyAtOrAfter(entries: readonly SortedEntry[], key: string): number {
  let lo = 0;
  let hi = entries.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (compareNames(entries[mid]!.key, key) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** What says a folder's entries are the ones read: any added, removed or renamed entry changes it. */
function folderStamp(st: BigIntStats): string {
  return `${st.dev}:${st.ino}:${st.mtimeNs}:${st.ctimeNs}:${st.size}`;
}

function stampSync(dir: string): string | null {
  const st = statSync(dir, { bigint: true, throwIfNoEntry: false });
  return st?.isDirectory() ? folderStamp(st) : null;
}

/** Sorted entries with the regular file `name` present (added) or absent: a new array, as listings in progress hold the old one. */
function withFile(entries: readonly SortedEntry[], name: string, added: boolean): readonly SortedEntry[] {
  const lo = firstKeyAtOrAfter(entries, name);
  const found = lo < entries.length && entries[lo]!.key === name;
  const next = entries.slice();
  if (added) next.splice(lo, found ? 1 : 0, { name, key: name, kind: 'file', link: false });
  else if (found) next.splice(lo, 1);
  return next;
}

function toObject(bucket: string, name: string, p: string, st: BigIntStats): StoredObject {
  return { bucket, name, path: p, ino: st.ino, size: Number(st.size), mtimeNs: st.mtimeNs, generation: (st.mtimeNs / 1000n).toString() };
}

/**
 * Generations must strictly increase on replace, but two writes in the same microsecond (or on a
 * coarse-timestamp file system) share an mtime. utimes takes double seconds, which only resolve about
 * a quarter microsecond at today's epoch, hence the margin and the re-check.
 */
async function ensureNewer(file: string, oldGeneration: bigint | null): Promise<void> {
  if (oldGeneration === null) return;
  let st = await fsp.stat(file, { bigint: true });
  let step = 2n;
  while (st.mtimeNs / 1000n <= oldGeneration) {
    if (step > 100_000_000n) throw new Error(`cannot advance mtime of ${file} past generation ${oldGeneration}`);
    const secs = Number(oldGeneration + step) / 1e6;
    await fsp.utimes(file, secs, secs);
    st = await fsp.stat(file, { bigint: true });
    step *= 4n;
  }
}

/** True when `name` can be a regular file: no parent is a file and the path itself is not a folder. */
async function fileSlotFree(bucketDir: string, name: string): Promise<boolean> {
  const parts = name.split('/');
  let p = bucketDir;
  for (let i = 0; i < parts.length; i++) {
    p = path.join(p, parts[i]!);
    const st = await statOrNull(p);
    if (!st) return true;
    if (i < parts.length - 1 ? !st.isDirectory() : !st.isFile()) return false;
  }
  return true;
}

async function moveInto(tmp: string, dest: string): Promise<void> {
  try {
    await fsp.rename(tmp, dest);
  } catch (e) {
    // A symlinked sub-folder may sit on another file system: copy next to the target, then rename.
    if ((e as NodeJS.ErrnoException).code !== 'EXDEV') throw e;
    const near = path.join(path.dirname(dest), `${SIDE_DIR}-tmp-${randomBytes(8).toString('hex')}`);
    await fsp.copyFile(tmp, near);
    const st = await fsp.stat(tmp);
    await fsp.utimes(near, st.atime, st.mtime);
    await fsp.rename(near, dest);
    await fsp.rm(tmp, { force: true });
  }
}

async function pruneEmptyParents(dir: string, stop: string): Promise<void> {
  while (dir.startsWith(stop + path.sep)) {
    try {
      await fsp.rmdir(dir);
    } catch {
      return;
    }
    dir = path.dirname(dir);
  }
}

type Entry = { name: string; isFile(): boolean; isDirectory(): boolean; isSymbolicLink(): boolean };

async function readdirOrEmpty(dir: string): Promise<Entry[]> {
  try {
    return await fsp.readdir(dir, { withFileTypes: true });
  } catch {
    return [];
  }
}

async function entryKind(ent: Entry, p: string): Promise<'file' | 'dir' | 'other'> {
  if (ent.isFile()) return 'file';
  if (ent.isDirectory()) return 'dir';
  if (!ent.isSymbolicLink()) return 'other';
  const st = await statOrNull(p);
  return st?.isFile() ? 'file' : st?.isDirectory() ? 'dir' : 'other';
}

async function statOrNull(p: string): Promise<BigIntStats | null> {
  try {
    return await fsp.stat(p, { bigint: true });
  } catch (e) {
    if (isMissing(e)) return null;
    throw e;
  }
}

function isMissing(e: unknown): boolean {
  const code = (e as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ENOTDIR' || code === 'EISDIR' || code === 'ENAMETOOLONG' || code === 'ELOOP';
}
