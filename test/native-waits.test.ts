import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, finalCounters, GCSMOUNT, isMounted, mount, mountStats, run, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';
import { bytes, sha256 } from './helpers/objects.js';

const KIB = 1024;
const FILES = 40;
const SIZE = 256 * KIB;
const name = (i: number) => `w/f-${String(i).padStart(3, '0')}`;

/** `sha256sum` of each path in one process, in order: the hashes, or the exit code and error when one fails. */
async function hashesInOrder(paths: string[], timeoutMs = 60_000): Promise<{ code: number | null; hashes: string[]; stderr: string }> {
  const r = await run('sh', ['-c', 'for f in "$@"; do sha256sum "$f" || exit 1; done', 'sh', ...paths], { timeoutMs });
  return { code: r.code, hashes: r.stdout.split('\n').filter(Boolean).map((l) => l.split(' ')[0]!), stderr: r.stderr };
}

/**
 * A chunk file opened while its prefetch is still downloading (or its block file being written) is read
 * by the addon once the block lands, not by JavaScript: the open registers the block as on its way, the
 * read waits in the addon holding no thread, and JavaScript says once per block that it landed (or did
 * not: then the read comes back to JavaScript). Readers are other processes, one file after another.
 */
describe('reads of blocks on their way to disk', () => {
  let tb: TestBucket;
  const data = Array.from({ length: FILES }, (_, i) => bytes(SIZE, 900 + i));
  const mediaOf = (n: string) => tb.emulator.requestLog().filter((e) => e.kind === 'media' && e.object === n);

  beforeAll(async () => {
    tb = await startBucket('waits');
    await writeObjects(tb.root, tb.bucket, Object.fromEntries(data.map((d, i) => [name(i), d])));
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('are answered natively once they land: right bytes, each object fetched once, no read left to JavaScript', { timeout: 120_000 }, async () => {
    // Each download takes a while, so the reader catches up with the prefetch (16 files at once) and
    // opens files in flight: once per round of downloads.
    tb.emulator.setKnobs({ latencyMs: 300, bandwidthBytesPerSec: 0, failMedia: null, stall: false });
    const m = await mount({ tb, args: ['--cache-dir', await tempDir('waits-cache')] });
    try {
      tb.emulator.resetStats();
      const got = await hashesInOrder(data.map((_, i) => join(m.path, name(i))));
      expect(got.code, got.stderr).toBe(0);
      expect(got.hashes).toEqual(data.map(sha256));
      for (let i = 0; i < FILES; i++) expect(mediaOf(name(i)).length, name(i)).toBe(1);
      const s = await mountStats(m.path);
      console.log('waits', JSON.stringify({ waited: s.counters.native_reads_waited, lent: s.counters.native_blocks_lent, native: s.counters.native_reads, fallbacks: s.counters.native_fallbacks, jsReads: s.fuseOps.read?.count }));
      expect(s.counters.native_reads_waited).toBeGreaterThan(0);
      // The download workers hand the files' bytes to the addon as they land: the waits end there.
      expect(s.counters.native_blocks_lent).toBeGreaterThan(0);
      expect(s.counters.native_fallbacks ?? 0).toBe(0);
      // Only the files read before the folder's walk began (its first two or three) are read in JavaScript.
      expect(s.fuseOps.read?.count ?? 0).toBeLessThanOrEqual(12);
    } finally {
      await unmount(m.path);
    }
  });

  it("answer a cold sequential reader's own blocks, fetched ahead by its handle: few reads reach JavaScript", { timeout: 120_000 }, async () => {
    const big = bytes(64 * 1024 * KIB, 4242);
    await writeObjects(tb.root, tb.bucket, { 'seq/big.bin': big });
    // Slow enough that the reader waits on most blocks while they download.
    tb.emulator.setKnobs({ latencyMs: 20, bandwidthBytesPerSec: 64 * 1024 * KIB, failMedia: null, stall: false });
    const m = await mount({ tb, args: ['--cache-dir', await tempDir('waits-cache')] });
    try {
      tb.emulator.resetStats();
      const got = await hashesInOrder([join(m.path, 'seq/big.bin')]);
      expect(got.code, got.stderr).toBe(0);
      expect(got.hashes).toEqual([sha256(big)]);
      // Each 4 MiB block once: handing reads to the addon fetches nothing twice.
      expect(mediaOf('seq/big.bin').length).toBe(16);
      const s = await mountStats(m.path);
      const jsReads = s.fuseOps.read?.count ?? 0;
      const native = s.counters.native_reads ?? 0;
      const loads = s.counters.native_block_loads ?? 0;
      console.log('sequential', JSON.stringify({ native, waited: s.counters.native_reads_waited, lent: s.counters.native_blocks_lent, fromReadahead: s.counters.native_landed_lent, loads, fallbacks: s.counters.native_fallbacks, jsReads }));
      // Its handle holds every block it fetched until the reader is past it: those the reader reaches
      // after they landed are lent from that memory, not read back from their files (a third of a cold
      // GiB's blocks were, before).
      expect(loads).toBeLessThanOrEqual(2);
      expect(s.counters.native_reads_waited).toBeGreaterThan(0);
      expect(s.counters.native_blocks_lent).toBeGreaterThan(0);
      expect((await run(GCSMOUNT, ['stats', m.path])).stdout).toContain(`(blocks lent from their download ${s.counters.native_blocks_lent!.toLocaleString('en-US')}, from readahead ${(s.counters.native_landed_lent ?? 0).toLocaleString('en-US')})`);
      expect(s.counters.native_fallbacks ?? 0).toBe(0);
      // Without the hand-off every read is JavaScript's (native 0).
      expect(native).toBeGreaterThan(1.5 * jsReads);
    } finally {
      await unmount(m.path);
    }
    tb.emulator.setKnobs({ latencyMs: 0, bandwidthBytesPerSec: 0 });
  });

  /** A mount whose cache holds the first two files (so they are read with no request) and whose folder listing is held. */
  const warmStart = async (): Promise<{ path: string; logFile: string; cacheDir: string }> => {
    tb.emulator.setKnobs({ latencyMs: 0, bandwidthBytesPerSec: 0, failMedia: null, stall: false });
    const cacheDir = await tempDir('waits-cache');
    // No prefetch in this one: only these two files go into the cache.
    const first = await mount({ tb, args: ['--cache-dir', cacheDir, '--prefetch-max-files-ahead', '0'] });
    expect((await hashesInOrder([0, 1].map((i) => join(first.path, name(i))))).hashes).toEqual([0, 1].map((i) => sha256(data[i]!)));
    await unmount(first.path);
    await finalCounters(first.logFile);
    const m = await mount({ tb, args: ['--cache-dir', cacheDir] });
    expect((await run('ls', [join(m.path, 'w')])).stdout.split('\n').filter(Boolean)).toHaveLength(FILES);
    return { path: m.path, logFile: m.logFile, cacheDir };
  };

  it('go back to JavaScript when their block does not land (a download that fails for good), none hangs', { timeout: 120_000 }, async () => {
    const m = await warmStart();
    try {
      // The prefetch the next opens start is refused, after long enough that the reader opens a file
      // while its download is still in flight.
      tb.emulator.setKnobs({ latencyMs: 3000, failMedia: { status: 403 } });
      tb.emulator.resetStats();
      const t0 = performance.now();
      const failed = await hashesInOrder([0, 1, 2].map((i) => join(m.path, name(i))));
      // The first two from the cache, the third fails with an error (403 is for good), not a hang.
      expect(failed.hashes).toEqual([0, 1].map((i) => sha256(data[i]!)));
      expect(failed.code).not.toBe(0);
      expect(performance.now() - t0).toBeLessThan(30_000);
      const s = await mountStats(m.path);
      console.log('not landed', JSON.stringify({ waited: s.counters.native_reads_waited, fallbacks: s.counters.native_fallbacks, media: mediaOf(name(2)).length }));
      expect(s.counters.native_reads_waited).toBeGreaterThan(0);
      expect(s.counters.native_fallbacks).toBeGreaterThan(0);
      // Once GCS answers again, the same file reads right.
      tb.emulator.setKnobs({ latencyMs: 0, failMedia: null });
      const refused = mediaOf(name(2)).length;
      expect((await hashesInOrder([join(m.path, name(2))])).hashes).toEqual([sha256(data[2]!)]);
      expect(mediaOf(name(2)).length - refused).toBe(1);
    } finally {
      await unmount(m.path);
    }
  });

  it('let the daemon stop at once when the mount is cut while they wait (umount -f)', { timeout: 120_000 }, async () => {
    const m = await warmStart();
    const daemonPid = ((await mountStats(m.path)) as unknown as { pid: number }).pid;
    expect(daemonPid).toBeGreaterThan(0);
    // Every request is held unanswered from here: the prefetch of the next files never lands.
    tb.emulator.setKnobs({ stall: true });
    const reader = run('sh', ['-c', 'for f in "$@"; do cat "$f" > /dev/null || exit 1; done', 'sh', ...[0, 1, 2].map((i) => join(m.path, name(i)))], { timeoutMs: 60_000 });
    let s: Awaited<ReturnType<typeof mountStats>> | undefined;
    for (let t = 0; t < 100 && !(s?.counters.native_reads_waited); t++) {
      await new Promise((r) => setTimeout(r, 100));
      s = await mountStats(m.path);
    }
    expect(s?.counters.native_reads_waited).toBeGreaterThan(0);
    const t0 = performance.now();
    await run('umount', ['-f', m.path]);
    await reader;
    // The daemon gives the waiting read back and ends its session, well before the addon's own 10 s guard.
    let alive = true;
    while (alive && performance.now() - t0 < 30_000) {
      alive = (await run('kill', ['-0', String(daemonPid)])).code === 0;
      if (alive) await new Promise((r) => setTimeout(r, 100));
    }
    const took = performance.now() - t0;
    tb.emulator.setKnobs({ stall: false });
    console.log('cut while waiting', Math.round(took), 'ms');
    expect(alive).toBe(false);
    expect(took).toBeLessThan(8_000);
    if (await isMounted(m.path)) await unmount(m.path);
  });
});
