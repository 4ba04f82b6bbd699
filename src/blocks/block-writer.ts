import { crc32c } from '../crc32c.js';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { BlockIndex } from './block-index.js';
import { blockFileKey, type BlockKey } from './block-key.js';
import type { CacheSpace } from './eviction.js';
import { isDiskFull, WriteHealth, type Health, type WriteHealthConfig } from './write-health.js';
import type { BlockFileWriter } from '../block-file-write.js';
import { BlockWriteError, DIRECT_ALIGN, FILE_MODE, writeAndRename } from './block-files.js';

/** The process is out of descriptors or memory for a moment: not the cache dir's fault, not a state to enter. */
const RESOURCE_CODES = new Set(['EMFILE', 'ENFILE', 'ENOMEM', 'EAGAIN', 'EINTR']);

/** What the writes need of the cache's config (DiskCacheConfig's fields, documented there). */
export interface BlockWriterConfig extends WriteHealthConfig {
  dir: string;
  lowWatermark: number;
  directIo: boolean;
  addonWrites: boolean;
}

/** What the writes need of the cache they write into. */
export interface BlockWriterDeps {
  index: BlockIndex;
  space: CacheSpace;
  log: Logger;
  metrics: Metrics;
  /** Where block file KEY is. */
  path: (key: string) => string;
  /** Whether the cache is closed: its index's database may be shut. */
  closed: () => boolean;
  /** Makes the cache's folders again, for the retry after the cache was found unwritable. */
  ensureLayout: () => void;
  /** A block file may be left without its row: the next start has to reconcile. */
  strayFile: () => void;
  /** Logs that the daemon is short of descriptors or memory, at most once a minute with the reads' trouble. */
  resourceTrouble: (code: string, what: string) => void;
}

/**
 * The disk cache's write path: a block into its file and its index row, within the space eviction makes,
 * one write per block at a time. A write that fails pauses the writes (WriteHealth) and never rejects:
 * the block is then a miss, read from GCS again.
 */
export class BlockWriter {
  private readonly health: WriteHealth;
  /** Block writes in progress, by block file key. */
  private readonly writesInFlight = new Map<string, Promise<void>>();
  /** Temporary block files written so far: names them. */
  private tmpCount = 0;
  /** Off once the cache dir's file system refused O_DIRECT. */
  private directIo: boolean;
  /** Where block files in shared memory are written off this thread (the download workers), if anywhere. */
  offThread: BlockFileWriter | null = null;

  constructor(
    private readonly cfg: BlockWriterConfig,
    private readonly deps: BlockWriterDeps,
  ) {
    this.directIo = cfg.directIo;
    this.health = new WriteHealth(cfg, cfg.dir, deps.log);
  }

  /** Whether writes are on, or paused after a full disk or another failure. */
  get state(): Health {
    return this.health.state;
  }

  /**
   * Stores a block: temporary file, rename, then the index row, so a crash at any point leaves at worst a
   * file without a row (removed by reconciliation) and never a row that names a half-written file.
   * `data` must stay unchanged until the returned promise settles. `knownCrc32c`: the bytes' CRC32C when
   * the caller has just checked it, so they are not hashed again. `onStored`: called once the file is in
   * place and its row visible (before the row's batch commits), when this call writes it.
   */
  write(k: BlockKey, data: Buffer, directCapacity = 0, knownCrc32c: number | null = null, onStored?: () => void): Promise<void> {
    const key = blockFileKey(k);
    // One write per block at a time (the bytes of a key never differ): a second would reserve the
    // block's bytes again, and the budget would count it twice, evicting early, until a restart.
    const inFlight = this.writesInFlight.get(key);
    if (inFlight) return inFlight;
    // Never rejects: a cache that cannot store a block only means the next read goes to GCS.
    const p = this.writeNow(k, key, data, directCapacity, knownCrc32c, onStored).catch((err: Error) => {
      this.deps.metrics.inc('block_cache_write_errors');
      this.deps.log.warn({ dir: this.cfg.dir, err: err.message }, 'block cache write failed');
    });
    this.writesInFlight.set(key, p);
    void p.finally(() => this.writesInFlight.delete(key));
    return p;
  }

  /** Blocks being written now. */
  get writing(): boolean {
    return this.writesInFlight.size > 0;
  }

  /** Waits for the blocks being written (a clean stop should keep what it has downloaded). */
  async drain(): Promise<void> {
    while (this.writesInFlight.size > 0) await Promise.allSettled([...this.writesInFlight.values()]);
  }

