import type { Entry } from '../namespace/entry.js';
import type { Namespace } from '../namespace/namespace.js';
import type { NameMapper } from '../namespace/names.js';
import { GcsError, isGcsError } from '../gcs/errors.js';
import type { ObjectMeta, WritableObjectClient, WrittenObject } from '../gcs/object-client.js';
import { formatMtime, MTIME_KEY } from '../gcs/mtime.js';
import type { LocalChanges } from './local-changes.js';
import { WriteError } from './write-error.js';
import { WriteState, type WriteStateDeps } from './write-state.js';

export interface WritesDeps extends Omit<WriteStateDeps, 'uploaded'> {
  client: WritableObjectClient;
  names: NameMapper;
  namespace: Namespace;
  changes: LocalChanges;
  /** A folder with more objects than this is not renamed (gcsfuse's --rename-dir-limit): EMFILE. */
  renameDirLimit: number;
}

/**
 * The read side's open files, told before a name they read goes (so they keep their bytes) and when the
 * object they read is renamed (the same bytes under a new name and generation).
 */
export interface OpenReaders {
  /**
   * The name goes: its readers keep their bytes. With `state` (the file open for writing there), they
   * are that same file and read it; else each gets a private copy of what it read.
   */
  beforeRemoved(path: string, state?: WriteState): Promise<void>;
  moved(from: string, to: string, object: ObjectMeta): void;
  /** A new generation of `path` was written here: readers of the file go on with it, and the kernel is told of it. */
  uploaded(path: string, object: ObjectMeta): void;
  /** `path` is open for writing now: readers of it read what the writer writes. */
  writeOpened(path: string): void;
}

/** A change the mount refuses, with the errno the kernel gets. */
export class RefusedError extends Error {
  constructor(
    readonly errno: 'EEXIST' | 'ENOTEMPTY' | 'ENOENT' | 'EMFILE' | 'EISDIR' | 'ENOTDIR' | 'ESTALE',
    message: string,
  ) {
    super(message);
  }
}

const MOVE_PARALLEL = 16;

/**
 * The mount's writes: files open for writing (a WriteState per path) and the changes to the bucket's
 * names (unlink, mkdir, rmdir, rename, mtime), each recorded in LocalChanges so this machine sees it at
 * once. Object names come from the NameMapper (--only-dir), as the read side's do.
 */
export class Writes {
  private readonly states = new Map<string, WriteState>();
  /** Set by the FUSE layer once its read handles exist. */
  readers: OpenReaders | null = null;
  /** Last closes still running (an upload a failed close left, the staged copy's removal). */
  private readonly closing = new Set<Promise<void>>();

  private readonly stateDeps: WriteStateDeps;

  constructor(private readonly deps: WritesDeps) {
    this.stateDeps = {
      ...deps,
      uploaded: (state, object) => this.uploaded(state, object),
    };
    deps.metrics.setGauge('write_files_open', () => this.states.size);
    deps.metrics.setGauge('write_staged_bytes', () => {
      let n = 0;
      for (const s of this.states.values()) n += s.stagedBytes;
      return n;
    });
    deps.metrics.setGauge('write_uploads_in_flight', () => deps.slots.inUse);
  }

  /** The file open for writing at `path`, if any. */
  stateOf(path: string): WriteState | undefined {
    return this.states.get(path);
  }

  /** What this machine knows of `path` ahead of the caches: an open file, a change made here, or nothing (undefined). */
  localEntry(path: string): Entry | null | undefined {
    const state = this.states.get(path);
    if (state) return { kind: 'file', meta: state.meta() };
    return this.deps.changes.get(path);
  }

  /** What `path` is now, as this machine must see it. */
  async entryOf(path: string): Promise<Entry | null> {
    const local = this.localEntry(path);
    if (local !== undefined) return local;
    return this.deps.namespace.lookup(path);
  }

  /** Names changed here in the folder at `path` (null: removed), open files included. */
  changesIn(folder: string): Map<string, Entry | null> {
    const out = new Map(this.deps.changes.inFolder(folder) ?? []);
    const prefix = folder === '/' ? '/' : `${folder}/`;
    for (const [path, state] of this.states) {
      if (path.startsWith(prefix) && !path.slice(prefix.length).includes('/')) out.set(path.slice(prefix.length), { kind: 'file', meta: state.meta() });
    }
    return out;
  }

