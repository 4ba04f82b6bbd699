import { constants } from 'node:fs';
import { HandleReader } from '../blocks/handle-reader.js';
import { isGcsError } from '../gcs/errors.js';
import { Errno, errnoFor, readErrno } from './errno.js';
import { FALLBACK, OPEN_FLAGS, type NativeFile } from './kernel.js';
import type { Answer, OpContext } from './operations.js';
import { WriteOps } from './ops-writes.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { ByteRange } from '../prefetch/shard-follower.js';
import type { WriteState } from '../writes/write-state.js';

/** Linux's O_ACCMODE: node:fs does not export it. */
const O_ACCMODE = 3;

/** Read buffers kept for reuse: each goes back to the pool once the kernel has copied its reply out. */
const POOLED_BUFFER_BYTES = 1024 * 1024;
const MAX_POOLED_BUFFERS = 64;

/**
 * Open files and their reads: OPEN, READ and RELEASE. Opens for writing, and opens of a file a writer has
 * open, go to the write side (ops-writes.ts), as do reads and releases of its handles; on a read-only
 * mount an open for writing is EROFS.
 */
export class ReadOps {
  /** The native side of each open file (which of its blocks are on disk), by handle. */
  private readonly files = new Map<number, NativeFile>();
  /** Handles whose object went (unlinked, replaced): they read the private copy made before it did. */
  private readonly orphans = new Map<number, WriteState>();
  /** The inode each read handle was opened on (see metaOfInode). */
  private readonly inodeOf = new Map<number, number>();
  private readonly pool: Buffer[] = [];
  /**
   * Handles of followed shards all on disk, read through the page cache: their reads that reach us are
   * the kernel's (readahead in file order), not their reader's, so they do not move the shard follower
   * (their opens do: Prefetcher.openedThroughPageCache).
   */
  private readonly throughPageCache = new Set<number>();

  constructor(private readonly ctx: OpContext) {}

  open(a: Answer, ino: number, flags: number): void {
    const { inodes, handles, deps } = this.ctx;
    const path = inodes.path(ino);
    if (path === undefined) return a.error(Errno.ESTALE);
    const writing = (flags & O_ACCMODE) !== constants.O_RDONLY || (flags & constants.O_TRUNC) !== 0;
    if (this.ctx.writeOps && (writing || this.ctx.writes?.stateOf(path))) return this.ctx.writeOps.open(a, ino, flags);
    if (writing) return a.error(Errno.EROFS);
    this.ctx.entryOf(path).then(
      (entry) => {
        // A writer opened the path while this open waited for its entry (filled by a listing meanwhile,
        // its own open found it at once): it told the readers open then, and this one was not among them.
        // Registered with the native side here it would read the object's old bytes where the writer's
        // are, so it reads as any handle opened beside a writer does.
        if (this.ctx.writeOps && this.ctx.writes?.stateOf(path)) return this.ctx.writeOps.open(a, ino, flags);
        if (!entry) return a.error(Errno.ENOENT);
        if (entry.kind === 'dir') return a.error(Errno.EISDIR);
        const meta = handles.generationFor(path, entry.meta);
        // A shard whose reads the prefetcher follows (zarr opens it once per inner chunk), while blocks of it
        // are still to fetch: every read must reach it at the offset the reader asked, so neither the
        // native side nor the kernel's page cache and readahead (which sends whole aligned megabytes,
        // neighbours included) answers for it, and the handle reads nothing ahead (a block past one inner
        // chunk is a guess the prefetcher makes better). Once all its blocks are on disk there is nothing
        // to fetch in it and no neighbour to waste: it is read as any cached file (page cache, native
        // reads), and its opens stand for its reads (through JavaScript, a warm epoch of a sharded array
        // cost the daemon twice a plain one's CPU, and the main thread answered every read).
        deps.prefetcher?.opening(path, meta);
        const followed = deps.prefetcher?.followsReads(meta) ?? false;
        const pageCache = followed && !!deps.native && deps.blocks.allOnDisk(meta);
        const direct = followed && !pageCache;
        const reader = new HandleReader(deps.blocks, meta, followed ? { ...deps.reader, maxWindowBlocks: 0, keepRecent: true } : deps.reader);
        const fh = handles.add(path, reader);
        // Blocks of this generation already on disk are read natively from the first read on.
        const file = deps.fuse.nativeFile(fh, meta.size, deps.blocks.blockSize);
        if (!direct) deps.native?.register(file, meta, 0);
        this.files.set(fh, file);
        if (pageCache) this.throughPageCache.add(fh);
        // The kernel's pages of this inode stay while they belong to the generation this open reads
        // (libfuse 2's auto_cache did this by size and mtime); otherwise the open drops them.
        const node = inodes.node(ino);
        const keep = node !== undefined && node.cachedGeneration === meta.generation;
        if (node) node.cachedGeneration = meta.generation;
        if (!a.open(fh, (keep ? OPEN_FLAGS.KEEP_CACHE : 0) | (direct ? OPEN_FLAGS.DIRECT_IO : 0), file)) {
          reader.close();
          handles.remove(fh);
          this.files.delete(fh);
          this.throughPageCache.delete(fh);
          return;
        }
        this.inodeOf.set(fh, ino);
        deps.prefetcher?.opened(path, meta);
        if (pageCache) deps.prefetcher?.openedThroughPageCache(meta);
      },
      (err) => this.ctx.fail(a, path, err, errnoFor(err)),
    );
  }

