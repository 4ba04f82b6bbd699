import { crc32c } from '../crc32c.js';
import { createHash } from 'node:crypto';
import { chmodSync, constants as fsConstants, lstatSync, mkdirSync, promises as fsp, rmSync } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { SizeLimit } from '../units.js';
import { BlockIndex, type BlockRow } from './block-index.js';

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

export interface DiskCacheConfig {
  dir: string;
  limit: SizeLimit;
  /** Once over the limit, evict down to this fraction of it, so eviction runs in batches, not per write. */
  lowWatermark: number;
  /** How often batched access times reach SQLite. */
  accessFlushMs: number;
  /** Write block files with O_DIRECT when the block's memory allows it (gcsfuse's --file-cache-enable-o-direct). */
  directIo: boolean;
  /** After a full disk, how long writes pause before the next try. */
  fullPauseMs: number;
  /** After a write fails for another reason, the first pause before writes are tried again; it doubles up to the max. */
  unwritableRetryMs: number;
  unwritableRetryMaxMs: number;
}

export const DEFAULT_DISK_CACHE: Omit<DiskCacheConfig, 'dir' | 'limit'> = {
  lowWatermark: 0.9,
  accessFlushMs: 5_000,
  directIo: true,
  fullPauseMs: 30_000,
  unwritableRetryMs: 5_000,
  unwritableRetryMaxMs: 5 * 60_000,
};

/** O_DIRECT wants the memory, the offset and the length aligned to the device's block; 4 KiB covers 512 and 4K devices. */
const DIRECT_ALIGN = 4096;

/**
 * The layout version is in the folder name, like the table name: a new format starts a new cache.
 * v2: v1 could hold the decompressed bytes of gzip-encoded objects (fetched without Accept-Encoding: gzip)
 * under valid CRCs, which must never be served as the stored bytes.
 */
export const BLOCKS_DIR = 'blocks-v2';
const BLOCKS = BLOCKS_DIR;
/** Folders of older layouts: never read again, removed in the background to give their space back. */
const OLD_LAYOUT_DIRS = ['blocks-v1'];

export function blockFileKey(k: BlockKey): string {
  return createHash('sha256').update(`${k.bucket}\0${k.object}\0${k.generation}\0${k.blockSize}\0${k.block}`).digest('hex').slice(0, 32);
}

type Health = 'ok' | 'full' | 'unwritable';

/** Owner-only, whatever the umask: block files hold object bytes, the index object names. */
const FILE_MODE = 0o600;
const DIR_MODE = 0o700;

/** SQLite's "database or disk is full" (SQLITE_FULL) is the index's ENOSPC. */
function isDiskFull(err: NodeJS.ErrnoException): boolean {
  return err.code === 'ENOSPC' || err.code === 'EDQUOT' || err.code === 'SQLITE_FULL';
}

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

/** A folder of the cache's own layout, 0700, and a real folder (not a symlink someone put there). */
function ensureLayoutDir(path: string): void {
  try {
    mkdirSync(path, { mode: DIR_MODE });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  const st = lstatSync(path);
  if (!st.isDirectory()) throw Object.assign(new Error(`${path} is not a directory`), { code: 'ENOTDIR' });
  if ((st.mode & 0o777) !== DIR_MODE) chmodSync(path, DIR_MODE);
}

/**
 * Up to `into.length` bytes from the start of the file; the count tells a short file. One read call per
 * block instead of readFile's stat-and-chunks, and into a reused buffer rather than a fresh one.
 */
async function readFully(path: string, into: Buffer): Promise<number> {
  const fh = await fsp.open(path, 'r');
  try {
    let got = 0;
    while (got < into.length) {
      const { bytesRead } = await fh.read(into, got, into.length - got, got);
      if (bytesRead === 0) break;
      got += bytesRead;
    }
    return got;
  } finally {
    await fh.close();
  }
}

/** Why an O_DIRECT write did not happen: the file system refuses the flag, or this one write failed. */
type DirectOutcome = 'written' | 'refused' | 'failed';

/**
 * The block as a new file written with O_DIRECT, past the page cache: `padded` is the block's memory
 * rounded up to DIRECT_ALIGN, and the file is cut back to `length` after. EINVAL at open is the file
 * system refusing O_DIRECT; EINVAL later (a short write leaves the next one unaligned) is this block's.
 */
async function writeDirect(path: string, padded: Buffer, length: number): Promise<DirectOutcome> {
  const { O_WRONLY, O_CREAT, O_TRUNC, O_DIRECT } = fsConstants;
  let fh: FileHandle;
  try {
    fh = await fsp.open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, FILE_MODE);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EINVAL') return 'refused';
    throw err;
  }
  try {
    let done = 0;
    while (done < padded.length) done += (await fh.write(padded, done, padded.length - done, done)).bytesWritten;
    if (padded.length !== length) await fh.truncate(length);
    return 'written';
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EINVAL') return 'failed';
    throw err;
  } finally {
    await fh.close();
  }
}