  /** Opens `path` for writing: the file open already, or a new state over `source` (null: a new file). */
  open(path: string, source: ObjectMeta | null): WriteState {
    let state = this.states.get(path);
    if (!state) {
      state = new WriteState(this.stateDeps, path, this.deps.names.objectName(path), source, source?.generation ?? '0');
      this.states.set(path, state);
      this.readers?.writeOpened(path);
    }
    state.handles++;
    return state;
  }

  /**
   * A private copy of `meta` for a reader whose name is about to go (unlinked, replaced): staged now,
   * while the object exists, and never uploaded. Released like any other.
   */
  async keepCopy(path: string, meta: ObjectMeta): Promise<WriteState> {
    const state = new WriteState(this.stateDeps, path, meta.name, meta, meta.generation);
    state.handles = 1;
    await state.detach();
    return state;
  }

  /** A handle of `state` closed; the last one uploads what is left and drops the staged copy. */
  release(state: WriteState): Promise<void> {
    if (--state.handles > 0) return Promise.resolve();
    const closing = state.close().then(() => {
      if (state.handles > 0) return; // opened again meanwhile: it goes on
      if (this.states.get(state.path) === state) this.states.delete(state.path);
    });
    this.closing.add(closing);
    // Both ways, not finally(): a failed close reaches its caller; a derived promise would fail again, unheard.
    const forget = (): void => void this.closing.delete(closing);
    closing.then(forget, forget);
    return closing;
  }

  /** Waits for the closes still running (the daemon is stopping). */
  async drain(): Promise<void> {
    while (this.closing.size > 0) await Promise.allSettled([...this.closing]);
  }

  /** An upload of `state` finished: this machine sees the object from now on. */
  private uploaded(state: WriteState, object: WrittenObject): void {
    if (state.unlinked) return;
    this.deps.changes.set(state.path, { kind: 'file', meta: object });
    this.readers?.uploaded(state.path, object);
  }

  // ---------------------------------------------------------------- names

  /** unlink: the object goes (whatever generation is live, as gcsfuse deletes); an open file of it stops uploading. */
  async removeFile(path: string): Promise<void> {
    const state = this.states.get(path);
    const entry = state ? null : await this.entryOf(path);
    if (!state && !entry) throw new RefusedError('ENOENT', `${path} does not exist`);
    if (entry?.kind === 'dir') throw new RefusedError('EISDIR', `${path} is a folder`);
    await this.readers?.beforeRemoved(path, state);
    if (state) {
      this.states.delete(path);
      await state.detach();
    }
    const live = state ? state.liveGeneration : entry?.kind === 'file' ? entry.meta.generation : undefined;
    if (!state || state.inBucket) await this.deleteObject(this.deps.names.objectName(path), live !== '0' ? live : undefined);
    this.deps.changes.set(path, null);
  }

  /** mkdir: a placeholder object `dir/`, created only where nothing is (EEXIST otherwise). */
  async makeDir(path: string): Promise<Entry> {
    const existing = await this.entryOf(path);
    if (existing) throw new RefusedError('EEXIST', `${path} exists`);
    try {
      await this.deps.client.uploadObject(this.deps.names.dirPrefix(path), Buffer.alloc(0), { ifGenerationMatch: '0' });
    } catch (err) {
      if (isGcsError(err, 'PRECONDITION')) throw new RefusedError('EEXIST', `${path} exists`);
      throw err;
    }
    const entry: Entry = { kind: 'dir', mtimeMs: Date.now() };
    this.deps.changes.set(path, entry);
    return entry;
  }

