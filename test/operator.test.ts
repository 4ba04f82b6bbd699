import { promises as fsp } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, daemonEnv, GCSMOUNT, isMounted, mount, run, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';

// What an operator meets on day one: a port already taken, a mountpoint reached through a symlink, `df`.

describe('operators\' day one', () => {
  let tb: TestBucket;

  beforeAll(async () => {
    tb = await startBucket('ops');
    await writeObjects(tb.root, tb.bucket, { 'data/a.txt': 'alpha', 'data/b.bin': Buffer.alloc(3 * 1024 * 1024, 7) });
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  const gcsmount = (args: string[], env: NodeJS.ProcessEnv = daemonEnv()) => run(GCSMOUNT, args, { env });

  it('refuses a --prometheus-port that is taken with exit 2 and one line, and leaves no mount behind', async () => {
    const blocker: Server = createServer();
    await new Promise<void>((r) => blocker.listen(0, '127.0.0.1', r));
    const port = (blocker.address() as { port: number }).port;
    const dir = await tempDir('port');
    const runtime = await tempDir('runtime');
    const logFile = join(await tempDir('log'), 'gcsmount.log');
    try {
      for (const extra of [[], ['--foreground']]) {
        const args = [tb.bucket, dir, '--custom-endpoint', tb.emulator.url, '--prometheus-port', String(port), '--log-file', logFile, ...extra];
        const r = await gcsmount(args, daemonEnv({ GCSMOUNT_RUNTIME_DIR: runtime }));
        const lines = r.stderr.trim().split('\n');
        expect(r.code, r.stderr).toBe(2);
        expect(lines, r.stderr).toHaveLength(1);
        expect(lines[0]).toMatch(new RegExp(`^gcsmount: --prometheus-port ${port} is already in use`));
        expect(await isMounted(dir)).toBe(false);
        const ls = await run('ls', [dir]);
        expect(ls.code, ls.stderr).toBe(0);
        // The control socket opened before the failure is gone again.
        expect(await fsp.readdir(runtime)).toEqual([]);
      }
    } finally {
      await new Promise<void>((r) => blocker.close(() => r()));
    }
  });

  it('answers wait, stats, warm and unmount through a symlink to the mountpoint and through its real path', async () => {
    const real = await tempDir('real');
    const link = join(await tempDir('links'), 'data-link');
    await fsp.symlink(real, link);
    const cache = join(await tempDir('cache'), 'c');
    try {
      for (const [mountVia, unmountVia] of [[link, real], [real, link]] as const) {
        await mount({ tb, mountPoint: mountVia, args: ['--cache-dir', cache] });
        expect(await isMounted(real)).toBe(true);
        for (const via of [link, real]) {
          const wait = await gcsmount(['wait', via, '--timeout', '20']);
          expect(wait.code, `wait ${via}: ${wait.stderr}`).toBe(0);
          const stats = await gcsmount(['stats', via, '--json']);
          expect(stats.code, `stats ${via}: ${stats.stderr}`).toBe(0);
          expect(JSON.parse(stats.stdout).mountPoint).toBe(real);
          const warm = await gcsmount(['warm', via, join(via, 'data')]);
          expect(warm.code, `warm ${via}: ${warm.stderr}`).toBe(0);
          expect(warm.stdout).toMatch(/^\/data: 2 files/);
        }
        const un = await gcsmount(['unmount', unmountVia]);
        expect(un.code, `unmount ${unmountVia}: ${un.stderr}`).toBe(0);
        expect(await isMounted(real)).toBe(false);
      }
    } finally {
      await unmount(real);
    }
  });

  it('shows a large size, free space and inode count in df and stat -f, as gcsfuse does', async () => {
    const m = await mount({ tb });
    const st = await run('stat', ['-f', '-c', '%S %b %f %a %c %d %l', m.path]);
    expect(st.code, st.stderr).toBe(0);
    const [frsize, blocks, free, avail, files, ffree, namemax] = st.stdout.trim().split(' ').map(Number) as number[];
    expect(frsize! * blocks!).toBe(2 ** 50); // 1 PiB, gcsfuse's figure
    expect(free).toBe(blocks);
    expect(avail).toBe(blocks);
    expect(files).toBeGreaterThanOrEqual(2 ** 30);
    expect(ffree).toBe(files);
    expect(namemax).toBe(255);
    const df = await run('df', ['-B1', '--output=size,avail', m.path]);
    expect(df.code, df.stderr).toBe(0);
    const [size, available] = df.stdout.trim().split('\n')[1]!.trim().split(/\s+/).map(Number) as number[];
    expect(size).toBe(2 ** 50);
    expect(available).toBe(2 ** 50);
    await unmount(m.path);
  });
});
