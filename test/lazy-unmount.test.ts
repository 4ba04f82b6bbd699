import { spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, daemonEnv, eventually, GCSMOUNT, isMounted, mount, run, startBucket, tempDir, writeObjects, type Mounted, type TestBucket } from './helpers/harness.js';
import { bytes, sha256 } from './helpers/objects.js';

const KIB = 1024;

/**
 * A lazy unmount, or SIGTERM while files are open, detaches the mount; the files still open are served
 * until they close (for SIGTERM, within --unmount-grace-period), and the daemon stops only then.
 */
describe('unmounting a busy mount', () => {
  let tb: TestBucket;
  // Larger than a block (4 MiB): the reads after the detach need the daemon's disk cache and index.
  const big = bytes(4 * 1024 * KIB + 5 * KIB, 11);

  beforeAll(async () => {
    tb = await startBucket('lazy');
    await writeObjects(tb.root, tb.bucket, { 'big.bin': big, 'small.txt': 'small' });
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  const exitOf = (m: Mounted) => new Promise<number | null>((r) => (m.daemon!.exitCode !== null ? r(m.daemon!.exitCode) : m.daemon!.on('exit', (code) => r(code))));

  /**
   * Another process reads big.bin with O_DIRECT (each read reaches the daemon, none is answered from the
   * page cache): its first 64 KiB, then, once released, the rest; it prints the SHA-256 of the whole.
   */
  const pausedReader = (path: string) => {
    const script = [
      'import hashlib, mmap, os, sys',
      'fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)',
      'buf = mmap.mmap(-1, 65536)',
      'h = hashlib.sha256()',
      'n = os.preadv(fd, [buf], 0); h.update(buf[:n]); off = n',
      'print("started", flush=True)',
      'sys.stdin.readline()',
      'while True:',
      '    n = os.preadv(fd, [buf], off)',
      '    if n == 0: break',
      '    h.update(buf[:n]); off += n',
      'print(h.hexdigest(), flush=True)',
    ].join('\n');
    const child = spawn('/usr/bin/python3', ['-c', script, path], { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const started = new Promise<void>((resolve) =>
      child.stdout!.on('data', (d: Buffer) => {
        stdout += d.toString();
        if (stdout.startsWith('started')) resolve();
      }),
    );
    const done = new Promise<{ code: number | null; sum: string; stderr: string }>((resolve) =>
      child.on('exit', (code) => resolve({ code, sum: stdout.replace(/^started\n/, '').trim(), stderr })),
    );
    return { started, release: () => child.stdin!.end('go\n'), done, kill: () => child.kill('SIGKILL') };
  };

  const noClosedIndexErrors = async (m: Mounted) => {
    const log = await fsp.readFile(m.logFile, 'utf8');
    expect(log).not.toContain('database connection is not open');
  };

  it('serves a file still open after umount -l until it is closed, then stops', async () => {
    const m = await mount({ tb, foreground: true, args: ['--cache-dir', await tempDir('cache')] });
    const exited = exitOf(m);
    const reader = pausedReader(join(m.path, 'big.bin'));
    try {
      await reader.started;
      expect((await run('umount', ['-l', m.path])).code).toBe(0);
      expect(await isMounted(m.path)).toBe(false);
      // Past the old watcher's second: the daemon still serves the reader, which reads on.
      await new Promise((r) => setTimeout(r, 2_000));
      expect(m.daemon!.exitCode).toBe(null);
      reader.release();
      const r = await reader.done;
      expect(r.stderr).toBe('');
      expect(r.sum).toBe(sha256(big));
    } finally {
      reader.kill();
    }
    // The last reference is gone: the kernel ends the session and the daemon stops cleanly.
    expect(await exited).toBe(0);
    await noClosedIndexErrors(m);
    expect(await fsp.readFile(m.logFile, 'utf8')).toContain('mount detached (lazy unmount)');
  }, 60_000);

  it('a daemon detached by umount -l leaves the daemon mounted on its path since alone when it stops (its mount and control socket)', async () => {
    const a = await mount({ tb, foreground: true, args: ['--cache-dir', await tempDir('cache')] });
    const aExited = exitOf(a);
    const reader = pausedReader(join(a.path, 'big.bin'));
    let b: Mounted | undefined;
    try {
      await reader.started;
      expect((await run('umount', ['-l', a.path])).code).toBe(0);
      b = await mount({ tb, foreground: true, mountPoint: a.path });
      reader.release();
      expect((await reader.done).sum).toBe(sha256(big));
    } finally {
      reader.kill();
    }
    // The first daemon's session ended with its reader: it stops, and once took the path for its own.
    expect(await aExited).toBe(0);
    if (!b) throw new Error('the second daemon did not mount');
    expect(await isMounted(b.path)).toBe(true);
    expect(b.daemon!.exitCode).toBe(null);
    expect((await run('cat', [join(b.path, 'small.txt')])).stdout).toBe('small');
    const stats = await run(GCSMOUNT, ['stats', b.path, '--json']);
    expect(stats.code, stats.stderr).toBe(0);
    expect(JSON.parse(stats.stdout).pid).toBe(b.daemon!.pid);
  }, 60_000);

  it('two starts on one mount point at once: one mounts, the other is refused (exit 3), never one mount over another', async () => {
    const path = await tempDir('mnt');
    const args = [tb.bucket, path, '--custom-endpoint', tb.emulator.url];
    const [one, two] = await Promise.all([run(GCSMOUNT, args, { env: daemonEnv() }), run(GCSMOUNT, args, { env: daemonEnv() })]);
    try {
      expect([one.code, two.code].sort(), `${one.stderr} / ${two.stderr}`).toEqual([0, 3]);
      const refused = one.code === 3 ? one : two;
      expect(refused.stderr.trim().split('\n')).toHaveLength(1);
      expect(refused.stderr).toMatch(/already mounted|being mounted by another gcsmount/);
      const entries = (await fsp.readFile('/proc/self/mountinfo', 'utf8')).split('\n').filter((l) => l.split(' ')[4] === path);
      expect(entries).toHaveLength(1);
      expect((await run('cat', [join(path, 'small.txt')])).stdout).toBe('small');
    } finally {
      await run(GCSMOUNT, ['unmount', path]);
    }
  }, 60_000);

  it('on SIGTERM with a file open, detaches, serves it until it is closed, then stops', async () => {
    const m = await mount({ tb, foreground: true, args: ['--cache-dir', await tempDir('cache')] });
    const exited = exitOf(m);
    const reader = pausedReader(join(m.path, 'big.bin'));
    try {
      await reader.started;
      m.daemon!.kill('SIGTERM');
      await eventually(async () => !(await isMounted(m.path)));
      await new Promise((r) => setTimeout(r, 1_500));
      expect(m.daemon!.exitCode).toBe(null);
      reader.release();
      const r = await reader.done;
      expect(r.stderr).toBe('');
      expect(r.sum).toBe(sha256(big));
    } finally {
      reader.kill();
    }
    expect(await exited).toBe(0);
    await noClosedIndexErrors(m);
  }, 60_000);

  it('on SIGTERM stops after --unmount-grace-period even while a file stays open', async () => {
    const m = await mount({ tb, foreground: true, args: ['--unmount-grace-period', '2s'] });
    const exited = exitOf(m);
    const holder = spawn('sh', ['-c', 'exec 3< "$1" && echo open && exec sleep 600', 'sh', join(m.path, 'small.txt')], { stdio: ['ignore', 'pipe', 'ignore'] });
    try {
      await new Promise<void>((r) => holder.stdout!.once('data', () => r()));
      const t0 = performance.now();
      m.daemon!.kill('SIGTERM');
      expect(await exited).toBe(0);
      const secs = (performance.now() - t0) / 1000;
      expect(secs).toBeGreaterThan(1.5);
      expect(secs).toBeLessThan(15);
      expect(await fsp.readFile(m.logFile, 'utf8')).toContain('files still open after --unmount-grace-period');
    } finally {
      holder.kill('SIGKILL');
    }
  }, 60_000);
});