  /**
   * mknod of a regular file, or symlink (`metadata` names the link's target, gcs/symlinks.ts): an empty
   * object, created only where nothing is (EEXIST otherwise).
   */
  async makeFile(path: string, metadata?: Record<string, string>): Promise<Entry> {
    if (await this.entryOf(path)) throw new RefusedError('EEXIST', `${path} exists`);
    try {
      const object = await this.deps.client.uploadObject(this.deps.names.objectName(path), Buffer.alloc(0), { ifGenerationMatch: '0', ...(metadata ? { metadata } : {}) });
      const entry: Entry = { kind: 'file', meta: object };
      this.deps.changes.set(path, entry);
      return entry;
    } catch (err) {
      if (isGcsError(err, 'PRECONDITION')) throw new RefusedError('EEXIST', `${path} exists`);
      throw err;
    }
  }

  /** rmdir: refused while anything is under the folder (in the bucket, or open here); its placeholder goes. */
  async removeDir(path: string): Promise<void> {
    const entry = await this.entryOf(path);
    if (!entry) throw new RefusedError('ENOENT', `${path} does not exist`);
    if (entry.kind !== 'dir') throw new RefusedError('ENOTDIR', `${path} is not a folder`);
    if (this.hasLocalChildren(path)) throw new RefusedError('ENOTEMPTY', `${path} has files open for writing`);
    const prefix = this.deps.names.dirPrefix(path);
    const page = await this.deps.client.list({ prefix, maxResults: 2 });
    if (page.objects.some((o) => o.name !== prefix)) throw new RefusedError('ENOTEMPTY', `${path} is not empty`);
    const placeholder = page.objects.find((o) => o.name === prefix);
    if (placeholder) await this.deleteObject(prefix, placeholder.generation);
    this.deps.changes.set(path, null);
  }

  /** rename of a file or a folder (flags: RENAME_NOREPLACE = 1, RENAME_EXCHANGE = 2). Returns the new entry. */
  async rename(from: string, to: string, flags: number): Promise<Entry> {
    if (flags & 2) throw new RefusedError('ESTALE', 'RENAME_EXCHANGE is not supported'); // answered EINVAL by the caller
    const source = await this.entryOf(from);
    if (!source) throw new RefusedError('ENOENT', `${from} does not exist`);
    const target = await this.entryOf(to);
    if (target && flags & 1) throw new RefusedError('EEXIST', `${to} exists`);
    if (source.kind === 'dir') return this.renameDir(from, to, target);
    if (target?.kind === 'dir') throw new RefusedError('EISDIR', `${to} is a folder`);
    return this.renameFile(from, to, source.meta, target);
  }

  /** utimes of a file's mtime: kept for an open file's upload, else set in the object's metadata (gcsfuse_mtime). */
  async setMtime(path: string, ms: number): Promise<void> {
    const state = this.states.get(path);
    if (state) return state.setMtime(ms);
    const entry = await this.entryOf(path);
    if (entry?.kind !== 'file') return;
    try {
      const object = await this.deps.client.patchMetadata(entry.meta.name, {
        ifMetagenerationMatch: entry.meta.metageneration,
        metadata: { [MTIME_KEY]: formatMtime(BigInt(Math.round(ms)) * 1_000_000n) },
      });
      this.deps.changes.set(path, { kind: 'file', meta: { ...object, updatedMs: ms } });
    } catch (err) {
      // Gone or changed meanwhile: nothing of ours to set it on (gcsfuse ignores these too).
      if (!isGcsError(err, 'NOT_FOUND') && !isGcsError(err, 'PRECONDITION')) throw err;
    }
  }

  // ---------------------------------------------------------------- inside

  private hasLocalChildren(path: string): boolean {
    const prefix = `${path}/`;
    for (const p of this.states.keys()) if (p.startsWith(prefix)) return true;
    return false;
  }

  /**
   * Deletes whatever generation is live (gcsfuse's unlink), with that generation as a precondition so
   * that the delete may be retried: a second delete can then never take a newer object. Replaced
   * meanwhile (412): the new one is deleted, as an unlink without a precondition would have.
   */
  private async deleteObject(name: string, generation?: string): Promise<void> {
    for (let tries = 0; ; tries++) {
      const gen = generation ?? (await this.deps.client.statObject(name))?.generation;
      if (gen === undefined) return; // nothing there
      try {
        await this.deps.client.deleteObject(name, { ifGenerationMatch: gen });
        return;
      } catch (err) {
        // Already gone (another writer, or a retried delete whose first answer was lost): what we wanted.
        if (isGcsError(err, 'NOT_FOUND')) return;
        if (!isGcsError(err, 'PRECONDITION') || tries >= 3) throw err;
        generation = undefined;
      }
    }
  }

