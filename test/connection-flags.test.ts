import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, daemonEnv, GCSMOUNT, mount, mountStats, run, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';

/**
 * A Requester Pays bucket answers 400 to every request that names no project to bill: gcsfuse's
 * --billing-project names it, and gcsmount sends it on each request (reads, listings, writes, uploads).
 */
describe('--billing-project on a Requester Pays bucket', () => {
  let tb: TestBucket;
  const big = randomBytes(3 * 2 ** 20 + 123);

  beforeAll(async () => {
    tb = await startBucket('payers', { requesterPays: ['payers'] });
    await writeObjects(tb.root, tb.bucket, { 'in/a.txt': 'billed bytes', 'in/big.bin': big });
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('an --app-name HTTP cannot carry is exit 2, one line, before any request', async () => {
    tb.emulator.resetStats();
    const r = await run(GCSMOUNT, [tb.bucket, await tempDir('mnt'), '--custom-endpoint', tb.emulator.url, '--billing-project', 'payer', '--app-name', 'データ'], { env: daemonEnv() });
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/--app-name .*printable ASCII/);
    expect(tb.emulator.requestLog()).toEqual([]);
  });

  it('without it the mount fails at once: exit 4, one line that names the flag', async () => {
    const r = await run(GCSMOUNT, [tb.bucket, await tempDir('mnt'), '--custom-endpoint', tb.emulator.url], { env: daemonEnv() });
    expect(r.code, r.stderr).toBe(4);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/requester pays.*--billing-project/i);
  });

  it('with it every request bills the project: reads, listings, a staged and a streamed write, a rename, a delete (and names --app-name)', async () => {
    tb.emulator.resetStats();
    const m = await mount({ tb, args: ['--billing-project', 'payer', '--cache-dir', await tempDir('cache'), '--app-name', 'era5-loader'] });
    try {
      const local = await tempDir('local');
      await fsp.writeFile(join(local, 'big.bin'), big);
      expect((await run('ls', [join(m.path, 'in')])).stdout.split('\n').filter(Boolean)).toEqual(['a.txt', 'big.bin']);
      expect((await run('cat', [join(m.path, 'in/a.txt')])).stdout).toBe('billed bytes');
      expect((await run('cmp', [join(m.path, 'in/big.bin'), join(local, 'big.bin')])).code).toBe(0);
      const script = [
        `echo small > '${m.path}/out/small.txt'`,
        `cp '${local}/big.bin' '${m.path}/out/big.bin'`,
        `mv '${m.path}/out/small.txt' '${m.path}/out/moved.txt'`,
        `echo more >> '${m.path}/in/a.txt'`,
        `rm '${m.path}/in/big.bin'`,
      ].join(' && ');
      const mk = await run('mkdir', [join(m.path, 'out')]);
      expect(mk.code, mk.stderr).toBe(0);
      const w = await run('sh', ['-c', script]);
      expect(w.code, w.stderr).toBe(0);
    } finally {
      await unmount(m.path);
    }
    // What the bucket holds now, read by the test (the emulator's files), not through the mount.
    expect(await fsp.readFile(join(tb.root, tb.bucket, 'out/moved.txt'), 'utf8')).toBe('small\n');
    expect((await fsp.readFile(join(tb.root, tb.bucket, 'out/big.bin'))).equals(big)).toBe(true);
    expect(await fsp.readFile(join(tb.root, tb.bucket, 'in/a.txt'), 'utf8')).toBe('billed bytesmore\n');
    await expect(fsp.stat(join(tb.root, tb.bucket, 'in/big.bin'))).rejects.toMatchObject({ code: 'ENOENT' });
    const log = tb.emulator.requestLog();
    const kinds = new Set(log.map((e) => e.kind));
    for (const k of ['list', 'media', 'upload', 'delete']) expect(kinds, k).toContain(k);
    // Every request named the project, a resumable session's own ones included; none was refused.
    expect(log.filter((e) => e.userProject !== 'payer').map((e) => `${e.method} ${e.kind} ${e.object}`)).toEqual([]);
    expect(log.filter((e) => e.status >= 400 && e.status !== 404).map((e) => `${e.method} ${e.kind} ${e.object} ${e.status}`)).toEqual([]);
    // gcsfuse's --app-name goes after gcsmount's own name in every request's User-Agent.
    const { version } = JSON.parse(await fsp.readFile(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
    expect([...new Set(log.map((e) => e.userAgent))]).toEqual([`gcsmount/${version} era5-loader`]);
  });
});

/** gcsfuse's --limit-bytes-per-sec: all reads from GCS together, readahead and prefetch included. */
describe('--limit-bytes-per-sec', () => {
  let tb: TestBucket;
  const MiB = 2 ** 20;
  const files: Record<string, Buffer> = { 'a.bin': randomBytes(14 * MiB), 'b.bin': randomBytes(10 * MiB) };

  beforeAll(async () => {
    tb = await startBucket('throttled');
    await writeObjects(tb.root, tb.bucket, files);
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('reads 24 MiB at 8 MiB/s in no less than 1.6 s (8 MiB of burst: the largest read), each byte once, and stats show the waits', async () => {
    const m = await mount({ tb, args: ['--limit-bytes-per-sec', String(8 * MiB), '--cache-dir', await tempDir('cache')] });
    try {
      const local = await tempDir('local');
      for (const [name, buf] of Object.entries(files)) await fsp.writeFile(join(local, name), buf);
      tb.emulator.resetStats();
      const t0 = performance.now();
      // Two readers at once: the limit is the daemon's, not each reader's.
      const r = await run('sh', ['-c', `cmp '${m.path}/a.bin' '${local}/a.bin' & cmp '${m.path}/b.bin' '${local}/b.bin' & wait %1 && wait %2`]);
      const seconds = (performance.now() - t0) / 1000;
      expect(r.code, r.stderr).toBe(0);
      // 24 MiB - 8 MiB of burst at 8 MiB/s: 2 s; a little less for the clock's grain.
      expect(seconds).toBeGreaterThan(1.6);
      const media = tb.emulator.requestLog().filter((e) => e.kind === 'media');
      expect(media.reduce((n, e) => n + (e.range ? e.range.end - e.range.start + 1 : 0), 0)).toBe(24 * MiB);
      const st = await mountStats(m.path);
      expect(st.counters.gcs_bandwidth_waits).toBeGreaterThan(0);
      expect(st.gauges.gcs_bandwidth_limit_bytes).toBe(8 * MiB);
      const text = await run(GCSMOUNT, ['stats', m.path]);
      expect(text.stdout).toMatch(/bandwidth +8(\.0)? MiB\/s +reads waited [1-9]/);
    } finally {
      await unmount(m.path);
    }
  });
});