/** The whole buffer as a new file, in as few write calls as the kernel allows (writeFile writes 512 KiB at a time). */
async function writeFully(path: string, data: Buffer): Promise<void> {
  const fh = await fsp.open(path, 'w', FILE_MODE);
  try {
    let done = 0;
    while (done < data.length) done += (await fh.write(data, done, data.length - done, done)).bytesWritten;
  } finally {
    await fh.close();
  }
}

/** Deletes the block folders of older layouts, logging what it freed; a failure is logged, not thrown. */
async function removeOldLayouts(dir: string, log: Logger): Promise<void> {
  for (const name of OLD_LAYOUT_DIRS) {
    const old = join(dir, name);
    if (!(await fsp.stat(old).catch(() => null))) continue;
    try {
      await fsp.rm(old, { recursive: true, force: true });
      log.info({ removed: old }, 'removed the block cache of an older layout version');
    } catch (err) {
      log.warn({ dir: old, err: (err as Error).message }, 'cannot remove the block cache of an older layout version');
    }
  }
}

/**
 * Blocks on local disk, one file each, indexed in SQLite. Never the reason a read fails: a block that is
 * missing, short or fails its CRC32C is dropped and reported as a miss (and counted), one that cannot be
 * read just now (out of descriptors) is a miss and stays; a write that fails leaves the read to be served
 * from GCS, with the condition logged once and shown in stats.
 */
