import { crc32c } from '../crc32c.js';
import { createHash } from 'node:crypto';
import { promises as fsp, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { SizeLimit } from '../units.js';
import { BlockIndex, type BlockRow } from './block-index.js';
import { CacheSpace } from './eviction.js';
import { reconcileBlocks } from './reconcile.js';
import { isDiskFull, WriteHealth, type Health, type WriteHealthConfig } from './write-health.js';
import { BlockWriteError, DIRECT_ALIGN, ensureLayoutDir, readFully, removeOldLayouts, writeAndRename } from './block-files.js';

/**
 * Why reading a block file failed, as far as the block goes: only a file that is not there (or is not
 * ours: a symlink, a folder) or a disk error is damage. EMFILE, ENFILE, ENOMEM, EAGAIN or EACCES say
 * nothing about the block; dropping it for them emptied the cache of a daemon at its fd limit.
 */
const DAMAGE_CODES = new Set(['ENOENT', 'ENOTDIR', 'ELOOP', 'EISDIR', 'EIO']);

/** The process is out of descriptors or memory for a moment: not the cache dir's fault, not a state to enter. */
const RESOURCE_CODES = new Set(['EMFILE', 'ENFILE', 'ENOMEM', 'EAGAIN', 'EINTR']);

/** At most one log line per this long about blocks that could not be read or written for want of resources. */
const RESOURCE_LOG_MS = 60_000;

/** Which block of which generation of which object, cut at which block size. */
export interface BlockKey {
  bucket: string;
  object: string;
  generation: string;
  block: number;
  /**
   * Part of the key because block N means different bytes at different sizes, and a size check alone
   * cannot tell (block 1 of 12 MiB is bytes 4-8 MiB at 4 MiB blocks, 8-12 MiB at 8 MiB: both 4 MiB long).
   */
  blockSize: number;
}

export interface DiskCacheConfig extends WriteHealthConfig {
  dir: string;
  limit: SizeLimit;
  /** Once over the limit, evict down to this fraction of it, so eviction runs in batches, not per write. */
  lowWatermark: number;
  /** How often batched access times reach SQLite. */
  accessFlushMs: number;
  /** Write block files with O_DIRECT when the block's memory allows it (gcsfuse's --file-cache-enable-o-direct). */
  directIo: boolean;
  /** Block files written by the addon in one pool-thread job (false: through fs.promises, step by step). */
  addonWrites: boolean;
}

export const DEFAULT_DISK_CACHE: Omit<DiskCacheConfig, 'dir' | 'limit'> = {
  lowWatermark: 0.9,
  accessFlushMs: 5_000,
  directIo: true,
  addonWrites: true,
  fullPauseMs: 30_000,
  unwritableRetryMs: 5_000,
  unwritableRetryMaxMs: 5 * 60_000,
};

/**
 * The layout version is in the folder name, like the table name: a new format starts a new cache.
 * v2: v1 could hold the decompressed bytes of gzip-encoded objects (fetched without Accept-Encoding: gzip)
 * under valid CRCs, which must never be served as the stored bytes.
 */
export const BLOCKS_DIR = 'blocks-v2';
/** The SQLite index, beside the block folder. */
export const INDEX_FILE = 'index.sqlite';
const BLOCKS = BLOCKS_DIR;

export function blockFileKey(k: BlockKey): string {
  const name = `${k.bucket}\0${k.object}\0${k.generation}\0${k.blockSize}\0${k.block}`;
  let key = recentKeys.get(name);
  if (key === undefined) {
    key = createHash('sha256').update(name).digest('hex').slice(0, 32);
    if (recentKeys.size >= RECENT_KEYS) recentKeys.clear();
    recentKeys.set(name, key);
  }
  return key;
}

/**
 * Keys of the blocks asked about lately: one block is looked up, written and looked up again within
 * moments (about five hashes per cold chunk file, each a crypto object: ~40 ms per 1,000 files on the
 * main thread). Forgotten all at once when full: cheaper than an LRU, and a miss only costs a hash.
 */
const recentKeys = new Map<string, string>();
const RECENT_KEYS = 16_384;

/**
 * Blocks on local disk, one file each, indexed in SQLite. Never the reason a read fails: a block that is
 * missing, short or fails its CRC32C is dropped and reported as a miss (and counted), one that cannot be
 * read just now (out of descriptors) is a miss and stays; a write that fails leaves the read to be served
 * from GCS, with the condition logged once and shown in stats.
 */
export class DiskCache {
  private readonly index: BlockIndex;
  /** What the blocks take, what writes in flight reserve, and the eviction that keeps it in bounds. */
  private readonly space: CacheSpace;
  private readonly flushTimer: NodeJS.Timeout;
  private readonly health: WriteHealth;
  /** Block writes in progress, by block file key. */
  private readonly writesInFlight = new Map<string, Promise<void>>();
  /** Temporary block files written so far: names them. */
  private tmpCount = 0;
  /** Resolves once files and rows are known to agree (at once, after a clean stop). */
  ready: Promise<void> = Promise.resolve();
  /** Resolves once the block folders of older layouts are gone (never rejects). */
  oldLayoutsRemoved: Promise<void> = Promise.resolve();
  private reconciled = true;
  private closed = false;
  private resourceLoggedAt = Number.NEGATIVE_INFINITY;
  private directIo: boolean;
  /** Keys of blocks read elsewhere (the native read path), pulled before access times are written. */
  private accessSources: (() => readonly string[])[] = [];

  private constructor(
    private readonly cfg: DiskCacheConfig,
    private readonly log: Logger,
    private readonly metrics: Metrics,
  ) {
    this.directIo = cfg.directIo;
    this.health = new WriteHealth(cfg, cfg.dir, log);
    // The lock first: until it is ours, another process may be using every file here (`cache info`
    // under a live mount once emptied the daemon's tmp/, and its next rename failed).
    this.index = BlockIndex.open(join(cfg.dir, INDEX_FILE));
    try {
      // Temporary files are only ever half-written blocks of a process that is gone.
      rmSync(join(cfg.dir, 'tmp'), { recursive: true, force: true });
      this.ensureLayout();
    } catch (err) {
      this.index.close(false);
      throw err;
    }
    if (this.index.rebuiltFrom) log.warn({ aside: this.index.rebuiltFrom }, 'block cache index was unreadable; moved aside and started empty');
    this.space = new CacheSpace(cfg, this.index, metrics, (key) => this.path(key), () => this.pullAccess());
    this.flushTimer = setInterval(() => {
      try {
        this.pullAccess();
        this.index.flushAccess();
        // Others filling the disk get room back too, not only our own next write.
        this.space.keepMargin(0);
      } catch (err) {
        // Access times are a hint for eviction: a full disk may lose a batch, never the daemon.
        this.writeFailed(err as NodeJS.ErrnoException);
      }
    }, cfg.accessFlushMs);
    this.flushTimer.unref();
  }

  /** Opens the cache in `cfg.dir` (which must exist), reconciling it in the background if it was not closed cleanly. */
  static open(cfg: DiskCacheConfig, log: Logger, metrics: Metrics): DiskCache {
    const cache = new DiskCache(cfg, log, metrics);
    // With the index's lock held, so no daemon of the old version still writes there.
    cache.oldLayoutsRemoved = removeOldLayouts(cfg.dir, log);
    const why = cache.reconcileReason();
    if (why) {
      // In the background: the mount serves reads meanwhile (a row without a file reads as a miss).
      const started = Date.now();
      cache.reconciled = false;
      cache.ready = cache.reconcile(started).then(
        (r) => {
          cache.reconciled = true;
          log.info({ ...r, ms: Date.now() - started }, `block cache reconciled ${why}`);
        },
        (err: Error) => log.warn({ err: err.message }, 'block cache reconciliation failed'),
      );
    }
    return cache;
  }

  /**
   * Why files and rows may disagree, or null: a previous owner that did not stop cleanly, an index
   * rebuilt after it was unreadable, or a new index beside block files (its predecessor deleted by
   * hand). A new cache has nothing to reconcile, and saying it stopped uncleanly would be false.
   */
  private reconcileReason(): string | null {
    if (this.index.rebuiltFrom) return 'after its unreadable index was rebuilt';
    if (this.index.wasDirty) return 'after an unclean stop';
    if (this.index.fresh && this.anyBlockFiles()) return 'with a new index beside block files';
    return null;
  }

  /** Whether anything but the empty fan folders ensureLayout() makes is under the blocks folder. */
  private anyBlockFiles(): boolean {
    const blocks = join(this.cfg.dir, BLOCKS);
    return readdirSync(blocks, { withFileTypes: true }).some((e) => !e.isDirectory() || readdirSync(join(blocks, e.name)).length > 0);
  }

  /**
   * The folders blocks are written into, all 256 fan folders included: made here, at start (and again
   * after the cache was found unwritable), not by the first write into each (a mkdir and a chmod on the
   * main thread's path of ~90 ms over a fresh cache's first 1,000 files).
   */
  private ensureLayout(): void {
    const blocks = join(this.cfg.dir, BLOCKS);
    ensureLayoutDir(blocks);
    for (let fan = 0; fan < 256; fan++) ensureLayoutDir(join(blocks, fan.toString(16).padStart(2, '0')));
    ensureLayoutDir(join(this.cfg.dir, 'tmp'));
  }

  private path(key: string): string {
    return join(this.cfg.dir, BLOCKS, key.slice(0, 2), key);
  }

  /** The folder block files live in: block file KEY is KEY[0:2]/KEY under it. */
  get blocksDir(): string {
    return join(this.cfg.dir, BLOCKS);
  }

  /** Whether block files are read and written with O_DIRECT (--file-cache-enable-o-direct). */
  get direct(): boolean {
    return this.cfg.directIo;
  }

  /**
   * Registers where else blocks are read from: `read` returns the keys read since it was last called,
   * whose access times are then brought up to date (every flush, and before eviction picks victims).
   */
  addAccessSource(read: () => readonly string[]): void {
    this.accessSources.push(read);
  }

  private pullAccess(): void {
    if (this.accessSources.length === 0) return;
    const now = Date.now();
    for (const read of this.accessSources) for (const key of read()) this.index.touch(key, now);
  }

  /**
   * A block read elsewhere (the native read path) was found damaged: its row and file go, as readRow()
   * drops them, so the next read fetches it again. Nothing happens when the row is gone already (evicted),
   * nor when the file is whole now: the report is older than the file then (the block was evicted or
   * dropped and written again before the report reached us), and dropping it would throw away a good
   * block and fetch it again.
   */
  async dropDamaged(key: string, counter: 'block_cache_missing' | 'block_cache_short' | 'block_cache_corrupt', why: string): Promise<void> {
    const row = this.index.get(key);
    if (!row) return;
    this.space.pin(key);
    try {
      if (await this.intact(row)) return;
    } finally {
      this.space.unpin(key);
    }
    try {
      this.drop(row, counter, why);
    } catch {
      // The index could not delete the row (a full disk): the next read of it finds the damage again.
    }
  }

  /** Whether the block file holds the row's bytes now. */
  private async intact(row: BlockRow): Promise<boolean> {
    const data = Buffer.allocUnsafe(row.size);
    try {
      return (await readFully(this.path(row.key), data)) === row.size && crc32c(data) === row.crc32c;
    } catch {
      return false;
    }
  }

  /** Whether the index holds the block (not checked: a warm-up uses it to skip what is there). */
  has(k: BlockKey): boolean {
    return !this.closed && this.index.has(blockFileKey(k));
  }

  /**
   * The index row of a block, or null: one lookup, which readRow() then reads without repeating.
   * After close() every block is a miss: work still in flight as the mount stops (a prefetch's block
   * just written, a read) asks too, and the index's database is shut by then.
   */
  lookup(k: BlockKey): BlockRow | null {
    if (this.closed) return null;
    return this.index.get(blockFileKey(k)) ?? null;
  }

  /** The block's bytes, checked against its CRC32C, or null: missing, damaged and absent are all misses. */
  async read(k: BlockKey): Promise<Buffer | null> {
    const row = this.lookup(k);
    return row ? this.readRow(row) : null;
  }

  /**
   * A looked-up block's bytes, checked as read() checks them. With `into`, which must be exactly the
   * block's expected length, the bytes are read into it; a block of another length is damaged (its key
   * says which bytes it holds) and is dropped.
   */
  async readRow(row: BlockRow, into?: Buffer): Promise<Buffer | null> {
    const key = row.key;
    if (into && into.length !== row.size) {
      this.drop(row, 'block_cache_short', `block row holds ${row.size} bytes where ${into.length} belong`);
      return null;
    }
    this.space.pin(key);
    try {
      const data = into ?? Buffer.allocUnsafe(row.size);
      let got: number;
      try {
        got = await readFully(this.path(key), data);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code ?? String(err);
        if (DAMAGE_CODES.has(code)) this.drop(row, 'block_cache_missing', `block file unreadable: ${code}`);
        else {
          // A miss for this read (GCS answers it); the block and its row stay.
          this.metrics.inc('block_cache_unavailable');
          this.resourceTrouble(code, 'a cached block could not be read just now: read from GCS, kept in the cache');
        }
        return null;
      }
      if (got !== row.size) {
        this.drop(row, 'block_cache_short', `block file holds ${got} of ${row.size} bytes`);
        return null;
      }
      if (crc32c(data) !== row.crc32c) {
        this.drop(row, 'block_cache_corrupt', 'block file fails its CRC32C');
        return null;
      }
      this.index.touch(key, Date.now());
      return data;
    } finally {
      this.space.unpin(key);
    }
  }

  /**
   * Stores a block: temporary file, rename, then the index row, so a crash at any point leaves at worst a
   * file without a row (removed by reconciliation) and never a row that names a half-written file.
   * `data` must stay unchanged until the returned promise settles. `knownCrc32c`: the bytes' CRC32C when
   * the caller has just checked it, so they are not hashed again.
   */
  write(k: BlockKey, data: Buffer, directCapacity = 0, knownCrc32c: number | null = null): Promise<void> {
    const key = blockFileKey(k);
    // One write per block at a time (the bytes of a key never differ): a second would reserve the
    // block's bytes again, and the budget would count it twice, evicting early, until a restart.
    const inFlight = this.writesInFlight.get(key);
    if (inFlight) return inFlight;
    // Never rejects: a cache that cannot store a block only means the next read goes to GCS.
    const p = this.writeNow(k, key, data, directCapacity, knownCrc32c).catch((err: Error) => {
      this.metrics.inc('block_cache_write_errors');
      this.log.warn({ dir: this.cfg.dir, err: err.message }, 'block cache write failed');
    });
    this.writesInFlight.set(key, p);
    void p.finally(() => this.writesInFlight.delete(key));
    return p;
  }

  /** Waits for the blocks being written (a clean stop should keep what it has downloaded). */
  async drain(): Promise<void> {
    while (this.writesInFlight.size > 0) await Promise.allSettled([...this.writesInFlight.values()]);
  }

  private async writeNow(k: BlockKey, key: string, data: Buffer, directCapacity: number, knownCrc32c: number | null): Promise<void> {
    if (this.closed || data.length > this.space.limitBytes) return;
    const admitted = this.health.admit();
    if (admitted === 'skip') return;
    if (admitted === 'retry') {
      if (this.health.state === 'unwritable') {
        try {
          // Whatever went away (an emptied tmp/, a removed folder) comes back before the retry.
          this.ensureLayout();
        } catch (err) {
          this.writeFailed(err as NodeJS.ErrnoException);
          return;
        }
      }
    }
    if (this.index.has(key)) {
      this.health.notTried(); // not a retry after all: the next write is
      return;
    }
    // Unique within this process, which alone writes here while it holds the index's lock (a count: a
    // random suffix cost a crypto call per block).
    const tmp = join(this.cfg.dir, 'tmp', `${key}.${++this.tmpCount}`);
    const final = this.path(key);
    let reserved = false;
    let written = false;
    let renamed = false;
    try {
      for (let room = this.space.makeRoom(data.length); room !== 'now'; room = this.space.makeRoom(data.length)) {
        if (room === 'none' || this.closed) {
          // Nothing left to evict above the free-space margin (all of it being written or read): a miss, not a failure.
          this.metrics.inc('block_cache_skipped_no_room');
          this.health.notTried();
          return;
        }
        await this.space.unlinked();
      }
      // Reserved with no await since the room was found, so concurrent writers cannot overshoot together.
      this.space.reserve(data.length);
      reserved = true;
      try {
        await this.writeBlockFile(tmp, final, data, directCapacity);
      } catch (err) {
        if (err instanceof BlockWriteError && err.stage === 'rename') {
          this.space.written(data.length);
          written = true;
        }
        throw err;
      }
      this.space.written(data.length);
      written = true;
      renamed = true;
      if (this.closed) throw new Error('closed');
      // A close while this waits commits the row (close() writes what is pending) and resolves it.
      await this.index.putSoon({ key, ...k, size: data.length, crc32c: knownCrc32c ?? crc32c(data), lastAccess: Date.now() });
      this.health.succeeded();
    } catch (err) {
      if (reserved) this.space.unreserve(data.length, written);
      await fsp.rm(tmp, { force: true }).catch(() => undefined);
      // A file without a row costs disk the budget does not see, and after a clean stop nothing would
      // look for it: take it back. If even that fails, the next start reconciles.
      if (renamed) await fsp.rm(final, { force: true }).catch(() => (this.reconciled = false));
      if (!this.closed) this.writeFailed(err as NodeJS.ErrnoException);
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
        return await writeAndRename(tmp, final, Buffer.from(data.buffer, data.byteOffset, padded), padded, data.length, true, this.cfg.addonWrites);
      } catch (err) {
        // EINVAL at open: the file system refuses O_DIRECT (tmpfs before Linux 6.6, for one), for every
        // block; EINVAL later: this write's (a short write leaves the next one unaligned).
        if (!(err instanceof BlockWriteError) || err.code !== 'EINVAL' || err.stage === 'rename') throw err;
        if (err.stage === 'open') {
          this.directIo = false;
          this.log.info({ dir: this.cfg.dir }, 'the cache dir\'s file system refuses O_DIRECT; block files are written through the page cache');
        }
      }
    }
    await writeAndRename(tmp, final, data, data.length, data.length, false, this.cfg.addonWrites);
  }

  private resourceTrouble(code: string, what: string): void {
    const now = Date.now();
    if (now - this.resourceLoggedAt < RESOURCE_LOG_MS) return;
    this.resourceLoggedAt = now;
    this.log.warn({ dir: this.cfg.dir, code }, `${what} (${code}: the daemon is short of file descriptors or memory; logged once a minute)`);
  }

  /** A write failed: writes pause (WriteHealth); after a full disk, a slice of the cache goes too. */
  private writeFailed(err: NodeJS.ErrnoException): void {
    this.metrics.inc('block_cache_write_errors');
    if (err.code && RESOURCE_CODES.has(err.code)) {
      // This write is lost, the cache dir is fine: no pause. If it was the retry, the next write is.
      this.health.notTried();
      this.resourceTrouble(err.code, 'a block could not be written to the cache just now');
      return;
    }
    this.health.failed(err);
    if (!isDiskFull(err)) return;
    try {
      // Make the next attempt likely to fit: give back a slice of what we hold.
      this.space.evictDownTo(this.space.bytes * this.cfg.lowWatermark);
    } catch {
      // The index may be what is full; the pause still holds.
    }
  }

  private drop(row: BlockRow, counter: 'block_cache_missing' | 'block_cache_short' | 'block_cache_corrupt', why: string): void {
    // Two readers may find the same block bad (a JavaScript read and the native path): it goes once.
    if (!this.index.has(row.key)) return;
    this.metrics.inc(counter);
    this.log.warn({ object: row.object, generation: row.generation, block: row.block, why }, 'dropping a damaged cached block; it will be fetched again');
    this.index.delete([row.key]);
    this.space.removed(row.key, row.size);
  }

  /** Files and rows made to agree (reconcileBlocks), the counts following the rows dropped. */
  async reconcile(startedAt: number): Promise<{ droppedRows: number; deletedFiles: number }> {
    const { dropped, deletedFiles } = await reconcileBlocks(this.index, join(this.cfg.dir, BLOCKS), startedAt, () => this.closed);
    for (const row of dropped) this.space.forget(row.size);
    return { droppedRows: dropped.length, deletedFiles };
  }

  /** Bytes that can still be written before eviction starts: under the budget, or above the free-space margin. */
  get spareBytes(): number {
    return this.space.spareBytes;
  }

  info(): { dir: string; bytes: number; blocks: number; objects: number; limitBytes: number | null; state: Health } {
    const t = this.index.totals();
    const limitBytes = this.space.limitBytes;
    return { dir: this.cfg.dir, ...t, limitBytes: Number.isFinite(limitBytes) ? limitBytes : null, state: this.health.state };
  }

  /** Re-checks every block's CRC32C, dropping bad ones. */
  async verify(): Promise<{ checked: number; bad: number }> {
    let checked = 0;
    let bad = 0;
    for (const row of [...this.index.rows()]) {
      checked++;
      if ((await this.readRow(row)) === null) bad++;
    }
    return { checked, bad };
  }

  async clear(): Promise<void> {
    this.index.clear();
    this.space.cleared();
    await fsp.rm(join(this.cfg.dir, BLOCKS), { recursive: true, force: true });
    this.ensureLayout();
  }

  /** Flushes access times, marks the index clean and releases its lock. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.flushTimer);
    this.index.close(this.reconciled);
  }
}
