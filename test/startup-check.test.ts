import { spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, daemonEnv, eventually, GCSMOUNT, isMounted, mount, run, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';

/**
 * The bucket check at start: a throttled bucket slows a start, never fails it (within
 * --startup-check-timeout); what retrying cannot change fails at once.
 */
describe('the start-up bucket check', () => {
  let tb: TestBucket;

  beforeAll(async () => {
    tb = await startBucket('startup');
    await writeObjects(tb.root, tb.bucket, { 'a.txt': 'a' });
  });

  afterAll(async () => {
    tb?.emulator.setKnobs({ rate429: 0 });
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('keeps retrying a bucket that answers only 429 for a while, and mounts once it answers', async () => {
    tb.emulator.resetStats();
    tb.emulator.setKnobs({ rate429: 1 });
    // Every request is throttled for 3 s: more tries than the old check's three.
    const lifted = setTimeout(() => tb.emulator.setKnobs({ rate429: 0 }), 3_000);
    try {
      const t0 = performance.now();
      const m = await mount({ tb, args: ['--startup-check-timeout', '30s'] });
      expect(performance.now() - t0).toBeGreaterThan(2_500);
      const s = tb.emulator.stats();
      expect(s.injected['429']).toBeGreaterThan(3);
      expect((await run('cat', [`${m.path}/a.txt`])).stdout).toBe('a');
      await unmount(m.path);
    } finally {
      clearTimeout(lifted);
      tb.emulator.setKnobs({ rate429: 0 });
    }
  });

  it('gives up at --startup-check-timeout with exit 4 and one line naming the flag', async () => {
    tb.emulator.setKnobs({ rate429: 1 });
    try {
      const t0 = performance.now();
      const r = await run(GCSMOUNT, [tb.bucket, await tempDir('mnt'), '--custom-endpoint', tb.emulator.url, '--startup-check-timeout', '2s'], { env: daemonEnv() });
      const secs = (performance.now() - t0) / 1000;
      expect(r.code, r.stderr).toBe(4);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toMatch(/^gcsmount: cannot reach bucket .*--startup-check-timeout 2000 ms/);
      expect(secs).toBeGreaterThan(1);
      expect(secs).toBeLessThan(15);
    } finally {
      tb.emulator.setKnobs({ rate429: 0 });
    }
  });

  it('stops at once on SIGTERM while the bucket check retries (systemctl stop of a starting unit), exit 0', async () => {
    tb.emulator.resetStats();
    tb.emulator.setKnobs({ rate429: 1 });
    const mnt = await tempDir('mnt');
    const daemon = spawn(GCSMOUNT, [tb.bucket, mnt, '--custom-endpoint', tb.emulator.url, '--startup-check-timeout', '60s', '--foreground'], { env: daemonEnv(), stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    daemon.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((r) => daemon.once('exit', (code) => r(code)));
    try {
      await eventually(async () => tb.emulator.stats().injected['429'] >= 2);
      const t0 = performance.now();
      daemon.kill('SIGTERM');
      // Before: the signal waited for the check, which 429s kept going for its 60 s.
      const code = await Promise.race([exited, new Promise<'waiting'>((r) => setTimeout(() => r('waiting'), 15_000))]);
      expect(code).toBe(0);
      expect((performance.now() - t0) / 1000).toBeLessThan(5);
      expect(stderr).toMatch(/stopped by a signal while starting, before mounting/);
      expect(await isMounted(mnt)).toBe(false);
    } finally {
      daemon.kill('SIGKILL');
      tb.emulator.setKnobs({ rate429: 0 });
    }
  });

  it('fails at once on a bucket that does not exist', async () => {
    tb.emulator.resetStats();
    const t0 = performance.now();
    const r = await run(GCSMOUNT, ['no-such-bucket', await tempDir('mnt'), '--custom-endpoint', tb.emulator.url], { env: daemonEnv() });
    expect(r.code, r.stderr).toBe(4);
    expect(r.stderr).toMatch(/^gcsmount: bucket no-such-bucket does not exist/);
    expect(tb.emulator.stats().requests.total).toBe(1);
    expect(performance.now() - t0).toBeLessThan(10_000);
  });
});