export class DiskCache {
  private readonly index: BlockIndex;
  private readonly limitBytes: number;
  private bytes: number;
  private blocks: number;
  /** Blocks a reader is between lookup and read of: eviction leaves them alone. */
  private readonly pinned = new Map<string, number>();
  private readonly madeDirs = new Set<string>();
  private readonly flushTimer: NodeJS.Timeout;
  private health: Health = 'ok';
  /** While not ok: writes are skipped until then, and the next one is the retry. */
  private retryAt = 0;
  private unwritableBackoffMs: number;
  private readonly pendingWrites = new Set<Promise<void>>();
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
    this.unwritableBackoffMs = cfg.unwritableRetryMs;
    // The lock first: until it is ours, another process may be using every file here (`cache info`
    // under a live mount once emptied the daemon's tmp/, and its next rename failed).
    this.index = BlockIndex.open(join(cfg.dir, 'index.sqlite'));
    try {
      // Temporary files are only ever half-written blocks of a process that is gone.
      rmSync(join(cfg.dir, 'tmp'), { recursive: true, force: true });
      this.ensureLayout();
    } catch (err) {
      this.index.close(false);
      throw err;
    }
    if (this.index.rebuiltFrom) log.warn({ aside: this.index.rebuiltFrom }, 'block cache index was unreadable; moved aside and started empty');
    const t = this.index.totals();
    this.bytes = t.bytes;
    this.blocks = t.blocks;
    this.limitBytes = cfg.limit.kind === 'bytes' ? cfg.limit.bytes : Number.POSITIVE_INFINITY;
    this.flushTimer = setInterval(() => {
      try {
        this.pullAccess();
        this.index.flushAccess();
      } catch (err) {
        // Access times are a hint for eviction: a full disk may lose a batch, never the daemon.
        this.writeFailed(err as NodeJS.ErrnoException);
      }
    }, cfg.accessFlushMs);
    this.flushTimer.unref();
    metrics.setGauge('block_cache_bytes', () => this.bytes);
    metrics.setGauge('block_cache_blocks', () => this.blocks);
    metrics.setGauge('block_cache_limit_bytes', () => (Number.isFinite(this.limitBytes) ? this.limitBytes : -1));
  }

  /** Opens the cache in `cfg.dir` (which must exist), reconciling it in the background if it was not closed cleanly. */
  static open(cfg: DiskCacheConfig, log: Logger, metrics: Metrics): DiskCache {
    const cache = new DiskCache(cfg, log, metrics);
    // With the index's lock held, so no daemon of the old version still writes there.
    cache.oldLayoutsRemoved = removeOldLayouts(cfg.dir, log);
    if (cache.index.wasDirty || cache.index.rebuiltFrom) {
      // In the background: the mount serves reads meanwhile (a row without a file reads as a miss).
      const started = Date.now();
      cache.reconciled = false;
      cache.ready = cache.reconcile(started).then(
        (r) => {
          cache.reconciled = true;
          log.info({ ...r, ms: Date.now() - started }, 'block cache reconciled after an unclean stop');
        },
        (err: Error) => log.warn({ err: err.message }, 'block cache reconciliation failed'),
      );
    }
    return cache;
  }

  private ensureLayout(): void {
    ensureLayoutDir(join(this.cfg.dir, BLOCKS));
    ensureLayoutDir(join(this.cfg.dir, 'tmp'));
    this.madeDirs.clear();
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
   * drops them, so the next read fetches it again. Nothing happens when the row is gone already (evicted).
   */
  dropDamaged(key: string, counter: 'block_cache_missing' | 'block_cache_short' | 'block_cache_corrupt', why: string): void {
    const row = this.index.get(key);
    if (row) this.drop(row, counter, why);
  }

  /** Whether the index holds the block (not checked: a warm-up uses it to skip what is there). */
  has(k: BlockKey): boolean {
    return this.index.has(blockFileKey(k));
  }

  /** The index row of a block, or null: one lookup, which readRow() then reads without repeating. */
  lookup(k: BlockKey): BlockRow | null {
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
    this.pin(key);
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
      this.unpin(key);
    }
  }

  /**
   * Stores a block: temporary file, rename, then the index row, so a crash at any point leaves at worst a
   * file without a row (removed by reconciliation) and never a row that names a half-written file.
   * `data` must stay unchanged until the returned promise settles. `knownCrc32c`: the bytes' CRC32C when
   * the caller has just checked it, so they are not hashed again.
   */
  write(k: BlockKey, data: Buffer, directCapacity = 0, knownCrc32c: number | null = null): Promise<void> {
    // Never rejects: a cache that cannot store a block only means the next read goes to GCS.
    const p = this.writeNow(k, data, directCapacity, knownCrc32c).catch((err: Error) => {
      this.metrics.inc('block_cache_write_errors');
      this.log.warn({ dir: this.cfg.dir, err: err.message }, 'block cache write failed');
    });
    this.pendingWrites.add(p);
    void p.finally(() => this.pendingWrites.delete(p));
    return p;
  }

  /** Waits for the blocks being written (a clean stop should keep what it has downloaded). */
  async drain(): Promise<void> {
    while (this.pendingWrites.size > 0) await Promise.allSettled([...this.pendingWrites]);
  }

  private async writeNow(k: BlockKey, data: Buffer, directCapacity: number, knownCrc32c: number | null): Promise<void> {
    if (this.closed || data.length > this.limitBytes) return;
    if (this.health !== 'ok') {
      if (Date.now() < this.retryAt) return;
      // This write is the retry; the ones behind it wait for its outcome.
      this.retryAt = Number.POSITIVE_INFINITY;
      if (this.health === 'unwritable') {
        try {
          // Whatever went away (an emptied tmp/, a removed folder) comes back before the retry.
          this.ensureLayout();
        } catch (err) {
          this.writeFailed(err as NodeJS.ErrnoException);
          return;
        }
      }
    }
    const key = blockFileKey(k);
    if (this.index.has(key)) {
      if (this.health !== 'ok') this.retryAt = 0; // not a retry after all: the next write is
      return;
    }
    // Unique within this process, which alone writes here while it holds the index's lock (a count: a
    // random suffix cost a crypto call per block).
    const tmp = join(this.cfg.dir, 'tmp', `${key}.${++this.tmpCount}`);
    const final = this.path(key);
    let reserved = false;
    let renamed = false;
    try {
      // Reserve the space before the first await, so concurrent writers cannot overshoot the budget together.
      this.makeRoom(data.length);
      this.bytes += data.length;
      this.blocks += 1;
      reserved = true;
      await this.writeBlockFile(tmp, data, directCapacity);
      const dir = join(this.cfg.dir, BLOCKS, key.slice(0, 2));
      if (!this.madeDirs.has(dir)) {
        await fsp.mkdir(dir, { mode: DIR_MODE }).catch((err: NodeJS.ErrnoException) => {
          if (err.code !== 'EEXIST') throw err;
        });
        await fsp.chmod(dir, DIR_MODE);
        this.madeDirs.add(dir);
      }
      await fsp.rename(tmp, final);
      renamed = true;
      if (this.closed) throw new Error('closed');
      // A close while this waits commits the row (close() writes what is pending) and resolves it.
      await this.index.putSoon({ key, ...k, size: data.length, crc32c: knownCrc32c ?? crc32c(data), lastAccess: Date.now() });
      if (this.health !== 'ok') this.recovered();
    } catch (err) {
      if (reserved) {
        this.bytes -= data.length;
        this.blocks -= 1;
      }
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
  private async writeBlockFile(path: string, data: Buffer, directCapacity: number): Promise<void> {
    const padded = Math.ceil(data.length / DIRECT_ALIGN) * DIRECT_ALIGN;
    if (this.directIo && data.length > 0 && directCapacity >= padded) {
      const outcome = await writeDirect(path, Buffer.from(data.buffer, data.byteOffset, padded), data.length);
      if (outcome === 'written') return;
      if (outcome === 'refused') {
        // tmpfs before Linux 6.6, for one: a property of the file system, not of this block.
        this.directIo = false;
        this.log.info({ dir: this.cfg.dir }, 'the cache dir\'s file system refuses O_DIRECT; block files are written through the page cache');
      }
    }
    await writeFully(path, data);
  }

  /**
   * Neither condition is forever: a full disk pauses writes for `fullPauseMs`, any other failure for a
   * backoff that doubles while retries keep failing. Logged once per change of state, not per block.
   */
  private writeFailed(err: NodeJS.ErrnoException): void {
    this.metrics.inc('block_cache_write_errors');
    if (err.code && RESOURCE_CODES.has(err.code)) {
      // This write is lost, the cache dir is fine: no pause. If it was the retry, the next write is.
      if (this.health !== 'ok') this.retryAt = 0;
      this.resourceTrouble(err.code, 'a block could not be written to the cache just now');
      return;
    }
    if (isDiskFull(err)) {
      if (this.health !== 'full') this.log.warn({ dir: this.cfg.dir, code: err.code }, 'block cache disk is full: reads go straight to GCS until space frees up');
      this.health = 'full';
      this.retryAt = Date.now() + this.cfg.fullPauseMs;
      this.unwritableBackoffMs = this.cfg.unwritableRetryMs;
      // Make the next attempt likely to fit: give back a slice of what we hold.
      try {
        this.evictDownTo(this.bytes * this.cfg.lowWatermark);
      } catch {
        // The index may be what is full; the pause still holds.
      }
    } else {
      if (this.health !== 'unwritable') {
        this.log.warn({ dir: this.cfg.dir, code: err.code, err: err.message }, 'block cache directory is not writable: reads go straight to GCS; writes are retried with backoff');
        this.unwritableBackoffMs = this.cfg.unwritableRetryMs;
      } else {
        this.unwritableBackoffMs = Math.min(this.unwritableBackoffMs * 2, this.cfg.unwritableRetryMaxMs);
      }
      this.health = 'unwritable';
      this.retryAt = Date.now() + this.unwritableBackoffMs;
    }
  }

  private resourceTrouble(code: string, what: string): void {
    const now = Date.now();
    if (now - this.resourceLoggedAt < RESOURCE_LOG_MS) return;
    this.resourceLoggedAt = now;
    this.log.warn({ dir: this.cfg.dir, code }, `${what} (${code}: the daemon is short of file descriptors or memory; logged once a minute)`);
  }

  private recovered(): void {
    this.log.info({ dir: this.cfg.dir, was: this.health }, this.health === 'full' ? 'block cache disk has room again' : 'block cache directory is writable again');
    this.health = 'ok';
    this.retryAt = 0;
    this.unwritableBackoffMs = this.cfg.unwritableRetryMs;
  }

  private makeRoom(incoming: number): void {
    if (this.bytes + incoming <= this.limitBytes) return;
    this.evictDownTo(Math.min(this.limitBytes * this.cfg.lowWatermark, this.limitBytes - incoming));
  }

  /** Evicts least recently used blocks, skipping pinned ones, until at most `target` bytes remain. */
  private evictDownTo(target: number): void {
    this.pullAccess();
    let offset = 0;
    while (this.bytes > target) {
      const batch = this.index.oldest(256, offset);
      if (batch.length === 0) return;
      const victims: { key: string; size: number }[] = [];
      let left = this.bytes;
      for (const v of batch) {
        if (left <= target) break;
        if (this.pinned.has(v.key)) {
          offset++;
          continue;
        }
        victims.push(v);
        left -= v.size;
      }
      // Rows first (this may throw, SQLITE_FULL for one), then the counts that follow them.
      this.index.delete(victims.map((v) => v.key));
      for (const { size } of victims) {
        this.bytes -= size;
        this.blocks -= 1;
        this.metrics.inc('block_cache_evictions');
        this.metrics.inc('block_cache_evicted_bytes', size);
      }
      // The file goes after the row; a reader that already opened it keeps reading (Linux unlink semantics).
      for (const { key } of victims) void fsp.rm(this.path(key), { force: true }).catch(() => undefined);
    }
  }

  private drop(row: BlockRow, counter: 'block_cache_missing' | 'block_cache_short' | 'block_cache_corrupt', why: string): void {
    // Two readers may find the same block bad (a JavaScript read and the native path): it goes once.
    if (!this.index.has(row.key)) return;
    this.metrics.inc(counter);
    this.log.warn({ object: row.object, generation: row.generation, block: row.block, why }, 'dropping a damaged cached block; it will be fetched again');
    this.index.delete([row.key]);
    this.bytes -= row.size;
    this.blocks -= 1;
    void fsp.rm(this.path(row.key), { force: true }).catch(() => undefined);
  }

  private pin(key: string): void {
    this.pinned.set(key, (this.pinned.get(key) ?? 0) + 1);
  }

  private unpin(key: string): void {
    const n = (this.pinned.get(key) ?? 1) - 1;
    if (n === 0) this.pinned.delete(key);
    else this.pinned.set(key, n);
  }

  /**
   * After an unclean stop: rows whose file is gone are dropped, and files no row names (written, not yet
   * indexed, when the process died) are deleted. Files newer than `startedAt` belong to this run.
   */
  async reconcile(startedAt: number): Promise<{ droppedRows: number; deletedFiles: number }> {
    let droppedRows = 0;
    let deletedFiles = 0;
    const root = join(this.cfg.dir, BLOCKS);
    const onDisk = new Set<string>();
    for (const fan of await fsp.readdir(root).catch(() => [] as string[])) {
      if (this.closed) throw new Error('closed before reconciliation finished');
      for (const name of await fsp.readdir(join(root, fan)).catch(() => [] as string[])) {
        if (this.index.has(name)) {
          onDisk.add(name);
          continue;
        }
        const p = join(root, fan, name);
        const st = await fsp.stat(p).catch(() => null);
        if (st && st.mtimeMs < startedAt) {
          await fsp.rm(p, { force: true });
          deletedFiles++;
        }
      }
      await new Promise((r) => setImmediate(r)); // let FUSE requests through between folders
    }
    if (this.closed) throw new Error('closed before reconciliation finished');
    const missing: BlockRow[] = [];
    for (const row of this.index.rows()) if (!onDisk.has(row.key) && row.lastAccess < startedAt) missing.push(row);
    for (const row of missing) {
      if (this.index.has(row.key)) {
        this.index.delete([row.key]);
        this.bytes -= row.size;
        this.blocks -= 1;
        droppedRows++;
      }
    }
    return { droppedRows, deletedFiles };
  }

  /** Bytes that can still be written before eviction starts (Infinity without a limit). */
  get spareBytes(): number {
    return this.limitBytes - this.bytes;
  }

  info(): { dir: string; bytes: number; blocks: number; objects: number; limitBytes: number | null; state: Health } {
    const t = this.index.totals();
    return { dir: this.cfg.dir, ...t, limitBytes: Number.isFinite(this.limitBytes) ? this.limitBytes : null, state: this.health };
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
    this.bytes = 0;
    this.blocks = 0;
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
