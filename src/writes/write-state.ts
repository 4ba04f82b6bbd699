import type { BlockSource } from '../blocks/block-source.js';
import { UPLOAD_CHUNK_UNIT, type ObjectMeta, type WrittenObject } from '../gcs/object-client.js';
import { MTIME_KEY, mtimeMetadata } from '../gcs/mtime.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import { composeAppend, COMPOSE_APPEND_MAX_TAIL, COMPOSE_APPEND_MIN_BYTES } from './append-compose.js';
import { FileUpload, type UploadDeps } from './file-upload.js';
import { KeptAttributes } from './kept-attributes.js';
import { StagedCopy } from './staged-copy.js';
import { UploadStream } from './upload-stream.js';
import { isPrecondition, WriteError } from './write-error.js';
import type { StagingDir } from './staging.js';

export interface WriteConfig {
  /** Bytes per upload chunk (--write-block-size-mb), a multiple of 256 KiB. */
  chunkBytes: number;
  /** New files written in order go to GCS as they are written (--enable-streaming-writes). */
  streaming: boolean;
  /** Chunks a streaming writer may run ahead of GCS before its writes wait (--write-max-blocks-per-file, at least 1). */
  maxChunksAhead: number;
}

export interface WriteStateDeps extends UploadDeps {
  config: WriteConfig;
  /** An upload over generation `replaced` ('0': none) finished: this machine sees `object` at `state.path` from now on. */
  uploaded: (state: WriteState, replaced: string, object: WrittenObject) => void;
  /** An upload met another writer's object (412): what this machine holds of `state.path` is out of date. */
  outdated: (state: WriteState) => void;
  staging: StagingDir;
  /** Where an append by compose puts its temporary tail (append-compose.ts TEMP_DIR in the mount's root). */
  appendTempPrefix: string;
  blocks: BlockSource;
  log: Logger;
  metrics: Metrics;
}

/** GCS's object size limit. */
const MAX_OBJECT_BYTES = 5 * 2 ** 40;

/**
 * A file open for writing through the mount (one per path, shared by its open handles): a staged copy of
 * the whole file, filled from the object it was opened on at its first change (not at all when it is
 * truncated to nothing or is new), and uploaded at close or fsync with `ifGenerationMatch` set to the
 * generation it was opened on ('0' for a new file), so an object replaced behind the mount's back is never
 * overwritten (ESTALE). A new file written in order streams (upload-stream.ts): each full chunk is sent
 * to a resumable session as soon as it is written, and close sends the last one.
 *
 * Every change and upload runs in order through `serial` (the kernel holds the inode's lock across a
 * write, but not across a flush or a release); reads of the staged copy do not wait.
 */
export class WriteState {
  handles = 0;
  /** Removed (unlinked, or renamed over): nothing is uploaded any more. */
  unlinked = false;
  size: number;
  mtimeMs: number;
  /** mtimeMs was set by utimes (not by a write) since the last change. */
  private mtimeExplicit = false;
  private dirty = false;
  private stale = false;
  /** Removed while its bytes could not be kept (detach): its handles read and write ESTALE, never an empty file. */
  private lost = false;
  private staged: StagedCopy | null = null;
  private filling: Promise<void> | null = null;
  /** The upload fed while a new file is written in order, and the session a flush finishes. */
  private readonly stream: UploadStream;
  private serial: Promise<unknown> = Promise.resolve();
  /** Writes and truncates so far: the block cache takes an upload's bytes only if none came after it. */
  private changes = 0;
  /**
   * The staged copy's first bytes that are still `source`'s (no write or truncate reached below it): at
   * `source.size`, the file is the object plus what was appended, and a close can append by compose.
   */
  private untouchedBelow = 0;
  /** What uploads keep of the object they replace (its content type and custom metadata). */
  private readonly kept: KeptAttributes;

  constructor(
    private readonly deps: WriteStateDeps,
    /** The mount path (renames change it). */
    public path: string,
    /** The object name uploads go to (renames change it). */
    public objectName: string,
    /** The object whose bytes the staged copy starts from: null for a new file. */
    private source: ObjectMeta | null,
    /** The precondition of the next upload: the generation the file was opened on, '0' when new. */
    private expect: string,
  ) {
    this.size = source?.size ?? 0;
    this.mtimeMs = source?.updatedMs ?? Date.now();
    this.kept = new KeptAttributes(deps.client, deps.log);
    this.stream = new UploadStream(deps, source === null && deps.config.streaming, () => this.newUpload());
    if (source === null) this.dirty = true; // a new file is uploaded at close even when empty
  }

