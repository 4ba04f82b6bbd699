import { promises as fsp } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { translateMountArgs } from '../src/cli/mount-helper.js';
import { jsonLineToText } from '../src/observe/log-text.js';
import { cleanupAll, daemonEnv, eventually, GCSMOUNT, isMounted, mount, REPO, run, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';

// What an operator meets on day one: a port already taken, a mountpoint reached through a symlink, `df`,
// and fstab / `mount -t gcsmount`.

describe('mount.gcsmount option translation', () => {
  const t = (...argv: string[]) => translateMountArgs(argv);

  it('turns an fstab option list into gcsmount flags, underscores as dashes', () => {
    const call = t('my-bucket', '/mnt/data', '-o', 'rw,noexec,nosuid,nodev,user,_netdev,nofail,noauto,defaults,x-systemd.automount,allow_other,implicit_dirs,file_mode=644,max_conns_per_host=4,debug_fuse,enable_nonexistent_type_cache=false');
    expect(call.args).toEqual([
      '-o', 'rw', '-o', 'noexec', '-o', 'nosuid', '-o', 'nodev', '-o', 'allow_other',
      '--implicit-dirs', '--file-mode', '644', '--max-conns-per-host', '4', '--debug_fuse', '--enable-nonexistent-type-cache=false',
      'my-bucket', '/mnt/data',
    ]);
    expect(call).toMatchObject({ bucket: 'my-bucket', mountPoint: '/mnt/data', fake: false, verbose: false, skipped: [] });
  });

  it('takes mount(8)\'s flags in any order, -o repeated or glued', () => {
    const call = t('-sfnv', '-o', 'ro', 'b', '-ocache_dir=/var/cache/g', '/m', '-t', 'gcsmount');
    expect(call.args).toEqual(['-o', 'ro', '--cache-dir', '/var/cache/g', 'b', '/m']);
    expect(call).toMatchObject({ fake: true, verbose: true });
  });

  it('refuses an unknown option, a value-less string option and a bad invocation with exit 2', () => {
    const cases: [string[], RegExp][] = [
      [['b', '/m', '-o', 'ro,no_such_thing=1'], /unknown mount option no_such_thing=1/],
      [['b', '/m', '-o', 'file_mode'], /file_mode needs a value/],
      [['b', '/m', '-o', 'bucket=other'], /unknown mount option bucket=other/],
      [['b'], /usage: mount.gcsmount BUCKET MOUNTPOINT/],
      [['b', '/m', '-x'], /unknown argument -x/],
    ];
    for (const [argv, message] of cases) {
      expect(() => t(...argv), argv.join(' ')).toThrow(message);
      try {
        t(...argv);
      } catch (err) {
        expect((err as { exitCode: number }).exitCode).toBe(2);
      }
    }
  });

  it("passes on gcsfuse's options that do nothing here (gcsmount names each in a warning), as gcsmount itself takes them", () => {
    const call = t('b', '/m', '-o', 'machine_type=a3-highgpu-8g,disable_autoconfig,enable_hns=false');
    expect(call.args).toEqual(['--machine-type', 'a3-highgpu-8g', '--disable-autoconfig', '--enable-hns=false', 'b', '/m']);
  });

  it('takes a device mount(8) turned into a path (a folder of the bucket\'s name where it ran) as the bucket, as gcsfuse does', () => {
    expect(t('/home/me/era5', '/mnt/era5', '-o', 'ro')).toMatchObject({ bucket: 'era5', args: ['-o', 'ro', 'era5', '/mnt/era5'] });
  });

  it('leaves out unknown options under -s (sloppy) and says which', () => {
    const call = t('b', '/m', '-s', '-o', 'ro,mystery');
    expect(call.args).toEqual(['-o', 'ro', 'b', '/m']);
    expect(call.skipped).toEqual(['mystery']);
  });
});

describe('--log-format text', () => {
  it('writes key=value lines, quoting what needs it and escaping control characters', () => {
    const line = `${JSON.stringify({ level: 40, time: 0, pid: 7, msg: 'a "b"', path: '/ab\x1b[2J', word: 'plain', n: 3, c1: 'x\u0085y', sep: 'a\u2028b' })}\n`;
    expect(jsonLineToText(line)).toBe(
      'time="1970-01-01T00:00:00.000Z" severity=WARNING message="a \\"b\\"" pid=7 path="/ab\\u001b[2J" word=plain n=3 c1="x\\u0085y" sep="a\\u2028b"\n',
    );
    // Not a record: passed on as it is.
    for (const other of ['null\n', 'not json\n']) expect(jsonLineToText(other)).toBe(other);
  });
});

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
        expect(await fsp.readdir(join(runtime, 'gcsmount'))).toEqual([]);
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

  it('writes text log lines with --log-format text, and a daemonising mount prints its ignored flags on stderr', async () => {
    const dir = await tempDir('textlog');
    const logFile = join(await tempDir('log'), 'gcsmount.log');
    const args = [tb.bucket, dir, '--custom-endpoint', tb.emulator.url, '--log-file', logFile, '--log-format', 'text', '--client-protocol', 'grpc'];
    try {
      const r = await gcsmount(args);
      expect(r.code, r.stderr).toBe(0);
      // The daemon's own log goes to the file only: the notice must reach the person who typed the flag.
      expect(r.stderr).toMatch(/^gcsmount: --client-protocol is accepted for gcsfuse compatibility and ignored/);
      expect((await run('cat', [join(dir, 'data/a.txt')])).stdout).toBe('alpha');
      const un = await gcsmount(['unmount', dir]);
      expect(un.code, un.stderr).toBe(0);
      const lines = (await fsp.readFile(logFile, 'utf8')).trim().split('\n');
      expect(lines.length).toBeGreaterThan(1);
      for (const line of lines) expect(line).toMatch(/^time="\d{4}-\d\d-\d\dT[\d:.]+Z" severity=(TRACE|DEBUG|INFO|WARNING|ERROR) message="/);
      expect(lines.find((l) => l.includes('client-protocol'))).toMatch(/severity=WARNING .* pid=\d+/);
    } finally {
      await unmount(dir);
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

  it('mounts with mount -t gcsmount and an fstab line through mount.gcsmount, and umount stops the daemon', async (ctx) => {
    const helper = '/sbin/mount.gcsmount';
    const ours = join(REPO, 'bin/mount.gcsmount');
    const existing = await fsp.readlink(helper).catch((err: NodeJS.ErrnoException) => (err.code === 'ENOENT' ? null : 'not a symlink'));
    if (existing !== null && existing !== ours) ctx.skip(); // another installation's helper: not ours to replace
    const installed = existing === null;
    if (installed) await fsp.symlink(ours, helper);
    const dir = await tempDir('mnt-t');
    try {
      const env = daemonEnv();
      const viaCommandLine = () =>
        run('mount', ['-t', 'gcsmount', '-o', `ro,allow_other,implicit_dirs,file_mode=644,noexec,custom_endpoint=${tb.emulator.url}`, tb.bucket, dir], { env });
      const fstab = join(await tempDir('fstab'), 'fstab');
      await fsp.writeFile(fstab, `${tb.bucket} ${dir} gcsmount ro,_netdev,nofail,noauto,x-systemd.automount,allow_other,implicit_dirs,file_mode=600,custom_endpoint=${tb.emulator.url} 0 0\n`);
      const viaFstab = () => run('mount', ['-T', fstab, dir], { env });
      for (const [how, mountIt, mode] of [['mount -t', viaCommandLine, '644'], ['fstab', viaFstab, '600']] as const) {
        const r = await mountIt();
        expect(r.code, `${how}: ${r.stderr}`).toBe(0);
        const line = (await fsp.readFile('/proc/mounts', 'utf8')).split('\n').find((l) => l.split(' ')[1] === dir);
        expect(line, how).toMatch(/ fuse\.gcsmount ro,/);
        expect(line).toMatch(/allow_other/);
        if (how === 'mount -t') expect(line).toMatch(/noexec/);
        expect((await run('cat', [join(dir, 'data/a.txt')])).stdout).toBe('alpha');
        expect((await run('stat', ['-c', '%a', join(dir, 'data/a.txt')])).stdout.trim()).toBe(mode);
        const stats = await run(GCSMOUNT, ['stats', dir, '--json'], { env });
        const pid = (JSON.parse(stats.stdout) as { pid: number }).pid;
        const um = await run('umount', [dir]);
        expect(um.code, um.stderr).toBe(0);
        await eventually(async () => {
          try {
            process.kill(pid, 0);
            return false;
          } catch {
            return true;
          }
        });
        expect(await isMounted(dir)).toBe(false);
      }
      const bad = await run('mount', ['-t', 'gcsmount', '-o', 'ro,no_such_option', tb.bucket, dir], { env });
      expect(bad.code).toBe(2);
      expect(bad.stderr.trim().split('\n')).toEqual(['mount.gcsmount: unknown mount option no_such_option: neither a mount option nor a gcsmount flag (see gcsmount --help)']);
      expect(await isMounted(dir)).toBe(false);
    } finally {
      await unmount(dir);
      if (installed) await fsp.rm(helper, { force: true });
    }
  });
});
