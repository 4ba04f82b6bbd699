import { crc32c, crc32cCombine } from '../crc32c.js';
import { GcsError, isGcsError, isSessionExpired, UploadOffsetError } from '../gcs/errors.js';
import { keptFieldsOf, type NewObjectAttrs, type UploadSession, type WritableObjectClient, type WrittenObject } from '../gcs/object-client.js';
import { crc32cBase64 } from '../gcs/uploads.js';
import type { MemoryBudget } from '../memory/memory-budget.js';
import type { Metrics } from '../observe/metrics.js';
import type { HeldBytes, UploadSource } from './staged-copy.js';
import type { UploadBuffers } from './upload-buffers.js';

/** Chunks of resumable uploads in flight mount-wide (--write-global-max-blocks): each holds a chunk of memory. */
export class UploadSlots {
  private used = 0;
  private readonly waiters: Array<() => void> = [];

  constructor(readonly max: number) {}

  get inUse(): number {
    return this.used;
  }

  async take(): Promise<() => void> {
    if (this.used >= this.max) await new Promise<void>((r) => this.waiters.push(r));
    else this.used++;
    let given = false;
    return () => {
      if (given) return;
      given = true;
      const next = this.waiters.shift();
      if (next) next();
      else this.used--;
    };
  }
}

export interface UploadDeps {
  client: WritableObjectClient;
  slots: UploadSlots;
  memory: MemoryBudget;
  /** Chunk memory, reused between requests. */
  buffers: UploadBuffers;
  metrics: Metrics;
}

/**
 * One object's upload from its staged file, fed as the file grows (streaming) or all at once at close:
 * a resumable session whose chunks are read from the staged file (or lent from its memory), in order, one at a time (GCS commits a
 * session's bytes in order). The CRC32C of the bytes sent so far is carried along, so the finalize sends
 * the whole object's without reading the file again. A cut, 429 or 5xx chunk is resumed by putChunk from
 * GCS's committed offset; a session GCS no longer knows, or one that holds fewer bytes than were sent,
 * starts again from zero: the staged file still has every byte.
 */
export class FileUpload {
  private session: UploadSession | null = null;
  /** Bytes GCS has committed (and whose CRC32C is `crc`). */
  committed = 0;
  private crc = 0;
  /**
   * The CRC32C of each block of the object as sent (whole blocks, and the last, short one), by block
   * index: the block cache's index takes them when the written file goes into it, so its bytes are not
   * hashed a second time; a block file that does not match them fails its check when read.
   */
  readonly blockCrcs = new Map<number, number>();
  /** Cancelled: a send still in flight must not open a new session when it finds the old one gone. */
  private cancelled = false;

  constructor(
    private readonly deps: UploadDeps,
    private readonly name: string,
    private readonly file: UploadSource,
    readonly opts: { ifGenerationMatch: string } & NewObjectAttrs,
    /** The block cache's block size (0: no block hashes kept). */
    private readonly blockSize = 0,
  ) {}

  get started(): boolean {
    return this.session !== null;
  }

  /** Sends the file's bytes up to `end` (a multiple of the chunk unit), `chunk` bytes a request; the session is opened first if need be. */
  async sendUpTo(end: number, chunk: number): Promise<void> {
    while (this.committed < end) {
      // To the next multiple of `chunk`: after an fsync sent a part-chunk, the chunks line up again with
      // the file's chunks in memory (and the block cache's blocks).
      const to = Math.min(end, (Math.floor(this.committed / chunk) + 1) * chunk);
      await this.sendChunk(to, null);
    }
  }

  /** Sends the rest of the file (`size` bytes in all) and finalizes the object; rejects PRECONDITION when the name changed hands. */
  async finish(size: number, chunk: number): Promise<WrittenObject> {
    if (!this.session && this.committed === 0 && size <= chunk) return this.oneShot(size);
    // Whole chunks first, then the rest (at most a chunk) as the last one. A restart from zero (an
    // expired session) goes through the whole chunks again.
    const lastStart = size === 0 ? 0 : Math.floor((size - 1) / chunk) * chunk;
    for (;;) {
      await this.sendUpTo(lastStart, chunk);
      const object = await this.sendChunk(size, size);
      if (object) return object;
    }
  }