  /** The file as lookups and stats show it while it is open for writing. */
  meta(): ObjectMeta {
    return {
      name: this.objectName,
      size: this.size,
      generation: this.expect,
      metageneration: this.source?.metageneration ?? '0',
      updatedMs: this.mtimeMs,
      crc32c: null,
    };
  }

  /** Whether an object of ours is live at this name in the bucket (the file is not new). */
  get inBucket(): boolean {
    return this.expect !== '0';
  }

  /** The generation live at this name as far as this file knows ('0': none): what its upload replaces. */
  get liveGeneration(): string {
    return this.expect;
  }

  /** The generation this file's bytes come from, while they are the object's (nothing written yet). */
  get cleanSource(): ObjectMeta | null {
    return this.staged === null ? this.source : null;
  }

  get stagedBytes(): number {
    return this.staged ? this.size : 0;
  }

  /**
   * The file is now `path`, to be uploaded as `name`, replacing the generation `expect` ('0': none)
   * there; `moved` is its object moved along: the source from now on, whether or not a staged copy
   * exists, since the old name's object is gone (a reader that joins once the last close dropped the
   * staged copy reads the source, and a read of the old name's generation would be a false ENOENT).
   */
  renamed(path: string, name: string, expect: string, moved: ObjectMeta | null): void {
    this.path = path;
    this.objectName = name;
    this.expect = expect;
    if (moved) this.source = moved;
    const u = this.stream.abandon();
    if (u) void this.run(() => u.cancel());
    // Nothing streams any more: bytes held in memory for the stream go to the staged copy.
    void this.run(async () => this.staged?.spill()).catch((err: unknown) => this.deps.log.warn({ path, err: String(err) }, 'a renamed file lost its staged bytes: its next close fails'));
  }

  write(pos: number, data: Buffer): Promise<number> {
    return this.run(async () => {
      this.check();
      if (pos + data.length > MAX_OBJECT_BYTES) throw new WriteError('EFBIG', 'past the largest object GCS stores');
      await this.ensureStaged(false);
      // A write into bytes a stream has sent (or is sending) cannot be streamed any more.
      if (this.stream.sentBeyond(pos)) {
        await this.stream.settled();
        await this.stream.cancel();
      }
      const grows = pos + data.length - this.size;
      if (grows > 0) this.reserveDisk(grows);
      this.untouchedBelow = Math.min(this.untouchedBelow, pos);
      // A streamed file's appends may stay in memory until a chunk is full (staged-copy.ts).
      await this.staged!.write(pos, data, this.stream.streaming && !this.unlinked && pos === this.size);
      this.size = Math.max(this.size, pos + data.length);
      this.touch();
      this.deps.metrics.inc('fuse_write_bytes', data.length);
      // Nothing of a removed file goes to GCS.
      if (this.stream.streaming && !this.unlinked) await this.stream.feed(this.size, this.staged!);
      return data.length;
    });
  }

  truncate(size: number): Promise<void> {
    return this.run(async () => {
      this.check();
      if (size > MAX_OBJECT_BYTES) throw new WriteError('EFBIG', 'past the largest object GCS stores');
      if (size === this.size && this.staged) return;
      await this.ensureStaged(size === 0);
      if (this.stream.sentBeyond(size)) {
        await this.stream.settled();
        await this.stream.cancel();
      }
      if (size > this.size) this.reserveDisk(size - this.size);
      this.untouchedBelow = Math.min(this.untouchedBelow, size);
      await this.staged!.truncate(size);
      this.size = size;
      this.touch();
    });
  }

  /**
   * The name is being removed or replaced while this file is open: its handles keep the bytes they had
   * (POSIX), so a copy not yet staged is made now, while the object still exists; nothing is uploaded
   * from here on.
   */
  detach(): Promise<void> {
    return this.run(async () => {
      try {
        await this.ensureStaged(false);
      } catch (err) {
        // The bytes cannot be kept (that generation is gone, replaced elsewhere; no room in the temp
        // dir; GCS failing): the name goes anyway, as gcsfuse's unlink, and this file's handles get
        // ESTALE from here on. Failing the unlink kept a name nobody could remove while a reader held it.
        this.stale = true;
        this.lost = true;
        this.dirty = false;
        this.deps.log.warn({ path: this.path, err: String(err) }, 'a removed file open here could not keep its bytes: its handles get ESTALE');
      } finally {
        this.unlinked = true;
        await this.stream.settled();
        if (this.stream.hasUpload) await this.stream.cancel();
      }
    });
  }