  private async renameFile(from: string, to: string, meta: ObjectMeta, target: Entry | null): Promise<Entry> {
    const state = this.states.get(from);
    const replaced = this.states.get(to);
    const targetGen = replaced ? replaced.liveGeneration : target?.kind === 'file' ? target.meta.generation : '0';
    if (target?.kind === 'file') await this.readers?.beforeRemoved(to, replaced);
    if (replaced) {
      this.states.delete(to);
      await replaced.detach();
    }
    let moved: WrittenObject | null = null;
    if (!state || state.inBucket) moved = await this.moveObject(this.deps.names.objectName(from), this.deps.names.objectName(to), state ? undefined : meta, targetGen);
    if (moved) this.readers?.moved(from, to, moved);
    this.deps.changes.set(from, null);
    if (state) {
      this.states.delete(from);
      state.renamed(to, this.deps.names.objectName(to), moved?.generation ?? targetGen, moved);
      this.states.set(to, state);
      // Shown while the file is open; once it closes, its upload (or the moved object) is what `to` is.
      const entry: Entry = { kind: 'file', meta: moved ?? state.meta() };
      this.deps.changes.set(to, entry);
      return { kind: 'file', meta: state.meta() };
    }
    const entry: Entry = { kind: 'file', meta: moved! };
    this.deps.changes.set(to, entry);
    return entry;
  }

  /** The atomic objects.move; where the server has none (400/501), a copy then a delete, with the same preconditions. */
  private async moveObject(src: string, dest: string, known: ObjectMeta | undefined, destGen: string): Promise<WrittenObject> {
    const { client } = this.deps;
    // What the source holds, to recognise it at `dest` when a retried move's first answer was lost.
    const source = known ?? (await client.statObject(src));
    if (!source) throw new RefusedError('ENOENT', `${src} does not exist`);
    const gen = source.generation;
    try {
      return await client.moveObject(src, dest, { ifSourceGenerationMatch: gen, ifGenerationMatch: destGen });
    } catch (err) {
      if (isGcsError(err, 'NOT_FOUND') || isGcsError(err, 'PRECONDITION')) return this.movedAlready(dest, source, err);
      if (!isGcsError(err, 'INVALID')) throw err;
    }
    // No objects.move on this server: a copy, then a delete of the source generation copied.
    const copy = await client.copyObject(src, dest, { ifSourceGenerationMatch: gen, ifGenerationMatch: destGen }).catch((err: unknown) => {
      if (isGcsError(err, 'PRECONDITION')) return this.movedAlready(dest, source, err);
      throw err;
    });
    await this.deleteObject(src, gen);
    return copy;
  }

  /** A move (or copy) refused: fine when `dest` already holds the source's bytes (our own retried call did it). */
  private async movedAlready(dest: string, source: ObjectMeta, err: unknown): Promise<WrittenObject> {
    const live = await this.deps.client.statObject(dest).catch(() => null);
    if (live && live.size === source.size && live.crc32c !== null && live.crc32c === source.crc32c) return { ...live, contentType: null, metadata: {} };
    if (isGcsError(err, 'NOT_FOUND')) throw new RefusedError('ENOENT', `${source.name} is gone`);
    throw new RefusedError('ESTALE', `${source.name} or ${dest} changed while being renamed`);
  }

  private movedUnder(from: string, to: string, rel: string, moved: WrittenObject): void {
    noteMoved(this.deps.changes, from, to, rel, moved);
  }