  /** `fallback`: the native path gave this read back (a FALLBACK reason), `damagedKey` the block file it found bad. */
  read(a: Answer, ino: number, fh: number, pos: number, size: number, damagedKey: string | undefined, fallback: number, clean = false): void {
    const { inodes, handles, deps } = this.ctx;
    if (fallback) deps.native?.gaveBack(damagedKey, fallback);
    if (this.ctx.writeOps && WriteOps.isWriteHandle(fh)) return this.ctx.writeOps.read(a, fh, pos, size);
    const orphan = this.orphans.get(fh);
    if (orphan) {
      orphan.read(pos, size).then(
        (bytes) => (bytes ? a.buf(bytes, bytes.length) : a.buf(Buffer.alloc(0), 0)),
        (err) => this.ctx.fail(a, orphan.path, err, Errno.EIO),
      );
      return;
    }
    const reader = handles.get(fh);
    if (!reader) return a.error(Errno.EBADF);
    // The file is open for writing too (same inode): what the writer wrote is what every reader reads.
    const path = this.ctx.writes && !clean ? handles.pathOf(fh) : null;
    const written = path === null ? undefined : this.ctx.writes?.stateOf(path);
    if (written) {
      written.read(pos, size).then(
        (bytes) => (bytes ? a.buf(bytes, bytes.length) : this.read(a, ino, fh, pos, size, undefined, FALLBACK.NONE, true)),
        (err) => this.ctx.fail(a, written.path, err, Errno.EIO),
      );
      return;
    }
    // Before any cache answers it: a reader of a sharded Zarr array shows where it is only by its reads
    // (unless the kernel's page cache reads for it: see throughPageCache).
    const pageCache = this.throughPageCache.has(fh);
    if (!pageCache) deps.prefetcher?.read(reader.meta, pos);
    const file = this.files.get(fh);
    // The native path takes reads of this file's blocks on disk or on their way there; not a read it just
    // gave back, nor one a writer's changes may touch, nor a shard's the prefetcher follows by its reads.
    const native = deps.native && file && !fallback && !clean && (pageCache || !deps.prefetcher?.followsReads(reader.meta)) ? { reads: deps.native, file } : null;
    // Within one block that is here already: the kernel copies straight out of the block's memory.
    const view = reader.view(pos, size);
    if (view) {
      deps.metrics.inc('fuse_read_bytes', view.bytes.length);
      a.bufThen(view.bytes, view.bytes.length, view.release);
      // The reads after it in this handle's blocks go to the native path, as they would had this one.
      if (native) {
        const bs = deps.blocks.blockSize;
        const first = Math.floor(pos / bs);
        const n = native.reads.register(native.file, reader.meta, first, reader.nativeRunBlocks(), (i) => reader.heldBlock(i));
        if (n > 0) reader.servedElsewhere((first + n) * bs);
      }
      return;
    }
    // Blocks on disk, or on their way there: read and checked by a native worker, not here (unless it just
    // gave the read back, or a writer has the file open, whose first change the native side would not
    // see). A cold sequential reader's blocks are this handle's own, fetched ahead: half its window at a
    // time goes native, so the main thread sees a few reads per window rather than every one.
    if (native) {
      const held = reader.holds(pos, size);
      const until = native.reads.handOff(a.req, ino, native.file, reader.meta, pos, size, held ? reader.nativeRunBlocks() : undefined, (i) => reader.heldBlock(i));
      if (until > 0) return reader.servedElsewhere(until, held ? pos : undefined);
    }
    const failed = (err: unknown): void => {
      const path = inodes.path(ino) ?? '?';
      // The pinned generation is gone: this open file cannot go on (it must never mix generations),
      // but the next open should see the object as it is now.
      // What the kernel was told about the path stays as it is: it keeps that size until its attribute
      // timeout, and until then an open must read the generation the size belongs to (or fail).
      if (isGcsError(err, 'NOT_FOUND')) deps.namespace.forget(path);
      this.ctx.fail(a, path, err, readErrno(err));
    };
    const byBlocks = (): void => this.readByBlocks(a, reader, pos, size, failed);
    // A small inner chunk (or the index) of a shard its reader jumps about in: those bytes alone, not the block.
    const byRange = (range: ByteRange | null): void => {
      const ranged = range ? deps.blocks.getRange(reader.meta, range.offset, range.nbytes) : null;
      if (!range || !ranged) return byBlocks();
      ranged.then((data) => {
        const bytes = data.bytes.subarray(pos - range.offset, Math.min(data.bytes.length, pos - range.offset + size));
        deps.metrics.inc('fuse_read_bytes', bytes.length);
        a.bufThen(bytes, bytes.length, () => data.release());
      }, failed);
    };
    const range = deps.prefetcher?.innerRange(reader.meta, pos, size) ?? null;
    if (range instanceof Promise) range.then(byRange, failed);
    else byRange(range);
  }

