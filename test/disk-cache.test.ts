import Database from 'better-sqlite3';
import { createHash } from 'node:crypto';
import { constants, promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { BlockBuffers } from '../src/blocks/block-buffers.js';
import { writeAndRename } from '../src/blocks/block-files.js';
import { BLOCK_TABLE, BlockIndex, IndexLockedError, type BlockRow } from '../src/blocks/block-index.js';
import { FreeSpaceMargin } from '../src/blocks/free-space.js';
import { blockFileKey, BLOCKS_DIR, DEFAULT_DISK_CACHE, DiskCache } from '../src/blocks/disk-cache.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';
import { run, tempDir } from './helpers/harness.js';

const BLOCK = 1024 * 1024;

/** The index's one statement per row, inside its batch's transaction: where tests make a write fail. */
interface RowWriter {
  writeRow(r: BlockRow): void;
}
const spyOnRowWrites = () => vi.spyOn(BlockIndex.prototype as unknown as RowWriter, 'writeRow');

describe('block files and O_DIRECT', () => {
  afterEach(() => vi.restoreAllMocks());

  it('falls back to the page cache, for good and without losing the block, where the file system refuses O_DIRECT', async () => {
    // tmpfs refused O_DIRECT with EINVAL before Linux 6.6; this kernel's accepts it, so the refusal is staged.
    const realOpen = fsp.open.bind(fsp);
    const directOpens: string[] = [];
    vi.spyOn(fsp, 'open').mockImplementation(async (path, flags, mode) => {
      if (typeof flags === 'number' && (flags & constants.O_DIRECT) !== 0) {
        directOpens.push(String(path));
        throw Object.assign(new Error('EINVAL: invalid argument, open'), { code: 'EINVAL' });
      }
      return realOpen(path, flags, mode);
    });
    const info = vi.fn();
    const log = { ...silentLogger, info, warn: vi.fn(), child: () => log } as unknown as typeof silentLogger;
    const dir = await tempDir('cache');
    // Through fs.promises, where the refusal is staged (the addon's writes are tested below).
    const cache = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE, addonWrites: false }, log, new Metrics());
    const pool = new BlockBuffers({ blockSize: BLOCK, maxBytes: 4 * BLOCK, poison: false, idleTrimMs: 60_000 });
    try {
      const keys = [0, 1, 2].map((block) => ({ bucket: 'b', object: 'o', generation: '1', block, blockSize: BLOCK }));
      for (const [i, key] of keys.entries()) {
        const lease = pool.lease(BLOCK - 100 * i);
        lease.bytes.fill(i + 1);
        await cache.write(key, lease.bytes, lease.directCapacity);
        lease.release();
      }
      expect(directOpens).toHaveLength(1); // refused once, then no more asking
      expect(info.mock.calls.filter(([, msg]) => String(msg).includes('refuses O_DIRECT'))).toHaveLength(1);
      for (const [i, key] of keys.entries()) {
        const got = await cache.read(key);
        expect(got?.length).toBe(BLOCK - 100 * i);
        expect(got?.every((b) => b === i + 1)).toBe(true);
      }
      expect(cache.info().state).toBe('ok');
      expect((await fsp.readdir(join(dir, 'tmp'))).length).toBe(0);
    } finally {
      cache.close();
      pool.close();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});

describe('block files written off the main thread', () => {
  const key = (block: number) => ({ bucket: 'b', object: 'o', generation: '1', block, blockSize: BLOCK });

  it('are written by the writer given, and by the cache itself when that writer could not run them', async () => {
    const dir = await tempDir('cache');
    const metrics = new Metrics();
    const cache = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE }, silentLogger, metrics);
    const pool = new BlockBuffers({ blockSize: BLOCK, maxBytes: 4 * BLOCK, poison: false, idleTrimMs: 60_000, shared: true });
    const given: string[] = [];
    let worker: 'writes' | 'lost' | 'declines' = 'writes';
    cache.writeBlockFilesWith((tmp, final, data, count, length, direct, mode) => {
      given.push(final);
      if (worker === 'declines') return null;
      if (worker === 'lost') return Promise.reject(new Error('download worker exited with code 1'));
      return writeAndRename(tmp, final, data, count, length, direct, true).then(() => expect(mode).toBe(0o600));
    });
    try {
      for (const [block, how] of (['writes', 'lost', 'declines'] as const).entries()) {
        worker = how;
        const lease = pool.lease(BLOCK - 10 * block);
        lease.bytes.fill(block + 1);
        await cache.write(key(block), lease.bytes, lease.directCapacity);
        lease.release();
      }
      expect(given).toHaveLength(3);
      // Counted only where the other thread wrote it; the other two were written here, none lost.
      expect(metrics.get('block_files_written_on_workers')).toBe(1);
      for (const block of [0, 1, 2]) {
        const got = await cache.read(key(block));
        expect(got?.length).toBe(BLOCK - 10 * block);
        expect(got?.every((b) => b === block + 1)).toBe(true);
      }
      expect(cache.info()).toMatchObject({ state: 'ok', blocks: 3 });
      expect((await fsp.readdir(join(dir, 'tmp'))).length).toBe(0);
    } finally {
      cache.close();
      pool.close();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});

describe('a block cache that meets trouble recovers from it', () => {
  afterEach(() => vi.restoreAllMocks());

  const key = (block: number) => ({ bucket: 'b', object: 'o', generation: '1', block, blockSize: BLOCK });
  const logSpy = () => {
    const warn = vi.fn();
    const info = vi.fn();
    const log = { ...silentLogger, info, warn, child: () => log } as unknown as typeof silentLogger;
    const said = (fn: typeof warn, text: string) => fn.mock.calls.filter(([, msg]) => String(msg).includes(text)).length;
    return { log, warn, info, said };
  };
  const blockFiles = async (dir: string) => (await run('find', [join(dir, BLOCKS_DIR), '-type', 'f'])).stdout.split('\n').filter(Boolean);

  it('lets a second opener of a live cache dir touch nothing: the owner keeps writing', async () => {
    const dir = await tempDir('cache');
    // Through fs.promises, whose rename the test holds.
    const owner = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE, addonWrites: false }, silentLogger, new Metrics());
    try {
      await owner.write(key(0), Buffer.alloc(1000, 1));
      // The owner's next block is written to tmp/ and held just before its rename.
      const realRename = fsp.rename.bind(fsp);
      let atRename!: () => void;
      const arrived = new Promise<void>((r) => (atRename = r));
      let proceed!: () => void;
      const go = new Promise<void>((r) => (proceed = r));
      vi.spyOn(fsp, 'rename').mockImplementationOnce(async (from, to) => {
        atRename();
        await go;
        return realRename(from, to);
      });
      const writing = owner.write(key(1), Buffer.alloc(1000, 2));
      await arrived;
      // What `gcsmount cache info` or `stats --cache-dir` does under a live mount: refused, and nothing more.
      expect(() => DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE }, silentLogger, new Metrics())).toThrow(IndexLockedError);
      proceed();
      await writing;
      expect(owner.info()).toMatchObject({ state: 'ok', blocks: 2 });
      expect((await owner.read(key(1)))?.every((b) => b === 2)).toBe(true);
    } finally {
      owner.close();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  it('takes SQLITE_FULL for a full disk, takes back the block file it renamed, and writes again after the pause', async () => {
    const dir = await tempDir('cache');
    const { log, warn, info, said } = logSpy();
    const metrics = new Metrics();
    const cache = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE, fullPauseMs: 200 }, log, metrics);
    // The pause is kept on the cache's own clock, so a slow `find` below cannot outlast it.
    let now = Date.now();
    vi.spyOn(Date, 'now').mockImplementation(() => now);
    try {
      const put = spyOnRowWrites().mockImplementationOnce(() => {
        throw Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' });
      });
      await cache.write(key(0), Buffer.alloc(1000, 1));
      expect(put).toHaveBeenCalledTimes(1);
      expect(cache.info().state).toBe('full');
      expect(said(warn, 'disk is full')).toBe(1);
      expect(await blockFiles(dir)).toEqual([]); // renamed into place, then taken back
      now += 199;
      await cache.write(key(1), Buffer.alloc(1000, 2)); // within the pause: not even tried
      expect(put).toHaveBeenCalledTimes(1);
      now += 1;
      await cache.write(key(1), Buffer.alloc(1000, 2));
      expect(cache.info()).toMatchObject({ state: 'ok', blocks: 1 });
      expect(said(info, 'room again')).toBe(1);
      expect(await blockFiles(dir)).toHaveLength(1);
      expect(metrics.snapshot().counters.block_cache_write_errors).toBe(1);
    } finally {
      cache.close();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  it('retries an unwritable cache with a doubling backoff, logging each change of state once', async () => {
    const dir = await tempDir('cache');
    const { log, warn, info, said } = logSpy();
    const metrics = new Metrics();
    const cache = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE, unwritableRetryMs: 200, unwritableRetryMaxMs: 5000 }, log, metrics);
    try {
      // A transient failure: the temporary folder vanishes under the daemon (as `cache info` once did).
      await fsp.rm(join(dir, 'tmp'), { recursive: true });
      await fsp.writeFile(join(dir, 'tmp'), 'a file where the folder was');
      await cache.write(key(0), Buffer.alloc(1000, 1));
      expect(cache.info().state).toBe('unwritable');
      await cache.write(key(1), Buffer.alloc(1000, 1)); // within the backoff: skipped
      await new Promise((r) => setTimeout(r, 300));
      await cache.write(key(2), Buffer.alloc(1000, 1)); // the retry: still a file there, so the backoff doubles
      expect(cache.info().state).toBe('unwritable');
      expect(said(warn, 'not writable')).toBe(1);
      expect(metrics.snapshot().counters.block_cache_write_errors).toBe(2);
      await fsp.rm(join(dir, 'tmp'));
      await cache.write(key(3), Buffer.alloc(1000, 3)); // within the doubled backoff (400 ms): not tried
      expect(cache.info().state).toBe('unwritable');
      expect(metrics.snapshot().counters.block_cache_write_errors).toBe(2);
      await new Promise((r) => setTimeout(r, 500));
      await cache.write(key(3), Buffer.alloc(1000, 3));
      expect(cache.info()).toMatchObject({ state: 'ok', blocks: 1 });
      expect((await cache.read(key(3)))?.every((b) => b === 3)).toBe(true);
      expect(said(info, 'writable again')).toBe(1);
      expect(said(warn, 'not writable')).toBe(1);
    } finally {
      cache.close();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  it('takes back a renamed block file whose index row could not be written, so none is orphaned after a clean stop', async () => {
    const dir = await tempDir('cache');
    const cache = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE, unwritableRetryMs: 10 }, silentLogger, new Metrics());
    spyOnRowWrites().mockImplementationOnce(() => {
      throw Object.assign(new Error('disk I/O error'), { code: 'SQLITE_IOERR_WRITE' });
    });
    await cache.write(key(0), Buffer.alloc(1000, 1));
    expect(cache.info().state).toBe('unwritable');
    cache.close();
    expect(await blockFiles(dir)).toEqual([]);
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('does not call a new cache "reconciled after an unclean stop", but cleans block files left beside a new index', async () => {
    const dir = await tempDir('cache');
    const { log, info, said } = logSpy();
    const open = () => DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE }, log, new Metrics());
    const fresh = open();
    await fresh.ready;
    await fresh.write(key(0), Buffer.alloc(1000, 1));
    fresh.close();
    expect(said(info, 'reconciled')).toBe(0);
    // Its index deleted by hand: the block file beside the new one is no one's.
    for (const suffix of ['', '-wal', '-shm']) await fsp.rm(join(dir, `index.sqlite${suffix}`), { force: true });
    await new Promise((r) => setTimeout(r, 20)); // files older than the opener's start are the ones it may delete
    const again = open();
    await again.ready;
    again.close();
    expect(info.mock.calls.filter(([, msg]) => String(msg).startsWith('block cache reconciled')).map(([, msg]) => msg)).toEqual(['block cache reconciled with a new index beside block files']);
    expect(await blockFiles(dir)).toEqual([]);
    await fsp.rm(dir, { recursive: true, force: true });
  });

  /**
   * A cache of two 1000-byte blocks whose first block file is undeletable (EPERM even for root) and whose
   * unlinks take 200 ms: a write evicts it, and its unlink fails only after a while. `stop` is what the
   * daemon does before close; the next start must reconcile and remove the file.
   */
  const evictionFailsLate = async (stop: (cache: DiskCache) => Promise<void>): Promise<void> => {
    const dir = await tempDir('cache');
    const { log, info, said } = logSpy();
    const open = () => DiskCache.open({ dir, limit: { kind: 'bytes', bytes: 2000 }, ...DEFAULT_DISK_CACHE }, log, new Metrics());
    const cache = open();
    const first = blockFileKey(key(0));
    const firstPath = join(dir, BLOCKS_DIR, first.slice(0, 2), first);
    try {
      await cache.write(key(0), Buffer.alloc(1000, 1));
      await cache.write(key(1), Buffer.alloc(1000, 2));
      expect((await run('chattr', ['+i', firstPath])).code).toBe(0);
      const rm = fsp.rm.bind(fsp);
      vi.spyOn(fsp, 'rm').mockImplementation(async (...args: Parameters<typeof fsp.rm>) => {
        await new Promise((r) => setTimeout(r, 200));
        return rm(...args);
      });
      await cache.write(key(2), Buffer.alloc(1000, 3));
      expect(cache.lookup(key(0))).toBeNull();
      await stop(cache);
    } finally {
      cache.close();
      // The unlink has failed by now, whether or not the stop waited for it.
      await new Promise((r) => setTimeout(r, 400));
      await run('chattr', ['-i', firstPath]);
    }
    expect(await blockFiles(dir)).toContain(firstPath);
    const again = open();
    await again.ready;
    again.close();
    expect(said(info, 'block cache reconciled')).toBe(1);
    expect(await blockFiles(dir)).not.toContain(firstPath);
    await fsp.rm(dir, { recursive: true, force: true });
  };

  it('an evicted block whose file could not be removed is found by a reconcile at the next start', async () => {
    // As the daemon stops: drain, then close (the unlink's failure is heard of before close).
    await evictionFailsLate(async (cache) => {
      await cache.write(key(3), Buffer.alloc(1000, 4));
      await cache.drain();
    });
  });

  it('is not closed as clean while an evicted file is still being unlinked (it may yet fail)', async () => {
    // Closed with the unlink under way (an eviction that began after the stop's drain looked): its
    // failure comes after close, so close itself must not say clean.
    await evictionFailsLate(async () => undefined);
  });

  it('with no budget, gives space back when another program fills its disk below the free-space margin', async () => {
    const dir = await tempDir('tmpfs');
    expect((await run('mount', ['-t', 'tmpfs', '-o', 'size=16m', 'tmpfs', dir])).code).toBe(0);
    let cache: DiskCache | undefined;
    try {
      await fsp.mkdir(join(dir, 'cache'));
      cache = DiskCache.open({ dir: join(dir, 'cache'), limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE, accessFlushMs: 100 }, silentLogger, new Metrics());
      for (const b of [0, 1, 2]) await cache.write(key(b), Buffer.alloc(3 * BLOCK, b + 1));
      expect(cache.info().blocks).toBe(3);
      const free = async () => {
        const st = await fsp.statfs(dir);
        return { free: st.bavail * st.bsize, margin: 0.05 * st.blocks * st.bsize };
      };
      // Someone else's file, leaving half the margin free.
      const before = await free();
      await fsp.writeFile(join(dir, 'other'), Buffer.alloc(Math.floor((before.free - before.margin / 2) / 4096) * 4096, 9));
      expect((await free()).free).toBeLessThan((await free()).margin);
      await new Promise((r) => setTimeout(r, 400));
      const after = await free();
      expect(after.free).toBeGreaterThanOrEqual(after.margin);
      expect(cache.info().blocks).toBeLessThan(3);
      expect((await cache.read(key(2)))?.every((b) => b === 3)).toBe(true); // the most recent stays
    } finally {
      cache?.close();
      await run('umount', ['-l', dir]);
    }
  });

  // `gcsmount cache verify` said "dropped N that failed their check" for blocks evicted while it ran
  // (the cache makes room as it writes): a good block counted as damaged.
  it('verify counts as dropped only damaged blocks, not those evicted while it runs', async () => {
    const dir = await tempDir('cache');
    const cache = DiskCache.open({ dir, limit: { kind: 'bytes', bytes: 3000 }, ...DEFAULT_DISK_CACHE }, silentLogger, new Metrics());
    try {
      for (const b of [0, 1, 2]) await cache.write(key(b), Buffer.alloc(1000, b + 1));
      const verifying = cache.verify();
      // While it reads the first block, two more make room for themselves: the next two go.
      await Promise.all([cache.write(key(3), Buffer.alloc(1000, 4)), cache.write(key(4), Buffer.alloc(1000, 5))]);
      const v = await verifying;
      expect(v.bad).toBe(0);
      expect(cache.info().blocks).toBe(3);
      // And a block damaged on disk is still found and dropped.
      const damaged = blockFileKey(key(4));
      await fsp.writeFile(join(dir, BLOCKS_DIR, damaged.slice(0, 2), damaged), Buffer.alloc(1000, 0));
      expect(await cache.verify()).toMatchObject({ bad: 1 });
    } finally {
      cache.close();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  it('counts a block written by two writers at once once, so the budget is not spent early', async () => {
    const dir = await tempDir('cache');
    const metrics = new Metrics();
    const cache = DiskCache.open({ dir, limit: { kind: 'bytes', bytes: 3000 }, ...DEFAULT_DISK_CACHE }, silentLogger, metrics);
    try {
      // A warm-up, a prefetch and a read of one block, landing together.
      await Promise.all([cache.write(key(0), Buffer.alloc(1000, 1)), cache.write(key(0), Buffer.alloc(1000, 1))]);
      expect(cache.spareBytes).toBe(2000);
      await cache.write(key(1), Buffer.alloc(1000, 2));
      await cache.write(key(2), Buffer.alloc(1000, 3));
      // Exactly the budget: nothing evicted, every block there.
      expect(metrics.snapshot().counters.block_cache_evictions).toBe(0);
      for (const b of [0, 1, 2]) expect((await cache.read(key(b)))?.every((x) => x === b + 1), `block ${b}`).toBe(true);
    } finally {
      cache.close();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  it('answers a miss, not a throw, for a block asked after close (work still in flight as a mount stops)', async () => {
    const dir = await tempDir('cache');
    const cache = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE }, silentLogger, new Metrics());
    await cache.write(key(0), Buffer.alloc(1000, 1));
    expect(cache.lookup(key(0))).not.toBeNull();
    cache.close();
    expect(cache.lookup(key(0))).toBeNull();
    expect(cache.has(key(0))).toBe(false);
    expect(await cache.read(key(0))).toBeNull();
    await fsp.rm(dir, { recursive: true, force: true });
  });

  it('answers a miss, not a throw, for a damaged block whose row the index cannot delete just now (a full disk)', async () => {
    const dir = await tempDir('cache');
    const cache = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE }, silentLogger, new Metrics());
    try {
      await cache.write(key(0), Buffer.alloc(1000, 1));
      await fsp.writeFile((await blockFiles(dir))[0]!, Buffer.alloc(1000, 2)); // damaged: fails its CRC32C
      vi.spyOn(BlockIndex.prototype, 'delete').mockImplementation(() => {
        throw Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' });
      });
      expect(await cache.read(key(0))).toBeNull();
      vi.restoreAllMocks();
      // Still damaged, still indexed: the next read finds it again and drops it.
      expect(cache.has(key(0))).toBe(true);
      expect(await cache.read(key(0))).toBeNull();
      expect(cache.has(key(0))).toBe(false);
    } finally {
      cache.close();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  it('keeps a block a stale damage report names when its file is whole now, and drops one that is damaged', async () => {
    const dir = await tempDir('cache');
    const metrics = new Metrics();
    const cache = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE }, silentLogger, metrics);
    try {
      // The native path found block 0 missing (evicted), and before its report arrived a reader wrote it again.
      await cache.write(key(0), Buffer.alloc(1000, 1));
      await cache.dropDamaged(blockFileKey(key(0)), 'block_cache_missing', 'native read: block file unreadable');
      expect((await cache.read(key(0)))?.every((x) => x === 1)).toBe(true);
      expect(metrics.snapshot().counters.block_cache_missing).toBe(0);
      // A report that is true: the file is gone.
      await fsp.rm((await blockFiles(dir))[0]!);
      await cache.dropDamaged(blockFileKey(key(0)), 'block_cache_missing', 'native read: block file unreadable');
      expect(cache.has(key(0))).toBe(false);
      expect(metrics.snapshot().counters.block_cache_missing).toBe(1);
    } finally {
      cache.close();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  it('creates its folders 0700 and its files 0600 whatever the umask', async () => {
    const dir = await tempDir('cache');
    const old = process.umask(0);
    try {
      const cache = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE }, silentLogger, new Metrics());
      await cache.write(key(0), Buffer.alloc(1000, 1));
      const pool = new BlockBuffers({ blockSize: BLOCK, maxBytes: 4 * BLOCK, poison: false, idleTrimMs: 60_000 });
      const lease = pool.lease(BLOCK);
      await cache.write(key(1), lease.bytes, lease.directCapacity); // the O_DIRECT path
      lease.release();
      pool.close();
      const found = (await run('find', [dir, '-mindepth', '1', '-printf', '%y %m %P\n'])).stdout.trim().split('\n');
      cache.close();
      expect(found.length).toBeGreaterThanOrEqual(6); // index.sqlite, -wal, blocks-v2, tmp, a fan folder, two blocks
      for (const line of found) expect(line, line).toMatch(/^(d 700|f 600) /);
    } finally {
      process.umask(old);
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});

describe('the free-space margin', () => {
  it('estimates free space from a recent statfs less what the cache wrote since, and asks again after 100 ms', async () => {
    const dir = await tempDir('margin');
    const margin = FreeSpaceMargin.of(dir)!;
    const first = margin.freeBytes()!;
    margin.wrote(1024 ** 3);
    const next = margin.freeBytes()!; // no await between: the sample is fresh
    if (first - 1024 ** 3 - margin.bytes > 1024 ** 3) {
      // Far above the margin: the sample less what was written, to the byte (a statfs would not say so).
      expect(next).toBe(first - 1024 ** 3);
    } else {
      // Near it: always a fresh statfs, which has not seen the gibibyte that was never written.
      expect(Math.abs(next - first)).toBeLessThan(256 * 1024 ** 2);
    }
    await new Promise((r) => setTimeout(r, 120));
    const fresh = margin.freeBytes()!;
    expect(Math.abs(fresh - first)).toBeLessThan(256 * 1024 ** 2);
    await fsp.rm(dir, { recursive: true, force: true });
  });
});

describe('block file keys', () => {
  it("are the layout's hash of bucket, object, generation, block size and block, remembered or not", () => {
    // Existing caches are found by these names: a change here must come with a new layout version.
    const k = { bucket: 'b', object: 'dir/o', generation: '17', block: 3, blockSize: 4 * 1024 * 1024 };
    const expected = createHash('sha256').update(['b', 'dir/o', '17', '4194304', '3'].join('\0')).digest('hex').slice(0, 32);
    expect(blockFileKey(k)).toBe(expected);
    expect(blockFileKey({ ...k })).toBe(expected); // from the recent keys
    // Past the recent keys' bound (forgotten all at once), still the same names.
    for (let i = 0; i < 20_000; i++) blockFileKey({ ...k, block: 100 + i });
    expect(blockFileKey(k)).toBe(expected);
    expect(blockFileKey({ ...k, block: 4 })).not.toBe(expected);
  });
});

describe('the layout version', () => {
  it('starts a v2 cache beside a v1 one, drops the v1 table and removes the v1 folder in the background', async () => {
    const dir = await tempDir('cache');
    // A v1 cache as the previous version left it: a block file and its row, with a valid CRC.
    await fsp.mkdir(join(dir, 'blocks-v1', 'ab'), { recursive: true });
    await fsp.writeFile(join(dir, 'blocks-v1', 'ab', 'ab000000000000000000000000000000'), 'decompressed bytes');
    const old = new Database(join(dir, 'index.sqlite'));
    old.exec(`CREATE TABLE blocks_v1 (key TEXT PRIMARY KEY, bucket TEXT, object TEXT, generation TEXT, block INTEGER, size INTEGER, crc32c INTEGER, last_access INTEGER);
      INSERT INTO blocks_v1 VALUES ('ab000000000000000000000000000000', 'b', 'o', '1', 0, 18, 0, 0);
      CREATE TABLE settings (k TEXT PRIMARY KEY, v TEXT NOT NULL); INSERT INTO settings VALUES ('clean', '1');`);
    old.close();
    const info = vi.fn();
    const log = { ...silentLogger, info, warn: vi.fn(), child: () => log } as unknown as typeof silentLogger;
    const cache = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE }, log, new Metrics());
    try {
      expect(BLOCKS_DIR).toBe('blocks-v2');
      expect(await cache.read({ bucket: 'b', object: 'o', generation: '1', block: 0, blockSize: BLOCK })).toBeNull();
      expect(cache.info().blocks).toBe(0);
      await cache.oldLayoutsRemoved;
      expect((await fsp.readdir(dir)).sort()).toEqual(expect.arrayContaining([BLOCKS_DIR, 'index.sqlite', 'tmp']));
      expect(await fsp.stat(join(dir, 'blocks-v1')).catch(() => null)).toBeNull();
      expect(info.mock.calls.some(([, msg]) => String(msg).includes('older layout version'))).toBe(true);
    } finally {
      cache.close();
    }
    const db = new Database(join(dir, 'index.sqlite'), { readonly: true });
    try {
      const tables = db.prepare(`SELECT name FROM sqlite_master WHERE type = 'table'`).all() as { name: string }[];
      expect(tables.map((t) => t.name).sort()).toEqual([BLOCK_TABLE, 'settings']);
    } finally {
      db.close();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});

describe('the index commits rows in batches and checkpoints on its own schedule', () => {
  const row = (i: number) => ({ key: `k${String(i).padStart(31, '0')}`, bucket: 'b', object: `o${i}`, generation: '1', block: 0, size: 1000, crc32c: i, lastAccess: i });

  it('shows a row at once, commits the rows put together in one transaction, and rejects them all if it fails', async () => {
    const dir = await tempDir('index');
    const index = BlockIndex.open(join(dir, 'index.sqlite'));
    try {
      const realPut = (BlockIndex.prototype as unknown as RowWriter).writeRow;
      const put = spyOnRowWrites();
      const committed = Promise.all([0, 1, 2].map((i) => index.putSoon(row(i))));
      // Before the commit: visible to get and has, and nothing written yet.
      expect(index.get(row(1).key)?.crc32c).toBe(1);
      expect(index.has(row(2).key)).toBe(true);
      expect(put).toHaveBeenCalledTimes(0);
      await committed;
      expect(put).toHaveBeenCalledTimes(3);
      expect(index.totals().blocks).toBe(3);
      // A failing statement takes the whole batch back: row 3 is written, row 4 fails, and neither is
      // in the index after (without the rollback, row 3 would stay).
      put.mockImplementationOnce(function (this: BlockIndex, r: BlockRow) {
        realPut.call(this, r);
      }).mockImplementationOnce(() => {
        throw Object.assign(new Error('database or disk is full'), { code: 'SQLITE_FULL' });
      });
      const outcomes = await Promise.allSettled([3, 4].map((i) => index.putSoon(row(i))));
      expect(outcomes.map((o) => o.status)).toEqual(['rejected', 'rejected']);
      expect(index.has(row(3).key) || index.has(row(4).key)).toBe(false);
      // The rows asked about are remembered (no second query), and the memory follows every write.
      const lookups = vi.spyOn(index['stmt'].get, 'get');
      expect(index.get(row(0).key)?.crc32c).toBe(0); // committed above: known
      expect(index.has(row(3).key)).toBe(false); // asked above: known absent
      expect(index.has(row(9).key)).toBe(false);
      expect(index.has(row(9).key)).toBe(false);
      expect(lookups).toHaveBeenCalledTimes(1);
      index.delete([row(0).key]);
      expect(index.get(row(0).key)).toBeUndefined();
      await index.putSoon(row(3));
      expect(index.get(row(3).key)?.crc32c).toBe(3);
      index.putMany([{ ...row(3), crc32c: 33 }]);
      expect(index.get(row(3).key)?.crc32c).toBe(33);
      expect(lookups).toHaveBeenCalledTimes(1);
      index.clear();
      expect(index.has(row(1).key)).toBe(false);
      expect(lookups).toHaveBeenCalledTimes(2);
      index.putMany([row(0), row(1), row(2)]);
      index.delete([row(3).key]);
      // A row deleted before its commit is settled, not committed.
      const dropped = index.putSoon(row(5));
      index.delete([row(5).key]);
      await dropped;
      expect(index.has(row(5).key)).toBe(false);
      expect(index.totals().blocks).toBe(3);
    } finally {
      vi.restoreAllMocks();
      index.close(true);
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  it("lets the WAL grow past SQLite's thousand-page checkpoint under writes, and checkpoints it once they pause", async () => {
    const dir = await tempDir('index');
    const path = join(dir, 'index.sqlite');
    const index = BlockIndex.open(path, { idleCheckpointMs: 1000 });
    try {
      // Commits of rows spread over the table's pages, as blocks arrive: SQLite's own checkpoint would
      // start the WAL over at a thousand pages (4 MiB).
      const spread = (i: number) => ({ ...row(i), key: createHash('sha256').update(String(i)).digest('hex').slice(0, 32) });
      for (let b = 0; b < 150; b++) await Promise.all(Array.from({ length: 40 }, (_, j) => index.putSoon(spread(b * 40 + j))));
      const grown = (await fsp.stat(`${path}-wal`)).size;
      expect(grown).toBeGreaterThan(1.5 * 1000 * 4096);
      // Then a second without writes: the checkpoint, truncating the WAL.
      await new Promise((r) => setTimeout(r, 1500));
      expect((await fsp.stat(`${path}-wal`)).size).toBe(0);
      expect(index.totals().blocks).toBe(6000);
    } finally {
      index.close(true);
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});

describe("block files written by the addon (one pool-thread job: open, write, truncate, close, rename)", () => {
  const write = (tmp: string, final: string, data: Buffer, count: number, length: number, direct: boolean) => writeAndRename(tmp, final, data, count, length, direct);

  it('writes the bytes whole, owner-only, and renames them into place; O_DIRECT cut back to the length', async () => {
    const dir = await tempDir('addon-write');
    try {
      const pool = new BlockBuffers({ blockSize: BLOCK, maxBytes: BLOCK, poison: false, idleTrimMs: 60_000 });
      const lease = pool.lease(BLOCK - 777);
      for (let i = 0; i < lease.bytes.length; i++) lease.bytes[i] = i % 251;
      const padded = Math.ceil(lease.bytes.length / 4096) * 4096;
      for (const direct of [true, false]) {
        const tmp = join(dir, `t${direct}`);
        const final = join(dir, `f${direct}`);
        const data = direct ? Buffer.from(lease.bytes.buffer, lease.bytes.byteOffset, padded) : lease.bytes;
        await write(tmp, final, data, direct ? padded : lease.bytes.length, lease.bytes.length, direct);
        expect((await fsp.readFile(final)).equals(lease.bytes)).toBe(true);
        expect((await fsp.stat(final)).mode & 0o777).toBe(0o600);
        await expect(fsp.stat(tmp)).rejects.toMatchObject({ code: 'ENOENT' });
      }
      lease.release();
      pool.close();
    } finally {
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });

  it('says which step failed: the open (nothing written), or the rename (the file written whole, left for the caller)', async () => {
    const dir = await tempDir('addon-write');
    try {
      const data = Buffer.alloc(10_000, 7);
      await expect(write(join(dir, 'no', 'tmp'), join(dir, 'f'), data, data.length, data.length, false)).rejects.toMatchObject({ name: 'Error', code: 'ENOENT', stage: 'open' });
      const tmp = join(dir, 'tmp');
      await expect(write(tmp, join(dir, 'no', 'f'), data, data.length, data.length, false)).rejects.toMatchObject({ code: 'ENOENT', stage: 'rename' });
      expect((await fsp.readFile(tmp)).equals(data)).toBe(true);
      // The buffer is too short for the count: refused before anything is queued.
      await expect(write(join(dir, 't2'), join(dir, 'f2'), data, data.length + 1, data.length, false)).rejects.toThrow(/outside the buffer/);
    } finally {
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});