  /**
   * Waits for this file's changes and uploads in flight, and holds back later ones until the returned
   * function is called. A rename moves the file between two of them: one that ran beside a close's
   * upload let the upload land under the old name (a new file's bytes at `from` and nothing at `to`).
   */
  hold(): Promise<() => void> {
    return new Promise((held) => {
      void this.run(() => new Promise<void>((release) => held(release)));
    });
  }

  /**
   * A removal of the name that failed after detach(): the name and its object are still there, so the
   * file is the name's again and its next close uploads (a writer kept detached would see its writes and
   * closes succeed, and nothing reach GCS).
   */
  reattach(): void {
    this.unlinked = false;
  }

  /** The object this file knows is live at its name (what a rename of it moves), or null when it is new. */
  get liveObject(): ObjectMeta | null {
    return this.inBucket ? this.source : null;
  }

  /** An explicit mtime (utimes): kept for the upload, as gcsfuse keeps it. */
  setMtime(ms: number): void {
    this.mtimeMs = ms;
    this.mtimeExplicit = true;
  }

  /** Reads from the staged copy; null when there is none (nothing written: read the object). */
  async read(pos: number, size: number): Promise<Buffer | null> {
    if (this.filling) await this.filling;
    if (this.lost) throw new WriteError('ESTALE', `${this.objectName} was removed, and the bytes open here could not be kept`);
    if (!this.staged) return null;
    const n = Math.max(0, Math.min(size, this.size - pos));
    const buf = Buffer.allocUnsafe(n);
    await this.staged.read(pos, buf);
    return buf;
  }

  /**
   * Uploads what changed (close, fsync of a staged file): the object, or null when there was nothing to
   * upload. Rejects with a WriteError: ESTALE when the object changed behind the mount (the other
   * writer's object stays), EIO otherwise (the staged copy stays, the next close or fsync tries again).
   */
  flush(): Promise<WrittenObject | null> {
    return this.run(() => this.flushNow());
  }

  /** flush(), already in turn. */
  private async flushNow(): Promise<WrittenObject | null> {
    if (this.stale) throw new WriteError('ESTALE', `${this.objectName} was changed by another writer since it was opened`);
    if (!this.dirty) {
      await this.keepMtimeOnly();
      return null;
    }
    if (this.unlinked) return null;
    await this.ensureStaged(false);
    if (this.inBucket && this.source) await this.kept.learn(this.source, this.path);
    const t0 = performance.now();
    await this.stream.settled();
    const composed = await this.appendByCompose();
    if (composed) return this.landed(composed, new Map(), t0);
    // A stream goes on after a close of a dup'ed descriptor (dd, shells): the next session sends the
    // staged copy from its first byte again, over the generation this upload makes.
    const upload = this.stream.take() ?? this.newUpload();
    try {
      // The last chunk goes from memory; then the staged copy gets every byte (for the block cache, a
      // later close, a reader), whether or not the upload worked. A staged copy that could not take
      // them fails whatever reads it next (never the upload that already has them).
      const object = await this.keepExplicitMtime(upload, await upload.finish(this.size, this.deps.config.chunkBytes).finally(() => this.staged!.spill().catch(() => undefined)));
      return this.landed(object, upload.blockCrcs, t0);
    } catch (err) {
      throw this.failed(err);
    }
  }

  /** An upload (or compose) made `object` of this file: it is the source from now on. */
  private landed(object: WrittenObject, blockCrcs: ReadonlyMap<number, number>, t0: number): WrittenObject {
    this.dirty = false;
    // The object carries this mtime now: a later clean close or fsync has nothing to patch.
    this.mtimeExplicit = false;
    const replaced = this.expect;
    this.expect = object.generation;
    this.source = object;
    this.untouchedBelow = object.size;
    this.kept.uploaded(object);
    this.deps.uploaded(this, replaced, object);
    this.deps.metrics.inc('write_uploads');
    this.deps.metrics.inc('write_upload_ms', Math.round(performance.now() - t0));
    void this.adopt(object, blockCrcs, this.changes);
    return object;
  }

