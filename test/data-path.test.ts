import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RequestLogEntry } from '../src/emulator/server.js';
import { cleanupAll, eventually, finalCounters, mount, mountStats, run, sha256Of, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';
import { bytes, sha256 } from './helpers/objects.js';

const MIB = 1024 * 1024;
const PY = '/usr/bin/python3';


/** The most media requests the emulator had in flight at any one moment. */
function peakOverlap(log: RequestLogEntry[]): number {
  const edges = log.filter((e) => e.kind === 'media').flatMap((e) => [[e.startMs, 1] as const, [e.endMs, -1] as const]);
  edges.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let now = 0;
  let peak = 0;
  for (const [, d] of edges) peak = Math.max(peak, (now += d));
  return peak;
}

describe('the data path', () => {
  let tb: TestBucket;
  const files: Record<string, Buffer> = {};

  beforeAll(async () => {
    tb = await startBucket('data-path');
    // 200 MiB in files of 1 to 8 MiB.
    let total = 0;
    for (let i = 0; total < 200 * MIB; i++) {
      const size = (1 + (i % 8)) * MIB + (i % 3) * 12345;
      files[`mixed/f${String(i).padStart(3, '0')}.bin`] = bytes(size, 1000 + i);
      total += size;
    }
    files['seq/large.bin'] = bytes(96 * MIB, 7);
    await writeObjects(tb.root, tb.bucket, files);
    // A 1 GiB object for a random reader: sparse, so it costs no disk.
    const sparse = await fsp.open(join(tb.root, tb.bucket, 'random/one-gib.bin'), 'w').catch(async () => {
      await fsp.mkdir(join(tb.root, tb.bucket, 'random'), { recursive: true });
      return fsp.open(join(tb.root, tb.bucket, 'random/one-gib.bin'), 'w');
    });
    await sparse.truncate(1024 * MIB);
    await sparse.close();
    // The emulator hashes an object the first time it describes one (GCS stores its hashes): done now,
    // or the mount's first listing waits seconds for 1.3 GiB of hashing and may be cut as stalled.
    const listed = await fetch(`${tb.emulator.url}/storage/v1/b/${tb.bucket}/o?fields=items(name,crc32c)`);
    expect(listed.ok).toBe(true);
  });

  afterAll(async () => {
    tb?.emulator.setKnobs({ rate429: 0, rate503: 0, resetRate: 0, shortBodyRate: 0, retryAfterSeconds: null, failMedia: null, latencyMs: 0, bandwidthBytesPerSec: 0 });
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('returns every byte to 8 readers while 30% of requests get 429 and 5% 503, and counts the retries', async () => {
    const m = await mount({ tb });
    const names = Object.keys(files).filter((n) => n.startsWith('mixed/'));
    const readAll = async (subset: string[]) => {
      const groups = Array.from({ length: 8 }, (_, g) => subset.filter((_, i) => i % 8 === g));
      const results = await Promise.all(groups.map((g) => run('sha256sum', g.map((n) => join(m.path, n)), { timeoutMs: 120_000 })));
      for (const r of results) {
        expect(r.stderr).toBe('');
        for (const line of r.stdout.trim().split('\n')) {
          const [hash, path] = line.split(/\s+/);
          expect(hash, path).toBe(sha256(files[path!.slice(m.path.length + 1)]!));
        }
      }
    };
    tb.emulator.resetStats();
    // The first half sees 429s that carry Retry-After, the second half plain ones.
    tb.emulator.setKnobs({ rate429: 0.3, rate503: 0.05, retryAfterSeconds: 1, seed: 42 });
    await readAll(names.slice(0, names.length / 2));
    tb.emulator.setKnobs({ retryAfterSeconds: null });
    await readAll(names.slice(names.length / 2));
    tb.emulator.setKnobs({ rate429: 0, rate503: 0 });
    const injected = tb.emulator.stats().injected;
    await unmount(m.path);
    const counters = await finalCounters(m.logFile);
    expect(injected['429']).toBeGreaterThan(10);
    expect(counters.gcs_throttled).toBe(injected['429']);
    expect({ stalls: counters.gcs_stalls ?? 0, retries: counters.gcs_retries }).toEqual({ stalls: 0, retries: injected['429'] + injected['503'] });
    expect(counters.gcs_errors).toBe(0);
    expect(await fsp.readFile(m.logFile, 'utf8')).toMatch(/"status":429.*GCS retry after/);
  }, 180_000);

  it('recovers the right bytes from connection resets and bodies cut short', async () => {
    const m = await mount({ tb });
    const names = Object.keys(files).filter((n) => n.startsWith('mixed/')).slice(0, 12);
    tb.emulator.resetStats();
    tb.emulator.setKnobs({ resetRate: 0.3, shortBodyRate: 0.3, seed: 7 });
    for (const n of names) expect(await sha256Of(join(m.path, n)), n).toBe(sha256(files[n]!));
    tb.emulator.setKnobs({ resetRate: 0, shortBodyRate: 0 });
    // Prefetch goes on in the background: every fault it met is retried once the requests settle (a
    // fault the daemon notices only after its stop began is not retried, and would not be counted).
    let last = -1;
    await eventually(async () => {
      await new Promise((r) => setTimeout(r, 300));
      const total = tb.emulator.stats().requests.total;
      const quiet = total === last;
      last = total;
      return quiet;
    });
    const injected = tb.emulator.stats().injected;
    expect(injected.reset).toBeGreaterThan(0);
    expect(injected.short).toBeGreaterThan(0);
    await unmount(m.path);
    const counters = await finalCounters(m.logFile);
    expect(counters.gcs_retries).toBeGreaterThanOrEqual(injected.reset + injected.short);
  });

  it('stops to the end with downloads in flight: block index closed and final counters logged', async () => {
    // Files read and closed leave prefetches of the folder's others in flight (slow answers, some cut)
    // when the mount goes: the stop must still run to its last step. It once ended half-way: while
    // it waited for a batch of block-index rows (an unref'd timer) nothing kept Node's loop alive.
    for (let round = 0; round < 3; round++) {
      const m = await mount({ tb, args: ['--cache-dir', await tempDir('stop-cache')] });
      tb.emulator.setKnobs({ latencyMs: 20, resetRate: 0.2 });
      for (const n of Object.keys(files).filter((k) => k.startsWith('mixed/')).slice(round * 2, round * 2 + 2)) {
        expect(await sha256Of(join(m.path, n))).toBe(sha256(files[n]!));
      }
      await unmount(m.path);
      const counters = await finalCounters(m.logFile).catch(async (err: Error) => {
        throw new Error(`${err.message}; the log ends: ${(await fsp.readFile(m.logFile, 'utf8')).slice(-600)}`);
      });
      expect(counters.gcs_requests_media).toBeGreaterThan(0);
      // The stop fails every attempt in flight: each failure must reach someone who handles it.
      expect(await fsp.readFile(m.logFile, 'utf8')).not.toContain('nobody waited for');
      tb.emulator.setKnobs({ latencyMs: 0, resetRate: 0 });
    }
  });

  it('fails a read at once on a permanent 403 (EACCES) or 404 (ESTALE: its generation is gone), as gcsfuse, without a retry loop', async () => {
    const m = await mount({ tb });
    for (const [status, said] of [[403, 'Permission denied'], [404, 'Stale file handle']] as const) {
      tb.emulator.resetStats();
      tb.emulator.setKnobs({ failMedia: { status } });
      const retriesBefore = (await mountStats(m.path)).counters.gcs_retries ?? 0;
      const r = await run('cat', [join(m.path, 'mixed/f001.bin')]);
      expect(r.code).not.toBe(0);
      expect(r.stderr).toContain(said);
      // The kernel may ask twice (a read and its retry); there is no backoff loop behind either: no
      // retry counted (a backoff sleep is one), and no request beyond those two.
      expect((await mountStats(m.path)).counters.gcs_retries ?? 0).toBe(retriesBefore);
      expect(tb.emulator.stats().requests.media).toBeLessThanOrEqual(2);
    }
    tb.emulator.setKnobs({ failMedia: null });
    await unmount(m.path);
  });

  it('reads a large object sequentially with range GETs in parallel, in a window that grows', async () => {
    const m = await mount({ tb });
    tb.emulator.setKnobs({ latencyMs: 50, bandwidthBytesPerSec: 40 * MIB });
    tb.emulator.resetStats();
    expect(await sha256Of(join(m.path, 'seq/large.bin'))).toBe(sha256(files['seq/large.bin']!));
    tb.emulator.setKnobs({ latencyMs: 0, bandwidthBytesPerSec: 0 });
    const media = tb.emulator.requestLog().filter((e) => e.kind === 'media').sort((a, b) => a.startMs - b.startMs);
    expect(media).toHaveLength(24); // 96 MiB in 4 MiB blocks, each fetched once
    // The window grows: before the first block arrives only it and one block ahead are asked for; later,
    // several range GETs overlap in time.
    expect(media.filter((e) => e.startMs < media[0]!.endMs).length).toBeLessThanOrEqual(2);
    expect(peakOverlap(media)).toBeGreaterThanOrEqual(4);
    await unmount(m.path);
  });

  it('fetches each block once under a large kernel readahead, whose requests arrive out of order', async () => {
    const m = await mount({ tb });
    // What gcsfuse's tuning advice does to a mount: the kernel then sends many 128 KiB reads at once,
    // spread over megabytes ahead of the reader.
    const dev = (await fsp.readFile('/proc/self/mountinfo', 'utf8')).split('\n').find((l) => l.split(' ')[4] === m.path)!.split(' ')[2]!;
    await fsp.writeFile(`/sys/class/bdi/${dev}/read_ahead_kb`, '4096');
    tb.emulator.setKnobs({ latencyMs: 20, bandwidthBytesPerSec: 0 });
    tb.emulator.resetStats();
    expect(await sha256Of(join(m.path, 'seq/large.bin'))).toBe(sha256(files['seq/large.bin']!));
    tb.emulator.setKnobs({ latencyMs: 0, bandwidthBytesPerSec: 0 });
    // No block dropped and fetched again: 96 MiB in 4 MiB blocks is 24 GETs (there is no disk cache).
    expect(tb.emulator.stats().requests.media).toBe(24);
    await unmount(m.path);
  });

  it('fetches only the blocks a random reader touches', async () => {
    const m = await mount({ tb });
    tb.emulator.resetStats();
    const r = await run(PY, ['-c', `
import os
f = os.open(${JSON.stringify(join(m.path, 'random/one-gib.bin'))}, os.O_RDONLY)
for i in [200, 17, 150, 3, 90, 240, 61, 120, 33, 180]:   # 10 blocks of 4 MiB, far apart, out of order
    assert os.pread(f, 65536, i * 4 * 1024 * 1024 + 100000) == bytes(65536)
print('ok')
`]);
    expect(r.stdout.trim()).toBe('ok');
    const media = tb.emulator.stats().requests.media;
    expect(media).toBeGreaterThanOrEqual(10);
    expect(media).toBeLessThanOrEqual(12);
    await unmount(m.path);
  });

  it('streams 2 GiB without the daemon growing with the file', async () => {
    const m = await mount({ tb, foreground: true });
    const pid = m.daemon!.pid!;
    const r = await run('sh', ['-c', `cat ${join(m.path, 'random/one-gib.bin')} ${join(m.path, 'random/one-gib.bin')} | wc -c`], { timeoutMs: 120_000 });
    expect(r.stdout.trim()).toBe(String(2 * 1024 * MIB));
    const status = await fsp.readFile(`/proc/${pid}/status`, 'utf8');
    const peakKiB = Number(/VmHWM:\s+(\d+)/.exec(status)![1]);
    // Readahead is capped per file (32 MiB) and in all (40 blocks): well under the size of what streamed.
    expect(peakKiB * 1024).toBeLessThan(400 * MIB);
    await unmount(m.path);
  }, 120_000);
});