  private async renameDir(from: string, to: string, target: Entry | null): Promise<Entry> {
    const { client, names } = this.deps;
    if (target?.kind === 'file') throw new RefusedError('ENOTDIR', `${to} is a file`);
    if (target?.kind === 'dir') {
      const page = await client.list({ prefix: names.dirPrefix(to), maxResults: 2 });
      if (page.objects.some((o) => o.name !== names.dirPrefix(to)) || this.hasLocalChildren(to)) throw new RefusedError('ENOTEMPTY', `${to} is not empty`);
    }
    const srcPrefix = names.dirPrefix(from);
    const destPrefix = names.dirPrefix(to);
    const objects: ObjectMeta[] = [];
    let pageToken: string | undefined;
    do {
      const page = await client.list({ prefix: srcPrefix, pageToken, maxResults: 1000 });
      objects.push(...page.objects);
      pageToken = page.nextPageToken ?? undefined;
      if (objects.filter((o) => o.name !== srcPrefix).length > this.deps.renameDirLimit) {
        throw new RefusedError('EMFILE', `${from} holds more than --rename-dir-limit (${this.deps.renameDirLimit}) objects`);
      }
    } while (pageToken);
    const hasPlaceholder = objects.some((o) => o.name === srcPrefix);
    const files = objects.filter((o) => o.name !== srcPrefix);
    if (target?.kind === 'dir') await this.deleteObject(destPrefix);
    // The new placeholder first and the old one last, so the folder is never missing on either side.
    if (hasPlaceholder || files.length === 0) await client.uploadObject(destPrefix, Buffer.alloc(0), { ifGenerationMatch: '0' }).catch(ignorePrecondition);
    const movedByName = new Map<string, WrittenObject>();
    for (let i = 0; i < files.length; i += MOVE_PARALLEL) {
      await Promise.all(
        files.slice(i, i + MOVE_PARALLEL).map(async (o) => {
          const dest = destPrefix + o.name.slice(srcPrefix.length);
          const moved = await this.moveObject(o.name, dest, o, '0');
          movedByName.set(dest, moved);
          this.movedUnder(from, to, o.name.slice(srcPrefix.length), moved);
          const rel = o.name.slice(srcPrefix.length);
          if (!rel.endsWith('/')) this.readers?.moved(`${from}/${rel}`, `${to}/${rel}`, moved);
        }),
      );
    }
    // Files of the folder open for writing here go with it, each now over its moved object (if it had one).
    for (const [path, state] of [...this.states]) {
      if (!path.startsWith(`${from}/`)) continue;
      const dest = to + path.slice(from.length);
      const moved = movedByName.get(names.objectName(dest)) ?? null;
      this.states.delete(path);
      state.renamed(dest, names.objectName(dest), moved?.generation ?? '0', moved);
      this.states.set(dest, state);
    }
    const placeholder = objects.find((o) => o.name === srcPrefix);
    if (placeholder) await this.deleteObject(srcPrefix, placeholder.generation);
    this.deps.changes.set(from, null);
    const entry: Entry = { kind: 'dir', mtimeMs: Date.now() };
    this.deps.changes.set(to, entry);
    return entry;
  }
}

/** Records one object of a folder rename: it and the sub-folders it implies are gone under `from` and present under `to`. */
function noteMoved(changes: LocalChanges, from: string, to: string, rel: string, moved: WrittenObject): void {
  const isDir = rel.endsWith('/');
  const parts = (isDir ? rel.slice(0, -1) : rel).split('/');
  for (let i = 1; i <= parts.length; i++) {
    const sub = parts.slice(0, i).join('/');
    const leaf = i === parts.length;
    changes.set(`${from}/${sub}`, null);
    changes.set(`${to}/${sub}`, leaf && !isDir ? { kind: 'file', meta: moved } : { kind: 'dir', mtimeMs: moved.updatedMs });
  }
}

function ignorePrecondition(err: unknown): void {
  if (!isGcsError(err, 'PRECONDITION')) throw err;
}

/** The errno a failed write-side operation answers with. */
export function writeErrno(err: unknown): string {
  if (err instanceof RefusedError || err instanceof WriteError) return err.errno;
  if (err instanceof GcsError) {
    if (err.code === 'NOT_FOUND') return 'ENOENT';
    if (err.code === 'FORBIDDEN' || err.code === 'UNAUTHENTICATED') return 'EACCES';
    if (err.code === 'PRECONDITION') return 'ESTALE';
  }
  return 'EIO';
}