  /**
   * An object of COMPOSE_APPEND_MIN_BYTES or more that was only appended to (gcsfuse's append
   * optimization): its tail goes as a temporary object composed onto it (append-compose.ts); null when
   * this file is not such an append, or compose could not do it (the whole file is uploaded then).
   */
  private async appendByCompose(): Promise<WrittenObject | null> {
    const source = this.source;
    if (!source || !this.staged || this.unlinked || this.stream.hasUpload || source.generation !== this.expect || !this.inBucket) return null;
    const tailLength = this.size - source.size;
    if (source.size < COMPOSE_APPEND_MIN_BYTES || this.untouchedBelow < source.size || tailLength <= 0 || tailLength > COMPOSE_APPEND_MAX_TAIL) return null;
    const tail = Buffer.allocUnsafe(tailLength);
    await this.staged.read(source.size, tail);
    let outcome;
    try {
      const attrs = this.kept.forUpload(this.objectName, mtimeMetadata(this.mtimeMs));
      outcome = await composeAppend({ client: this.deps.client, log: this.deps.log, metrics: this.deps.metrics, tempPrefix: this.deps.appendTempPrefix }, { name: this.objectName, source, tail, attrs });
    } catch (err) {
      throw this.failed(err);
    }
    if ('fallback' in outcome) {
      // A composed object that is not this file's bytes is ours to replace: the upload goes over it.
      if (outcome.over) this.expect = outcome.over.generation;
      return null;
    }
    await this.staged.spill().catch(() => undefined);
    return outcome.object;
  }

  /**
   * fsync: a streamed file sends every whole chunk unit written so far and stays open for more (the object
   * appears at close, as with gcsfuse's streaming writes), opening its session if need be: a log fsynced
   * line by line is then sent once, not uploaded whole at each fsync. A streamed file smaller than a
   * chunk unit (which a session cannot take before its last chunk), and any other file, is uploaded now.
   */
  sync(): Promise<WrittenObject | null> {
    return this.run(async () => {
      if (!this.stream.streaming || this.unlinked || !this.dirty || (!this.stream.hasUpload && this.size < UPLOAD_CHUNK_UNIT)) return this.flushNow();
      if (this.stale) throw new WriteError('ESTALE', `${this.objectName} was changed by another writer since it was opened`);
      await this.stream.settled();
      const aligned = Math.floor(this.size / UPLOAD_CHUNK_UNIT) * UPLOAD_CHUNK_UNIT;
      this.stream.open();
      try {
        await this.stream.sendUpTo(aligned, this.staged);
      } catch (err) {
        throw this.failed(err);
      }
      return null;
    });
  }

  /** The last handle is gone: whatever a failed close left is tried once more, then the staged copy goes. */
  async close(): Promise<void> {
    try {
      if (this.dirty && !this.unlinked && !this.stale) await this.flush();
    } catch (err) {
      this.deps.log.error({ object: this.objectName, staged: this.staged?.path, err: String(err) }, 'a file closed without its upload: the staged copy is kept until the daemon stops');
      return;
    }
    await this.run(async () => {
      // Opened again while this close ran: the file goes on, staged copy and all.
      if (this.handles > 0) return;
      await this.stream.settled();
      if (this.stream.hasUpload && this.unlinked) await this.stream.cancel();
      const staged = this.staged;
      this.staged = null;
      await staged?.remove();
    });
  }

  // ---------------------------------------------------------------- inside

  private run<T>(work: () => Promise<T>): Promise<T> {
    const next = this.serial.then(work, work);
    this.serial = next.catch(() => undefined);
    return next;
  }

  private check(): void {
    if (this.stale) throw new WriteError('ESTALE', `${this.objectName} was changed by another writer since it was opened`);
  }

  private touch(): void {
    this.changes++;
    this.dirty = true;
    this.mtimeMs = Date.now();
    this.mtimeExplicit = false;
  }

  /**
   * An mtime set (utimes) after the upload's session began carries the older one: a streamed file's
   * session starts with its first chunk, and `cp -p` sets the mtime after its last write. The object's
   * metadata takes it now, on the generation just made (gcsfuse_mtime, as a utimes of a closed file).
   */
  private async keepExplicitMtime(upload: FileUpload, object: WrittenObject): Promise<WrittenObject> {
    if (!this.mtimeExplicit || upload.opts.metadata?.[MTIME_KEY] === mtimeMetadata(this.mtimeMs)[MTIME_KEY]) return object;
    // The bytes are in: a failure leaves only the older mtime, and does not fail the close.
    return (await this.patchMtime(object).catch(() => null)) ?? object;
  }

