import type { Entry } from '../namespace/entry.js';
import type { Namespace } from '../namespace/namespace.js';
import { isGcsError } from '../gcs/errors.js';
import type { ObjectMeta, WrittenObject } from '../gcs/object-client.js';
import { mtimeMetadata } from '../gcs/mtime.js';
import { NameChanges, type NameChangesDeps } from './name-changes.js';
import type { OpenReaders } from './open-readers.js';
import { RefusedError } from './write-error.js';
import { WriteState, type WriteStateDeps } from './write-state.js';

export interface WritesDeps extends Omit<WriteStateDeps, 'uploaded' | 'outdated'>, NameChangesDeps {
  namespace: Namespace;
  /** --create-empty-file: a created name's empty object is made at once (see holdNewName). */
  createEmptyFile?: boolean;
}

/**
 * The mount's writes: files open for writing (a WriteState per path), mtimes set in the bucket, and the
 * changes to the bucket's names (unlink, mkdir, rmdir, rename: NameChanges', which moves and drops the
 * open files they touch), each recorded in LocalChanges so this machine sees it at once. Object names
 * come from the NameMapper (--only-dir), as the read side's do.
 */
export class Writes {
  private readonly states = new Map<string, WriteState>();
  /** Set by the FUSE layer once its read handles exist. */
  readers: OpenReaders | null = null;
  /** Last closes still running (an upload a failed close left, the staged copy's removal). */
  private readonly closing = new Set<Promise<void>>();

  private readonly stateDeps: WriteStateDeps;
  private readonly nameChanges: NameChanges;

  constructor(private readonly deps: WritesDeps) {
    this.stateDeps = {
      ...deps,
      uploaded: (state, replaced, object) => this.uploaded(state, replaced, object),
      // A new open after an ESTALE reads the object that is there now, not the cached one for a TTL more.
      outdated: (state) => {
        if (!state.unlinked) this.deps.changes.forget(state.path);
      },
    };
    this.nameChanges = new NameChanges(deps, { states: this.states, readers: () => this.readers, entryOf: (path) => this.entryOf(path) });
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

  /** An upload of `state` over generation `replaced` finished: this machine sees the object from now on. */
  private uploaded(state: WriteState, replaced: string, object: WrittenObject): void {
    if (state.unlinked) return;
    this.deps.changes.set(state.path, { kind: 'file', meta: object });
    this.readers?.uploaded(state.path, replaced, object);
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
        metadata: mtimeMetadata(ms),
      });
      this.deps.changes.set(path, { kind: 'file', meta: { ...object, updatedMs: ms } });
    } catch (err) {
      // Gone or changed meanwhile: nothing of ours to set it on (gcsfuse ignores these too).
      if (!isGcsError(err, 'NOT_FOUND') && !isGcsError(err, 'PRECONDITION')) throw err;
    }
  }

  // ---------------------------------------------------------------- names (name-changes.ts)

  removeFile(path: string): Promise<void> {
    return this.nameChanges.removeFile(path);
  }

  makeDir(path: string): Promise<Entry> {
    return this.nameChanges.makeDir(path);
  }

  /**
   * A name about to be created (O_CREAT, nothing there): with --create-empty-file (gcsfuse's
   * write.create-empty-file) its empty object is made now, as a hold other machines see, and the file's
   * bytes replace that generation at close (staged, as an edit: not streamed). Null without the option.
   */
  async holdNewName(path: string, exclusive: boolean): Promise<{ meta: ObjectMeta; theirs: boolean } | null> {
    if (!this.deps.createEmptyFile) return null;
    try {
      const entry = await this.makeFile(path);
      return entry.kind === 'file' ? { meta: entry.meta, theirs: false } : null;
    } catch (err) {
      // Another writer took the name meanwhile (this mount's caches had not seen it): O_CREAT without
      // O_EXCL opens what is there (theirs: O_TRUNC applies), as it would have had the name been
      // known; only O_EXCL is EEXIST.
      if (exclusive || !(err instanceof RefusedError) || err.errno !== 'EEXIST') throw err;
      const live = await this.deps.client.statObject(this.deps.names.objectName(path));
      if (!live) throw err;
      return { meta: live, theirs: true };
    }
  }

  makeFile(path: string, metadata?: Record<string, string>): Promise<Entry> {
    return this.nameChanges.makeFile(path, metadata);
  }

  removeDir(path: string): Promise<void> {
    return this.nameChanges.removeDir(path);
  }

  rename(from: string, to: string, flags: number): Promise<Entry> {
    return this.nameChanges.rename(from, to, flags);
  }
}