  /** A file of at most one chunk, never streamed: one request (uploadType=multipart), its CRC32C checked. */
  private async oneShot(size: number): Promise<WrittenObject> {
    const { client, memory } = this.deps;
    // No upload slot (those pace chunks of streams): many small files closed at once (a Zarr store
    // written by dask) go out together, each within the memory budget.
    const reservation = await memory.reserve(Math.max(1, size));
    try {
      const bytes = Buffer.allocUnsafe(size);
      await this.file.read(0, bytes);
      try {
        return await client.uploadObject(this.name, bytes, this.opts);
      } catch (err) {
        // A retry of an upload whose first answer was lost finds its own object there: not a clobber.
        const ours = isGcsError(err, 'PRECONDITION') ? await this.ownObject(size, crc32cBase64(crc32c(bytes))) : null;
        if (ours) return ours;
        throw err;
      }
    } finally {
      reservation.release();
    }
  }

  /** The live object, when it holds exactly the bytes this upload sent (size and CRC32C). */
  private async ownObject(size: number, crc: string): Promise<WrittenObject | null> {
    const live = await this.deps.client.statObject(this.name).catch(() => null);
    if (!live || live.size !== size || live.crc32c !== crc) return null;
    // Our object: it has the attributes this upload sent (the file's next upload keeps them from here).
    return { ...live, ...keptFieldsOf(this.opts), contentType: this.opts.contentType ?? null, metadata: { ...this.opts.metadata } };
  }

  /** Abandons the session (a file that stopped streaming, or was removed): GCS drops its bytes. */
  async cancel(): Promise<void> {
    this.cancelled = true;
    const s = this.session;
    this.session = null;
    this.committed = 0;
    this.crc = 0;
    if (s) await this.deps.client.cancelUpload(s).catch(() => undefined);
  }

  /** The running CRC32C after `bytes` at `from`, block by block where blocks line up (kept in blockCrcs). */
  private hash(bytes: Buffer, from: number, last: boolean): number {
    const bs = this.blockSize;
    // Blocks from here on are hashed again (a resend after a failure, maybe of other bytes).
    for (const i of this.blockCrcs.keys()) if ((i + 1) * bs > from) this.blockCrcs.delete(i);
    if (bs <= 0 || from % bs !== 0) return crc32c(bytes, this.crc);
    let crc = this.crc;
    for (let at = 0; at < bytes.length; at += bs) {
      const piece = bytes.subarray(at, at + bs);
      const c = crc32c(piece);
      if (piece.length === bs || last) this.blockCrcs.set((from + at) / bs, c);
      crc = crc32cCombine(crc, c, piece.length);
    }
    return crc;
  }

  /** One chunk [committed, to): the final one when `finalSize` is given. The finished object, or null to go on. */
  private async sendChunk(to: number, finalSize: number | null): Promise<WrittenObject | null> {
    const { client, slots, buffers, metrics } = this.deps;
    const from = this.committed;
    const length = to - from;
    const release = await slots.take();
    let buffer: HeldBytes | null = null;
    try {
      if (this.cancelled) throw new GcsError('CLOSED', `upload ${this.name}: cancelled`);
      // A streamed file's chunk is still in memory: sent from there, not read back from the staged file.
      const held = this.file.borrow(from, to);
      buffer = held ?? (await buffers.take(length));
      this.session ??= await client.startUpload(this.name, this.opts);
      const bytes = buffer.bytes;
      if (held) metrics.inc('write_chunks_from_memory');
      else await this.file.read(from, bytes);
      const crc = this.hash(bytes, from, finalSize !== null);
      const final = finalSize === null ? undefined : { size: finalSize, crc32c: crc32cBase64(crc) };
      try {
        const progress = await client.putChunk(this.session, from, bytes, { final });
        this.committed = to;
        this.crc = crc;
        if (final && !progress.object) throw new GcsError('INVALID', `upload ${this.name}: finalized without an object in the answer`);
        return progress.object;
      } catch (err) {
        if (isSessionExpired(err) || err instanceof UploadOffsetError) {
          // Again from the first byte, in a new session: what GCS held is gone or behind what was sent.
          metrics.inc('gcs_upload_sessions_expired');
          this.session = null;
          this.committed = 0;
          this.crc = 0;
          return null;
        }
        throw err;
      }
    } finally {
      buffer?.release();
      release();
    }
  }
}