  /**
   * touch(1) of an existing file: opened for writing, its mtime set, closed with nothing written. No
   * upload (the bytes are the object's): the mtime goes into its metadata, as for a closed file's utimes.
   */
  private async keepMtimeOnly(): Promise<void> {
    const source = this.source;
    if (!this.mtimeExplicit || this.unlinked || !this.inBucket || !source) return;
    const patched = await this.patchMtime(source);
    if (!patched) return;
    this.mtimeExplicit = false;
    this.source = patched;
    this.deps.uploaded(this, this.expect, patched);
  }

  /** gcsfuse_mtime := this file's mtime on `object`'s generation; null when it could not be (logged). */
  private async patchMtime(object: ObjectMeta): Promise<WrittenObject | null> {
    try {
      const patched = await this.deps.client.patchMetadata(object.name, {
        ifGenerationMatch: object.generation,
        ifMetagenerationMatch: object.metageneration,
        metadata: mtimeMetadata(this.mtimeMs),
      });
      return { ...patched, updatedMs: this.mtimeMs };
    } catch (err) {
      // Changed or gone meanwhile: another writer's object now, not ours to stamp.
      this.deps.log.warn({ path: this.path, err: String(err) }, 'the mtime set on this file could not be kept in its object');
      return null;
    }
  }

  private reserveDisk(bytes: number): void {
    try {
      this.deps.staging.reserve(bytes);
    } catch (err) {
      throw new WriteError('ENOSPC', (err as Error).message);
    }
  }

  /** The staged copy, made at the first change: filled from the source object unless it is about to be emptied. */
  private async ensureStaged(emptying: boolean): Promise<void> {
    if (this.staged) return;
    // A writer that pauses puts what it holds in memory on disk, in turn with its changes.
    const idle = (): void => {
      this.run(async () => this.staged?.spill()).catch((err: unknown) => this.deps.log.warn({ path: this.path, err: String(err) }, 'an idle file lost its staged bytes: its next close fails'));
    };
    const staged = await StagedCopy.create(this.deps.staging, { buffers: this.deps.buffers, whenIdle: idle });
    this.staged = staged;
    const source = this.source;
    if (!source || emptying || source.size === 0) return;
    try {
      // Inside the try: a copy refused for room must not stay behind as the file, empty. It did, and the
      // next small write went into it: the upload at close was zeros where the object's bytes had been.
      this.reserveDisk(source.size);
      this.filling = staged.fill(source, this.deps.blocks);
      await this.filling;
      this.untouchedBelow = source.size;
    } catch (err) {
      this.staged = null;
      await staged.remove();
      throw this.failed(err);
    } finally {
      this.filling = null;
    }
  }

  private newUpload(): FileUpload {
    const attrs = this.kept.forUpload(this.objectName, mtimeMetadata(this.mtimeMs));
    return new FileUpload(this.deps, this.objectName, this.staged!, { ifGenerationMatch: this.expect, ...attrs }, this.deps.blocks.blockSize);
  }

  private failed(err: unknown): WriteError {
    if (err instanceof WriteError) return err;
    if (isPrecondition(err)) {
      this.stale = true;
      this.dirty = false;
      this.deps.outdated(this);
      this.deps.metrics.inc('write_estale');
      return new WriteError('ESTALE', `${this.objectName} was changed by another writer since it was opened: theirs is kept`);
    }
    this.deps.metrics.inc('write_failures');
    return new WriteError('EIO', `upload of ${this.objectName} failed: ${err instanceof Error ? err.message : String(err)}`);
  }

  /** The uploaded bytes go into the block cache, read from the staged copy (in the background). */
  private async adopt(object: WrittenObject, crcs: ReadonlyMap<number, number>, changesAt: number): Promise<void> {
    const staged = this.staged;
    if (!staged || object.size === 0) return;
    await this.run(async () => {
      // A write queued while the upload ran has changed the staged bytes: they are not the object's.
      if (this.changes !== changesAt) return;
      try {
        const n = await this.deps.blocks.adoptWritten(object, (pos, into, directCapacity) => staged.readForCache(pos, into, directCapacity), crcs);
        this.deps.metrics.inc('write_cached_blocks', n);
      } catch (err) {
        this.deps.log.warn({ object: object.name, err: String(err) }, 'written blocks not cached');
      }
    });
  }
}