  release(a: Answer, fh: number): void {
    if (this.ctx.writeOps && WriteOps.isWriteHandle(fh)) return this.ctx.writeOps.release(a, fh);
    this.drop(fh);
    a.ok();
  }

  /** A read handle's release the addon answered (it never answers a write handle's). */
  released(fh: number): void {
    this.drop(fh);
    this.ctx.deps.metrics.observeOp('release', 0, false);
  }

  private drop(fh: number): void {
    const orphan = this.orphans.get(fh);
    if (orphan) {
      this.orphans.delete(fh);
      void this.ctx.writes?.release(orphan);
    }
    this.ctx.handles.get(fh)?.close();
    this.ctx.handles.remove(fh);
    this.files.delete(fh);
    this.inodeOf.delete(fh);
    this.throughPageCache.delete(fh);
  }

  /**
   * What a read handle open on inode `ino` reads (its private copy once the object went): for an inode
   * whose name went, whose fstat comes without a handle.
   */
  metaOfInode(ino: number): ObjectMeta | undefined {
    for (const [fh, i] of this.inodeOf) {
      if (i !== ino) continue;
      const meta = this.orphans.get(fh)?.meta() ?? this.ctx.handles.get(fh)?.meta;
      if (meta) return meta;
    }
    return undefined;
  }

  /** The file read handle `fh` reads since its object went, if it did. */
  orphanOf(fh: number): WriteState | undefined {
    return this.orphans.get(fh);
  }

  /** A writer opened `path`: its readers' blocks on disk no longer answer for it (the writer changes the bytes). */
  writeOpened(path: string): void {
    for (const fh of this.ctx.handles.openOn(path)) {
      const file = this.files.get(fh);
      if (file) this.ctx.deps.fuse.dropBlocks(file);
    }
  }

  /**
   * Handle `fh` reads `meta` from now on, a generation with other bytes (HandleTable.moved after an upload
   * here): neither its reader's blocks nor its native registrations (the old generation's) answer a read
   * any more, and its native side clamps reads to the new size (a grown file's new end would read as EOF).
   */
  regenerated(fh: number, meta: ObjectMeta): void {
    this.ctx.handles.get(fh)?.regenerate(meta);
    const file = this.files.get(fh);
    if (file) this.ctx.deps.fuse.setFileSize(file, meta.size);
  }

  /**
   * `path` is about to be removed or replaced: each handle reading it reads `state` (the file a writer has
   * open there) or, without one, a private copy of its bytes made first.
   */
  async keepBytes(path: string, state: WriteState | undefined): Promise<void> {
    const writes = this.ctx.writes;
    if (!writes) return;
    for (const fh of this.ctx.handles.openOn(path)) {
      const reader = this.ctx.handles.get(fh);
      if (!reader || this.orphans.has(fh)) continue;
      // The file a writer has open is the one this handle reads (one inode): it goes on reading it.
      if (state) state.handles++;
      this.orphans.set(fh, state ?? (await writes.keepCopy(path, reader.meta)));
      this.ctx.handles.release(fh);
    }
  }

  /** Within one block still on its way: answered from the block's memory once it is here; else copied as blocks arrive. */
  private readByBlocks(a: Answer, reader: HandleReader, pos: number, size: number, failed: (err: unknown) => void): void {
    let later: ReturnType<typeof reader.viewLater>;
    try {
      later = reader.viewLater(pos, size);
    } catch (err) {
      return failed(err);
    }
    if (later) {
      later.then((v) => {
        this.ctx.deps.metrics.inc('fuse_read_bytes', v.bytes.length);
        a.bufThen(v.bytes, v.bytes.length, v.release);
      }, failed);
      return;
    }
    this.readIntoBuffer(a, reader, pos, size, failed);
  }

  /** The read no block's memory can answer: copied into a buffer (a pooled one when it fits) as blocks arrive. */
  private readIntoBuffer(a: Answer, reader: HandleReader, pos: number, size: number, failed: (err: unknown) => void): void {
    const pool = this.pool;
    const pooled = size <= POOLED_BUFFER_BYTES;
    const buf = pooled ? (pool.pop() ?? Buffer.allocUnsafeSlow(POOLED_BUFFER_BYTES)) : Buffer.allocUnsafeSlow(size);
    const giveBack = (): void => {
      if (pooled && pool.length < MAX_POOLED_BUFFERS) pool.push(buf);
    };
    const done = (n: number): void => {
      this.ctx.deps.metrics.inc('fuse_read_bytes', n);
      a.bufThen(buf, n, giveBack);
    };
    const readFailed = (err: unknown): void => {
      giveBack();
      failed(err);
    };
    try {
      const n = reader.read(pos, buf.subarray(0, size));
      if (typeof n === 'number') done(n);
      else n.then(done, readFailed);
    } catch (err) {
      readFailed(err);
    }
  }
}
