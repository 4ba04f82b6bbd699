import { crc32c } from '../crc32c.js';
import { promises as fsp, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { SizeLimit } from '../units.js';
import { BlockIndex, type BlockRow } from './block-index.js';
import { CacheSpace } from './eviction.js';
import { reconcileBlocks } from './reconcile.js';
import type { Health, WriteHealthConfig } from './write-health.js';
import type { BlockFileWriter } from '../block-file-write.js';
import { ensureLayoutDir, readFully, removeOldLayouts } from './block-files.js';
import { blockFileKey, type BlockKey } from './block-key.js';
import { BlockWriter } from './block-writer.js';

export { blockFileKey, type BlockKey } from './block-key.js';

/**
 * Why reading a block file failed, as far as the block goes: only a file that is not there (or is not
 * ours: a symlink, a folder) or a disk error is damage. EMFILE, ENFILE, ENOMEM, EAGAIN or EACCES say
 * nothing about the block; dropping it for them emptied the cache of a daemon at its fd limit.
 */
const DAMAGE_CODES = new Set(['ENOENT', 'ENOTDIR', 'ELOOP', 'EISDIR', 'EIO']);

/** At most one log line per this long about blocks that could not be read or written for want of resources. */
const RESOURCE_LOG_MS = 60_000;

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
  /** The write path: blocks into files and rows, and whether writes are paused. */
  private readonly writer: BlockWriter;
  /** Resolves once files and rows are known to agree (at once, after a clean stop). */
  ready: Promise<void> = Promise.resolve();
  /** Resolves once the block folders of older layouts are gone (never rejects). */
  oldLayoutsRemoved: Promise<void> = Promise.resolve();
  private reconciled = true;
  /**
   * A block file was left that no row names (a write that could not clean up, an eviction whose unlink
   * failed): the next start must reconcile, even if a reconcile of this start finished after it.
   */
  private strayed = false;
  private closed = false;
  private resourceLoggedAt = Number.NEGATIVE_INFINITY;
  /** Keys of blocks read elsewhere (the native read path), pulled before access times are written. */
  private accessSources: (() => readonly string[])[] = [];

  private constructor(
    private readonly cfg: DiskCacheConfig,
    private readonly log: Logger,
    private readonly metrics: Metrics,
  ) {
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
    this.space = new CacheSpace(
      cfg,
      this.index,
      metrics,
      (key) => this.path(key),
      () => this.pullAccess(),
      () => (this.strayed = true),
    );
    this.writer = new BlockWriter(cfg, {
      index: this.index,
      space: this.space,
      log,
      metrics,
      path: (key) => this.path(key),
      closed: () => this.closed,
      ensureLayout: () => this.ensureLayout(),
      strayFile: () => (this.strayed = true),
      resourceTrouble: (code, what) => this.resourceTrouble(code, what),
    });
    this.flushTimer = setInterval(() => {
      try {
        this.pullAccess();
        this.index.flushAccess();
        // Others filling the disk get room back too, not only our own next write.
        this.space.keepMargin(0);
      } catch (err) {
        // Access times are a hint for eviction: a full disk may lose a batch, never the daemon.
        this.writer.failed(err as NodeJS.ErrnoException);
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

  /**
   * Block files whose bytes lie in shared memory are written by `writer` (the download workers), so
   * that their completions do not wake the main thread each.
   */
  writeBlockFilesWith(writer: BlockFileWriter): void {
    this.writer.offThread = writer;
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
    this.drop(row, counter, why);
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
    const got = await this.readChecked(row, into);
    return typeof got === 'string' ? null : got;
  }

  /** readRow(), saying why a block is not there: 'damaged' (dropped) or 'unavailable' (kept: a resource error). */
  private async readChecked(row: BlockRow, into?: Buffer): Promise<Buffer | 'damaged' | 'unavailable'> {
    const key = row.key;
    if (into && into.length !== row.size) {
      this.drop(row, 'block_cache_short', `block row holds ${row.size} bytes where ${into.length} belong`);
      return 'damaged';
    }
    this.space.pin(key);
    try {
      const data = into ?? Buffer.allocUnsafe(row.size);
      let got: number;
      try {
        got = await readFully(this.path(key), data);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code ?? String(err);
        if (DAMAGE_CODES.has(code)) {
          this.drop(row, 'block_cache_missing', `block file unreadable: ${code}`);
          return 'damaged';
        }
        // A miss for this read (GCS answers it); the block and its row stay.
        this.metrics.inc('block_cache_unavailable');
        this.resourceTrouble(code, 'a cached block could not be read just now: read from GCS, kept in the cache');
        return 'unavailable';
      }
      if (got !== row.size) {
        this.drop(row, 'block_cache_short', `block file holds ${got} of ${row.size} bytes`);
        return 'damaged';
      }
      if (crc32c(data) !== row.crc32c) {
        this.drop(row, 'block_cache_corrupt', 'block file fails its CRC32C');
        return 'damaged';
      }
      this.index.touch(key, Date.now());
      return data;
    } finally {
      this.space.unpin(key);
    }
  }

  /** Stores a block (BlockWriter.write); never rejects. */
  write(k: BlockKey, data: Buffer, directCapacity = 0, knownCrc32c: number | null = null, onStored?: () => void): Promise<void> {
    return this.writer.write(k, data, directCapacity, knownCrc32c, onStored);
  }

  /**
   * Waits for the blocks being written (a clean stop should keep what it has downloaded), and for the
   * evicted files being unlinked: one that fails must be heard of before close() says the cache is clean.
   */
  async drain(): Promise<void> {
    // A write finishing may evict (and a flush may keep the margin): until neither is left to wait for.
    do {
      await this.writer.drain();
      await this.space.unlinked();
    } while (this.writer.writing || this.space.unlinkPending);
  }

  private resourceTrouble(code: string, what: string): void {
    const now = Date.now();
    if (now - this.resourceLoggedAt < RESOURCE_LOG_MS) return;
    this.resourceLoggedAt = now;
    this.log.warn({ dir: this.cfg.dir, code }, `${what} (${code}: the daemon is short of file descriptors or memory; logged once a minute)`);
  }

  /**
   * Drops a damaged block's row; never throws. A read that found the damage is a miss either way (GCS
   * answers it): an index that cannot delete just now (SQLITE_FULL on a full disk, a cache closing) once
   * turned that miss into EIO for the reader. The next read of the block then finds the damage again.
   */
  private drop(row: BlockRow, counter: 'block_cache_missing' | 'block_cache_short' | 'block_cache_corrupt', why: string): void {
    try {
      // Two readers may find the same block bad (a JavaScript read and the native path): it goes once.
      if (!this.index.has(row.key)) return;
      this.metrics.inc(counter);
      this.log.warn({ object: row.object, generation: row.generation, block: row.block, why }, 'dropping a damaged cached block; it will be fetched again');
      this.index.delete([row.key]);
      this.space.removed(row.key, row.size);
    } catch (err) {
      this.log.warn({ object: row.object, block: row.block, err: String(err) }, 'a damaged cached block could not be dropped from the index just now');
    }
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
    return { dir: this.cfg.dir, ...t, limitBytes: Number.isFinite(limitBytes) ? limitBytes : null, state: this.writer.state };
  }

  /**
   * Re-checks every block's CRC32C, dropping bad ones. `bad` counts the blocks dropped as damaged: not a
   * block evicted since the list was taken (the free-space margin's eviction runs on a timer, and a cache
   * in use makes room as it writes), nor one that could not be read just now and stays.
   */
  async verify(): Promise<{ checked: number; bad: number }> {
    let checked = 0;
    let bad = 0;
    for (const listed of [...this.index.rows()]) {
      // Nothing awaits between this and readChecked's pin, so an eviction cannot come in between.
      const row = this.index.get(listed.key);
      if (row === undefined) continue;
      checked++;
      if ((await this.readChecked(row)) === 'damaged') bad++;
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
    // An unlink still under way may yet fail, leaving a file no row knows: not clean until it is heard of.
    this.index.close(this.reconciled && !this.strayed && !this.space.unlinkPending);
  }
}
