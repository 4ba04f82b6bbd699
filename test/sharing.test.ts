import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Faults } from '../src/emulator/faults.js';
import { cleanupAll, finalCounters, mount, run, startBucket, unmount, writeObjects, type TestBucket } from './helpers/harness.js';
import { bytes, sha256 } from './helpers/objects.js';

const MIB = 1024 * 1024;

afterAll(async () => {
  await cleanupAll();
});

describe('three daemons sharing one rate-limited bucket', () => {
  let tb: TestBucket;
  afterAll(async () => tb?.emulator.close());

  it('read their data right, with no read errors, and back off on the shared 429s', async () => {
    // 40 requests/s for the whole emulator; each daemon starts at the default 5,000/s ceiling and must find its share.
    tb = await startBucket('shared', { rateLimit: 40 });
    const files: Record<string, Buffer> = {};
    for (let d = 0; d < 3; d++) for (let i = 0; i < 40; i++) files[`d${d}/c${i}`] = bytes(64 * 1024 + i, d * 100 + i);
    await writeObjects(tb.root, tb.bucket, files);
    const mounts = [];
    for (let d = 0; d < 3; d++) mounts.push(await mount({ tb, args: ['--only-dir', `d${d}`] }));
    tb.emulator.resetStats();

    // Four reader processes per mount, ten files each, all at once.
    const reads = await Promise.all(
      mounts.flatMap((m) =>
        [0, 1, 2, 3].map((r) => run('sha256sum', Array.from({ length: 10 }, (_, k) => join(m.path, `c${r * 10 + k}`)), { timeoutMs: 180_000 })),
      ),
    );
    for (const r of reads) expect(r.code, r.stderr).toBe(0);
    const sums = new Map(reads.flatMap((r) => r.stdout.trim().split('\n')).map((l) => [l.split('  ')[1]!, l.split('  ')[0]!]));
    for (let d = 0; d < 3; d++) {
      for (let i = 0; i < 40; i++) expect(sums.get(join(mounts[d]!.path, `c${i}`))).toBe(sha256(files[`d${d}/c${i}`]!));
    }

    const stats = tb.emulator.stats();
    for (const m of mounts) await unmount(m.path);
    const counters = await Promise.all(mounts.map((m) => finalCounters(m.logFile)));
    // The limit was reached (so the limiter was exercised), and every 429 the emulator sent was seen and
    // retried by a daemon; none failed a read.
    expect(stats.injected.throttle).toBeGreaterThan(0);
    expect(counters.reduce((a, c) => a + c.gcs_throttled!, 0)).toBe(stats.injected.throttle);
    for (const c of counters) {
      expect(c.gcs_errors).toBe(0);
      expect(c.fuse_errors).toBe(0);
      expect(c.gcs_rate_cuts).toBeGreaterThan(0);
    }
    // Every object was fetched once: 120 media GETs answered 206/200, whatever the 429s in between.
    const media = tb.emulator.requestLog().filter((e) => e.kind === 'media' && (e.status === 200 || e.status === 206));
    expect(media.length).toBe(120);
  }, 240_000);
});

describe('stalls and bounded retries', () => {
  let tb: TestBucket;
  afterAll(async () => {
    tb?.emulator.setKnobs({ stall: false, bodyStallRate: 0 });
    await tb?.emulator.close();
  });

  it('cuts a stalled body after the stall timeout and resumes it by Range from the last byte received', async () => {
    tb = await startBucket('stalls');
    const data = bytes(3 * MIB, 7);
    await writeObjects(tb.root, tb.bucket, { 'stalled.bin': data, 'other.bin': bytes(1000, 8) });
    // A seed whose first media body stalls and whose second does not: the dice are the emulator's own.
    let seed = 1;
    for (; ; seed++) {
      const f = new Faults({ seed, bodyStallRate: 0.5 });
      if (f.rollStall(data.length) && !f.rollStall(data.length)) break;
    }
    tb.emulator.setKnobs({ seed, bodyStallRate: 0.5, bodyStallMs: 60_000, bodyStallResumes: true });
    const m = await mount({ tb, args: ['--read-stall-initial-req-timeout', '1s', '--read-stall-min-req-timeout', '500ms'] });
    tb.emulator.resetStats();
    const t0 = performance.now();
    const r = await run('sha256sum', [join(m.path, 'stalled.bin')], { timeoutMs: 60_000 });
    const seconds = (performance.now() - t0) / 1000;
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.split(' ')[0]).toBe(sha256(data));
    // Far sooner than the 60 s silence: cut after about the 1 s stall timeout.
    expect(seconds).toBeLessThan(30);

    const media = tb.emulator.requestLog().filter((e) => e.kind === 'media' && e.object === 'stalled.bin');
    expect(media.map((e) => e.injected)).toEqual(['body-stall', null]);
    const [first, resumed] = media as [(typeof media)[0], (typeof media)[0]];
    // The resume asks for exactly the bytes the stalled response had not delivered.
    expect(first.range).toEqual({ start: 0, end: data.length - 1 });
    expect(resumed.range!.start).toBeGreaterThan(0);
    expect(resumed.range!.start).toBeLessThanOrEqual(first.bytes);
    expect(resumed.range!.end).toBe(data.length - 1);
    await unmount(m.path);
    const c = await finalCounters(m.logFile);
    expect(c.gcs_stalls).toBe(1);
    expect(c.gcs_resumed_reads).toBe(1);
    const log = await fsp.readFile(m.logFile, 'utf8');
    expect(log).toMatch(/stalled\.bin.*GCS response stalled|GCS response stalled.*stalled\.bin/);
    tb.emulator.setKnobs({ bodyStallRate: 0 });
  }, 120_000);

  it('fails a read with EIO within --max-retry-duration against a silent endpoint, and reads again once it answers', async () => {
    await writeObjects(tb.root, tb.bucket, { 'silent.txt': 'answered at last' });
    const m = await mount({ tb, args: ['--max-retry-duration', '4s'] });
    expect((await run('stat', [join(m.path, 'silent.txt')])).code).toBe(0); // the lookup is cached now
    tb.emulator.setKnobs({ stall: true });
    const t0 = performance.now();
    const r = await run('cat', [join(m.path, 'silent.txt')], { timeoutMs: 120_000 });
    const seconds = (performance.now() - t0) / 1000;
    tb.emulator.setKnobs({ stall: false });
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/Input\/output error/);
    // 4 s of retrying (attempts cut by the stall timeout, then the bound), plus a loaded machine's slack.
    expect(seconds).toBeGreaterThan(3);
    expect(seconds).toBeLessThan(30);
    const line = (await fsp.readFile(m.logFile, 'utf8')).split('\n').find((l) => l.includes('max-retry-duration') && l.includes('silent.txt'));
    expect(line).toBeDefined();
    expect(JSON.parse(line!)).toMatchObject({ level: 50 });

    const again = await run('cat', [join(m.path, 'silent.txt')], { timeoutMs: 60_000 });
    expect(again.code, again.stderr).toBe(0);
    expect(again.stdout).toBe('answered at last');
    await unmount(m.path);
    const c = await finalCounters(m.logFile);
    expect(c.gcs_retry_deadline_exceeded).toBeGreaterThanOrEqual(1);
  }, 120_000);
});