  private async writeNow(k: BlockKey, key: string, data: Buffer, directCapacity: number, knownCrc32c: number | null, onStored?: () => void): Promise<void> {
    const { index, space, metrics } = this.deps;
    if (this.deps.closed() || data.length > space.limitBytes) return;
    const admitted = this.health.admit();
    if (admitted === 'skip') return;
    if (admitted === 'retry') {
      if (this.health.state === 'unwritable') {
        try {
          // Whatever went away (an emptied tmp/, a removed folder) comes back before the retry.
          this.deps.ensureLayout();
        } catch (err) {
          this.failed(err as NodeJS.ErrnoException);
          return;
        }
      }
    }
    if (index.has(key)) {
      this.health.notTried(); // not a retry after all: the next write is
      return;
    }
    // Unique within this process, which alone writes here while it holds the index's lock (a count: a
    // random suffix cost a crypto call per block).
    const tmp = join(this.cfg.dir, 'tmp', `${key}.${++this.tmpCount}`);
    const final = this.deps.path(key);
    let reserved = false;
    let written = false;
    let renamed = false;
    try {
      for (let room = space.makeRoom(data.length); room !== 'now'; room = space.makeRoom(data.length)) {
        if (room === 'none' || this.deps.closed()) {
          // Nothing left to evict above the free-space margin (all of it being written or read): a miss, not a failure.
          metrics.inc('block_cache_skipped_no_room');
          this.health.notTried();
          return;
        }
        await space.unlinked();
      }
      // Reserved with no await since the room was found, so concurrent writers cannot overshoot together.
      space.reserve(data.length);
      reserved = true;
      try {
        await this.writeBlockFile(tmp, final, data, directCapacity);
      } catch (err) {
        if (err instanceof BlockWriteError && err.stage === 'rename') {
          space.written(data.length);
          written = true;
        }
        throw err;
      }
      space.written(data.length);
      written = true;
      renamed = true;
      if (this.deps.closed()) throw new Error('closed');
      // A close while this waits commits the row (close() writes what is pending) and resolves it.
      const committed = index.putSoon({ key, ...k, size: data.length, crc32c: knownCrc32c ?? crc32c(data), lastAccess: Date.now() });
      onStored?.();
      await committed;
      this.health.succeeded();
    } catch (err) {
      if (reserved) space.unreserve(data.length, written);
      await fsp.rm(tmp, { force: true }).catch(() => undefined);
      // A file without a row costs disk the budget does not see, and after a clean stop nothing would
      // look for it: take it back. If even that fails, the next start reconciles.
      if (renamed) await fsp.rm(final, { force: true }).catch(() => this.deps.strayFile());
      if (!this.deps.closed()) this.failed(err as NodeJS.ErrnoException);
    }
  }

  /**
   * O_DIRECT when the block's memory is aligned and has room for the padded length: block files are
   * written once and read rarely, and the bytes a reader wants are in the kernel's cache of the mounted
   * file already, so a second copy in the page cache would only cost a memory copy and memory (measured
   * here: 1 GiB of 4 MiB block files, 0.1 CPU-s with O_DIRECT against 0.26-3.0 s through the page cache).
   */
  private async writeBlockFile(tmp: string, final: string, data: Buffer, directCapacity: number): Promise<void> {
    const padded = Math.ceil(data.length / DIRECT_ALIGN) * DIRECT_ALIGN;
    if (this.directIo && data.length > 0 && directCapacity >= padded) {
      try {
        return await this.writeFile(tmp, final, Buffer.from(data.buffer, data.byteOffset, padded), padded, data.length, true);
      } catch (err) {
        // EINVAL at open: the file system refuses O_DIRECT (tmpfs before Linux 6.6, for one), for every
        // block; EINVAL later: this write's (a short write leaves the next one unaligned).
        if (!(err instanceof BlockWriteError) || err.code !== 'EINVAL' || err.stage === 'rename') throw err;
        if (err.stage === 'open') {
          this.directIo = false;
          this.deps.log.info({ dir: this.cfg.dir }, 'the cache dir\'s file system refuses O_DIRECT; block files are written through the page cache');
        }
      }
    }
    await this.writeFile(tmp, final, data, data.length, data.length, false);
  }

  /**
   * A download worker writes it when it can (block memory shared with them): the write's completion
   * then wakes that worker, not this thread, and is told back with its next reply; one the worker could
   * not run at all (it died, the workers closed) is written here after all.
   */
  private async writeFile(tmp: string, final: string, data: Buffer, count: number, length: number, direct: boolean): Promise<void> {
    const offThread = this.cfg.addonWrites ? this.offThread?.(tmp, final, data, count, length, direct, FILE_MODE) : null;
    if (offThread) {
      try {
        await offThread;
        this.deps.metrics.inc('block_files_written_on_workers');
        return;
      } catch (err) {
        if (err instanceof BlockWriteError) throw err;
      }
    }
    await writeAndRename(tmp, final, data, count, length, direct, this.cfg.addonWrites);
  }

  /**
   * A write into the cache failed (a block, or the index's batch of access times): writes pause
   * (WriteHealth); after a full disk, a slice of the cache goes too.
   */
  failed(err: NodeJS.ErrnoException): void {
    this.deps.metrics.inc('block_cache_write_errors');
    if (err.code && RESOURCE_CODES.has(err.code)) {
      // This write is lost, the cache dir is fine: no pause. If it was the retry, the next write is.
      this.health.notTried();
      this.deps.resourceTrouble(err.code, 'a block could not be written to the cache just now');
      return;
    }
    this.health.failed(err);
    if (!isDiskFull(err)) return;
    try {
      // Make the next attempt likely to fit: give back a slice of what we hold.
      this.deps.space.evictDownTo(this.deps.space.bytes * this.cfg.lowWatermark);
    } catch {
      // The index may be what is full; the pause still holds.
    }
  }
}
