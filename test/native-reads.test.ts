import { crc32c } from '@node-rs/crc32';
import { crc32c as daemonCrc32c } from '../src/crc32c.js';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { blockFileKey, BLOCKS_DIR } from '../src/blocks/disk-cache.js';
import { CACHE_SUBDIR } from '../src/blocks/cache-home.js';
import { loadFuse } from '../src/fs/kernel.js';
import { cleanupAll, eventually, finalCounters, GCSMOUNT, mount, mountStats, run, sha256Of, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';
import { bytes, objectMeta, sha256 } from './helpers/objects.js';

const MIB = 1024 * 1024;
const BLOCK = 4 * MIB;
const PY = '/usr/bin/python3';

/**
 * Reads of blocks already in the disk cache are answered by the addon's native workers (read whole,
 * CRC32C-checked, replied from that memory) without a JavaScript read; a damaged block file goes back to
 * JavaScript, which drops it and fetches the block from GCS.
 */
describe('native reads of cached blocks', () => {
  let tb: TestBucket;
  // 10 whole blocks and a short last one, so both lengths are read and checked.
  const big = bytes(40 * MIB + 12345, 31);
  const NAME = 'warm/big.bin';

  beforeAll(async () => {
    tb = await startBucket('native');
    await writeObjects(tb.root, tb.bucket, { [NAME]: big });
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  /** A cache dir holding every block of the object, filled by a mount that is gone again. */
  const filledCache = async (): Promise<{ cacheDir: string; mountPoint: string }> => {
    const cacheDir = await tempDir('cache');
    const m = await mount({ tb, args: ['--cache-dir', cacheDir] });
    expect(await sha256Of(join(m.path, NAME))).toBe(sha256(big));
    await unmount(m.path);
    await finalCounters(m.logFile); // the daemon has stopped and let go of the cache
    return { cacheDir, mountPoint: m.path };
  };

  const blockFile = async (cacheDir: string, block: number): Promise<string> => {
    const { generation } = await objectMeta(tb, NAME);
    const key = blockFileKey({ bucket: tb.bucket, object: NAME, generation, block, blockSize: BLOCK });
    return join(cacheDir, CACHE_SUBDIR, BLOCKS_DIR, key.slice(0, 2), key);
  };

  it('answers reads of blocks on disk without JavaScript or GCS, with the right bytes', async () => {
    const { cacheDir, mountPoint } = await filledCache();
    const m = await mount({ tb, args: ['--cache-dir', cacheDir], mountPoint });
    tb.emulator.resetStats();
    const t0 = performance.now();
    expect(await sha256Of(join(m.path, NAME))).toBe(sha256(big));
    // A read across two blocks (O_DIRECT from the reader: the kernel passes its exact range on).
    const r = await run(PY, [
      '-c',
      `import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY|os.O_DIRECT); sys.stdout.write(os.pread(fd, 300, ${BLOCK - 100}).hex())`,
      join(m.path, NAME),
    ]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe(big.subarray(BLOCK - 100, BLOCK + 200).toString('hex'));
    const readingMs = performance.now() - t0;
    const s = await mountStats(m.path);
    expect(tb.emulator.stats().requests.media).toBe(0);
    // Every byte from the native path; the open registered the blocks, so no read entered JavaScript.
    // At least the file and the 300 bytes: the kernel may read some pages twice when another test drops
    // the page cache meanwhile (a full suite once counted 48 KiB more), natively too.
    expect(s.counters.native_read_bytes).toBeGreaterThanOrEqual(big.length + 300);
    expect(s.counters.fuse_read_bytes).toBe(s.counters.native_read_bytes);
    expect(s.fuseOps.read?.count ?? 0).toBe(0);
    expect(s.counters.native_fallbacks).toBe(0);
    // Their latency is counted (a read from disk and a check take well over a microsecond), and bounded
    // by the time the reads took at all: each read began and ended within readingMs, and at most
    // max_background (64) asynchronous reads and one synchronous read were in flight at once.
    expect(s.counters.native_read_ms).toBeGreaterThan(0);
    expect(s.counters.native_read_ms).toBeLessThanOrEqual(Math.ceil(readingMs) * Math.min(65, s.counters.native_reads!));
    // Each block read from disk and checked once for the sequential read (the cross-block one may find
    // both in memory still, or read them again).
    expect(s.counters.native_block_loads).toBeGreaterThanOrEqual(11);
    expect(s.counters.native_block_loads).toBeLessThanOrEqual(13);
    // The operator's table says the same.
    const table = await run(GCSMOUNT, ['stats', m.path]);
    expect(table.stdout).toContain(`native reads  answered ${s.counters.native_reads!.toLocaleString('en-US')} (`);
    expect(table.stdout).toMatch(/given back to JavaScript 0 /);
    await unmount(m.path);
  });

  it('drops a corrupt, a short and a missing block file and fetches just those blocks from GCS again', async () => {
    const { cacheDir, mountPoint } = await filledCache();
    // Damage three blocks: flipped bytes (same length), cut short, gone.
    const corrupt = await blockFile(cacheDir, 2);
    const fh = await fsp.open(corrupt, 'r+');
    await fh.write(Buffer.from('not the bytes'), 0, 13, 123_456);
    await fh.close();
    await fsp.truncate(await blockFile(cacheDir, 5), 1_000_000);
    await fsp.rm(await blockFile(cacheDir, 10));

    const m = await mount({ tb, args: ['--cache-dir', cacheDir], mountPoint });
    tb.emulator.resetStats();
    // Another process reads; every byte is the object's.
    expect(await sha256Of(join(m.path, NAME))).toBe(sha256(big));
    expect(tb.emulator.stats().requests.media).toBe(3);
    const s = await mountStats(m.path);
    expect(s.counters.native_fallbacks).toBeGreaterThanOrEqual(3);
    expect(s.counters.block_cache_corrupt).toBe(1);
    expect(s.counters.block_cache_short).toBe(1);
    expect(s.counters.block_cache_missing).toBe(1);
    expect(s.counters.block_fetches).toBe(3);
    await unmount(m.path);
    await finalCounters(m.logFile);

    // The fetched blocks went back to disk: the next mount reads everything natively, GCS untouched.
    const again = await mount({ tb, args: ['--cache-dir', cacheDir], mountPoint });
    tb.emulator.resetStats();
    expect(await sha256Of(join(again.path, NAME))).toBe(sha256(big));
    expect(tb.emulator.stats().requests.media).toBe(0);
    const s2 = await mountStats(again.path);
    expect(s2.counters.native_fallbacks).toBe(0);
    // Every read native (the kernel may ask for a range twice, its pages dropped meanwhile: seen once,
    // 64 KiB more than the object).
    expect(s2.fuseOps.read?.count ?? 0).toBe(0);
    expect(s2.counters.native_read_bytes).toBeGreaterThanOrEqual(big.length);
    await unmount(again.path);
  });

  it('serves a block damaged after it was checked from the checked copy, and the next open refetches it', async () => {
    const { cacheDir, mountPoint } = await filledCache();
    const m = await mount({ tb, args: ['--cache-dir', cacheDir], mountPoint });
    tb.emulator.resetStats();
    // Block 0 read and checked into memory by a first reader.
    const head = await run('dd', [`if=${join(m.path, NAME)}`, 'of=/dev/null', 'bs=64k', 'count=1', 'iflag=direct']);
    expect(head.code, head.stderr).toBe(0);
    // Then its file goes bad on disk: the memory holds what was checked, so bytes stay right either way.
    const file = await blockFile(cacheDir, 0);
    const fh = await fsp.open(file, 'r+');
    await fh.write(Buffer.alloc(4096, 0xee), 0, 4096, 8192);
    await fh.close();
    expect(await sha256Of(join(m.path, NAME))).toBe(sha256(big));
    await unmount(m.path);
    await finalCounters(m.logFile);
    // A fresh daemon checks the file again, finds it bad and fetches the block from GCS.
    const again = await mount({ tb, args: ['--cache-dir', cacheDir], mountPoint });
    tb.emulator.resetStats();
    expect(await sha256Of(join(again.path, NAME))).toBe(sha256(big));
    expect(tb.emulator.stats().requests.media).toBe(1);
    expect((await mountStats(again.path)).counters.block_cache_corrupt).toBe(1);
    await unmount(again.path);
  });

  it('keeps every cached block when the daemon runs out of file descriptors, and reads them again after', async () => {
    // 5 objects of 4 blocks: 20 blocks on disk, read by 6 processes at once.
    const names = Array.from({ length: 5 }, (_, i) => `fds/f${i}.bin`);
    const data = names.map((_, i) => bytes(4 * BLOCK, 70 + i));
    await writeObjects(tb.root, tb.bucket, Object.fromEntries(names.map((n, i) => [n, data[i]!])));
    const cacheDir = await tempDir('cache');
    const first = await mount({ tb, args: ['--cache-dir', cacheDir] });
    for (const [i, n] of names.entries()) expect(await sha256Of(join(first.path, n))).toBe(sha256(data[i]!));
    await unmount(first.path);
    await finalCounters(first.logFile);

    const m = await mount({ tb, args: ['--cache-dir', cacheDir], mountPoint: first.path });
    const info = JSON.parse((await run(GCSMOUNT, ['stats', m.path, '--json'])).stdout) as { pid: number };
    expect((await mountStats(m.path)).gauges.block_cache_blocks).toBe(20);
    const open = (await fsp.readdir(`/proc/${info.pid}/fd`)).length;
    // The soft limit only (this container may not raise a hard one again): a descriptor or two to spare,
    // which block files, sockets and the readers' opens compete for.
    const hard = (await run('prlimit', [`--pid=${info.pid}`, '--nofile', '--raw', '--noheadings', '--output=HARD'])).stdout.trim();
    expect((await run('prlimit', [`--pid=${info.pid}`, `--nofile=${open + 2}:`])).code).toBe(0);
    tb.emulator.resetStats();
    const sums = await Promise.all([...names, names[0]!].map((n) => sha256Of(join(m.path, n))));
    expect(sums).toEqual([...data, data[0]!].map((d) => sha256(d)));
    const media = tb.emulator.stats().requests.media;
    // Room again before asking (the control socket needs a descriptor too).
    expect((await run('prlimit', [`--pid=${info.pid}`, `--nofile=${hard}:`])).code).toBe(0);
    const s = await mountStats(m.path);
    // The pressure was real (cached blocks went to GCS), and took no block with it.
    expect(s.counters.block_cache_unavailable).toBeGreaterThan(0);
    expect(s.counters.block_cache_missing).toBe(0);
    expect(s.counters.block_cache_short).toBe(0);
    expect(s.counters.block_cache_corrupt).toBe(0);
    expect(s.gauges.block_cache_blocks).toBe(20);
    expect(media).toBeLessThanOrEqual(24);

    // Every block is still on disk, read natively, GCS untouched (once downloads the readers started
    // under pressure, readahead retrying a refused connect, have ended).
    await eventually(async () => {
      const g = (await mountStats(m.path)).gauges;
      return (g.downloads_in_flight ?? 0) === 0 && (g.downloads_queued ?? 0) === 0;
    });
    tb.emulator.resetStats();
    for (const [i, n] of names.entries()) expect(await sha256Of(join(m.path, n))).toBe(sha256(data[i]!));
    expect(tb.emulator.stats().requests.media).toBe(0);
    expect((await mountStats(m.path)).gauges.block_cache_blocks).toBe(20);
    expect(await fsp.readFile(m.logFile, 'utf8')).not.toContain('not writable');
    await unmount(m.path);
  }, 120_000);

  it('checks blocks with the same CRC32C as the block index (hardware or not)', () => {
    const fuse = loadFuse();
    const data = bytes(3 * MIB + 777, 5);
    for (const len of [0, 1, 7, 8, 9, 4095, 4096, 4097, 12_289, MIB, 3 * MIB + 777]) {
      for (const off of [0, 1, 5]) {
        const b = data.subarray(off, Math.min(data.length, off + len));
        expect(fuse.crc32c(b), `${len}@${off}`).toBe(crc32c(b));
        const half = b.length >> 1;
        expect(fuse.crc32c(b.subarray(half), fuse.crc32c(b.subarray(0, half)))).toBe(crc32c(b));
      }
    }
    // The JavaScript path's checks (a whole object against GCS's, a block written or read back) use it too.
    expect(daemonCrc32c).toBe(fuse.crc32c);
  });
});
