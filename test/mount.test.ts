import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, daemonEnv, eventually, GCSMOUNT, isMounted, mount, run, sha256Of, startBucket, tempDir, unmount, writeObjects, type Mounted, type TestBucket } from './helpers/harness.js';
import { bytes, objectMeta, sha256, upload } from './helpers/objects.js';

const MIB = 1024 * 1024;

describe('a read-only mount of a bucket (-o ro)', () => {
  let tb: TestBucket;
  let m: Mounted;
  const sizes = { 'empty.bin': 0, 'one.bin': 1, 'mib-minus.bin': MIB - 1, 'mib-plus.bin': MIB + 1, 'big.bin': 100 * MIB };
  const content: Record<string, Buffer> = {};

  beforeAll(async () => {
    tb = await startBucket('data');
    let seed = 1;
    for (const [name, size] of Object.entries(sizes)) content[`sizes/${name}`] = bytes(size, seed++);
    await writeObjects(tb.root, tb.bucket, {
      ...content,
      'tree/a.txt': 'a',
      'tree/implicit/deep/x.txt': 'xx',
      'tree/implicit/y.txt': 'yyy',
    });
    // Placeholder objects and names a file system cannot hold go in through the API.
    await upload(tb, 'tree/placeholder/');
    await upload(tb, 'tree/placeholder/p.txt', 'pp');
    await upload(tb, 'tree/empty-dir/');
    await upload(tb, 'tree/odd//double');
    await upload(tb, 'tree/conflict', 'file that is also a prefix');
    await upload(tb, 'tree/conflict/inner.txt', 'i');
    await upload(tb, `tree/${'l'.repeat(256)}`, 'too long');
    await upload(tb, 'tree/dots/../escape', 'dot dot');
    const many: Record<string, string> = {};
    for (let i = 0; i < 2500; i++) many[`many/f${String(i).padStart(5, '0')}`] = '';
    await writeObjects(tb.root, tb.bucket, many);
    m = await mount({ tb, args: ['-o', 'ro'] });
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('returns every byte of files of 0 B, 1 B, 1 MiB - 1, 1 MiB + 1 and 100 MiB', async () => {
    tb.emulator.resetStats();
    for (const [name, buf] of Object.entries(content)) {
      expect(await sha256Of(join(m.path, name)), name).toBe(sha256(buf));
    }
    // Whole 4 MiB blocks, not the kernel's 128 KiB reads: 100 MiB is 25 blocks, plus one per small file.
    const media = tb.emulator.stats().requests.media;
    expect(media).toBeGreaterThanOrEqual(25 + 3);
    expect(media).toBeLessThanOrEqual(25 + 3 + 2);
    // No --cache-dir: the operator's table says the reads of cached blocks are not the addon's.
    expect((await run(GCSMOUNT, ['stats', m.path])).stdout).toMatch(/native reads  off \(no --cache-dir/);
  });

  it('lists a nested tree of implicit and placeholder directories, hiding names that cannot be paths', async () => {
    const r = await run('find', [join(m.path, 'tree'), '-printf', '%y %P\n']);
    expect(r.code).toBe(0);
    const listed = r.stdout.trim().split('\n').filter((l) => l.trim() !== 'd').sort();
    expect(listed).toEqual(
      [
        'f a.txt',
        'd conflict',
        'f conflict/inner.txt',
        'd dots',
        'd empty-dir',
        'd implicit',
        'd implicit/deep',
        'f implicit/deep/x.txt',
        'f implicit/y.txt',
        'd odd',
        'd placeholder',
        'f placeholder/p.txt',
      ].sort(),
    );
    const log = await fsp.readFile(m.logFile, 'utf8');
    expect(log).toContain('tree/conflict');
    expect(log).toContain('tree/odd//'); // the hidden prefix that holds odd//double
  });

  it('shows sizes and modification times as GCS reports them', async () => {
    for (const name of ['sizes/mib-plus.bin', 'tree/implicit/y.txt', 'tree/placeholder/p.txt']) {
      const meta = await objectMeta(tb, name);
      const r = await run('stat', ['-c', '%s %Y %F', join(m.path, name)]);
      expect(r.stdout.trim()).toBe(`${meta.size} ${Math.floor(Date.parse(meta.updated) / 1000)} regular file`);
    }
  });

  it('answers ENOENT for a missing path and EROFS for every write', async () => {
    const missing = await run('stat', [join(m.path, 'tree/nope.txt')]);
    expect(missing.code).not.toBe(0);
    expect(missing.stderr).toContain('No such file or directory');
    const attempts: [string, string[]][] = [
      ['sh', ['-c', `echo hi > ${join(m.path, 'tree/new.txt')}`]],
      ['sh', ['-c', `echo hi >> ${join(m.path, 'tree/a.txt')}`]],
      ['mkdir', [join(m.path, 'tree/newdir')]],
      ['rm', ['-f', join(m.path, 'tree/a.txt')]],
      ['mv', [join(m.path, 'tree/a.txt'), join(m.path, 'tree/b.txt')]],
      ['touch', [join(m.path, 'tree/a.txt')]],
    ];
    for (const [cmd, args] of attempts) {
      const r = await run(cmd, args);
      expect(r.code, `${cmd} ${args.join(' ')}`).not.toBe(0);
      expect(r.stderr, `${cmd} ${args.join(' ')}`).toContain('Read-only file system');
    }
    expect(await sha256Of(join(m.path, 'tree/a.txt'))).toBe(sha256(Buffer.from('a')));
  });

  it('lists a directory of 2,500 objects completely when GCS pages at 1,000', async () => {
    tb.emulator.resetStats();
    const r = await run('ls', ['-1', join(m.path, 'many')]);
    const expected = Array.from({ length: 2500 }, (_, i) => `f${String(i).padStart(5, '0')}`);
    expect(r.stdout.trim().split('\n')).toEqual(expected);
    // Pages of 1,000: three list requests for the listing (the lookup of 'many' itself may add one).
    expect(tb.emulator.stats().requests.list).toBeLessThanOrEqual(4);
    expect(tb.emulator.stats().requests.list).toBeGreaterThanOrEqual(3);
  });
});

describe('mount lifecycle and bad input', () => {
  let tb: TestBucket;

  beforeAll(async () => {
    tb = await startBucket('life');
    await writeObjects(tb.root, tb.bucket, { 'sub/dir/file.txt': 'inside only-dir', 'top.txt': 'top' });
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  const gcsmount = (args: string[], env: NodeJS.ProcessEnv = daemonEnv()) => run(GCSMOUNT, args, { env });

  it('mounts in the background with the positionals after `--`, and with a start timeout past 24.8 days', async () => {
    const mnt = await tempDir('mnt');
    // Both failed: `--foreground` went after `--` (a third positional: exit 2), and a timeout past Node's
    // timer limit fired at once ("did not finish mounting within 3600000s").
    const r = await gcsmount(['--custom-endpoint', tb.emulator.url, '--start-timeout', '1000h', '--', tb.bucket, mnt]);
    expect(r.code, r.stderr).toBe(0);
    expect(await isMounted(mnt)).toBe(true);
    await unmount(mnt);
  });

  it('refuses bad input with one line and its own exit code', async () => {
    const dir = await tempDir('bad');
    const file = join(dir, 'plain-file');
    await fsp.writeFile(file, '');
    const home = await tempDir('home'); // no gcloud credentials in here
    const cases: { args: string[]; env?: NodeJS.ProcessEnv; code: number; message: RegExp }[] = [
      { args: ['nope', dir, '--custom-endpoint', tb.emulator.url], code: 4, message: /bucket nope does not exist/ },
      // A bucket named like an Object property is a bucket, not a subcommand.
      { args: ['constructor', dir, '--custom-endpoint', tb.emulator.url], code: 4, message: /bucket constructor does not exist/ },
      { args: [tb.bucket, join(dir, 'missing'), '--custom-endpoint', tb.emulator.url], code: 3, message: /mountpoint .* does not exist/ },
      { args: [tb.bucket, file, '--custom-endpoint', tb.emulator.url], code: 3, message: /is not a directory/ },
      { args: [tb.bucket, dir, '--custom-endpoint', tb.emulator.url, '--metadata-cache-ttl-secs', 'soon'], code: 2, message: /metadata-cache-ttl-secs/ },
      { args: [tb.bucket, dir, '--no-such-flag'], code: 2, message: /no-such-flag/ },
      { args: [tb.bucket], code: 2, message: /MOUNTPOINT/i },
      { args: [tb.bucket, dir], env: daemonEnv({ HOME: home }), code: 5, message: /no Google credentials/ },
    ];
    for (const c of cases) {
      const r = await gcsmount(c.args, c.env);
      const lines = r.stderr.trim().split('\n');
      expect(r.code, r.stderr).toBe(c.code);
      expect(lines, r.stderr).toHaveLength(1);
      expect(lines[0]).toMatch(/^gcsmount: /);
      expect(lines[0]).toMatch(c.message);
    }
  });

  it('prints the help, and exits 0, when --help comes anywhere on a mount command line', async () => {
    for (const args of [['--help'], [tb.bucket, '/nowhere', '--help'], ['-h', tb.bucket]]) {
      const r = await gcsmount(args);
      expect(r.code, args.join(' ')).toBe(0);
      expect(r.stdout).toMatch(/^Usage: gcsmount \[flags\] BUCKET MOUNTPOINT/);
      expect(r.stdout).toContain('--metadata-cache-ttl-secs');
    }
  });

  it('prints a subcommand\'s usage, and exits 0, for `gcsmount SUBCOMMAND --help`', async () => {
    for (const sub of ['stats', 'unmount', 'warm', 'wait', 'cache']) {
      const r = await gcsmount([sub, '--help']);
      expect(r.code, `${sub}: ${r.stderr}`).toBe(0);
      expect(r.stdout).toMatch(new RegExp(`^usage: gcsmount ${sub} .*\n.+\n$`));
    }
  });

  it.skipIf(process.getuid?.() !== 0)('raises the mount\'s read_ahead_kb at every start, after the kernel\'s INIT (root)', async () => {
    // Written before the kernel took the INIT reply, the value was lowered back to 128 (3 of 11 starts
    // of a bench probe; this harness's timing did not hit that window in 18): every start must keep
    // --max-read-ahead-kb's default.
    for (let i = 0; i < 6; i++) {
      // With a cache dir, as the race was seen (its start-up work moved the daemon's timing).
      const m = await mount({ tb, args: ['--cache-dir', await tempDir('ra-cache-')] });
      const dev = (await fsp.readFile('/proc/self/mountinfo', 'utf8')).split('\n').find((l) => l.split(' ')[4] === m.path)!.split(' ')[2]!;
      expect((await fsp.readFile(`/sys/class/bdi/${dev}/read_ahead_kb`, 'utf8')).trim(), `start ${i}`).toBe('4096');
      await unmount(m.path);
    }
  }, 60_000);

  it('refuses a mountpoint that is already mounted', async () => {
    const m = await mount({ tb });
    const r = await gcsmount([tb.bucket, m.path, '--custom-endpoint', tb.emulator.url]);
    expect(r.code).toBe(3);
    expect(r.stderr).toMatch(/already mounted/);
    await unmount(m.path);
  });

  it('mounts with a read-only key that may not GET the bucket resource (objectViewer)', async () => {
    tb.emulator.setKnobs({ denyBucketGet: true });
    try {
      const m = await mount({ tb, args: ['--only-dir', 'sub'] });
      expect((await run('cat', [join(m.path, 'dir/file.txt')])).stdout).toBe('inside only-dir');
      await unmount(m.path);
    } finally {
      tb.emulator.setKnobs({ denyBucketGet: false });
    }
  });

  it('mounts only a folder with --only-dir', async () => {
    const m = await mount({ tb, args: ['--only-dir', 'sub'] });
    expect((await run('ls', [m.path])).stdout.trim()).toBe('dir');
    expect((await run('cat', [join(m.path, 'dir/file.txt')])).stdout).toBe('inside only-dir');
    await unmount(m.path);
  });

  it('cleans up the stale mount of a SIGKILLed daemon on the next start', async () => {
    const first = await mount({ tb, foreground: true });
    first.daemon!.kill('SIGKILL');
    await eventually(async () => first.daemon!.exitCode !== null || first.daemon!.signalCode !== null);
    const stale = await run('stat', [first.path]);
    expect(stale.stderr).toMatch(/Transport endpoint is not connected/);
    const second = await mount({ tb, mountPoint: first.path });
    expect((await run('cat', [join(second.path, 'top.txt')])).stdout).toBe('top');
    await unmount(second.path);
  });

  it('unmounts and exits 0 on SIGTERM in the foreground', async () => {
    const m = await mount({ tb, foreground: true });
    const exited = new Promise<number | null>((r) => m.daemon!.on('exit', (code) => r(code)));
    m.daemon!.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(await isMounted(m.path)).toBe(false);
  });

  it('stops the daemon when the mount is removed with gcsmount unmount', async () => {
    const m = await mount({ tb, foreground: true });
    const exited = new Promise<number | null>((r) => m.daemon!.on('exit', (code) => r(code)));
    const r = await run(GCSMOUNT, ['unmount', m.path]);
    expect(r.code, r.stderr).toBe(0);
    expect(await exited).toBe(0);
  });

  it('gcsmount unmount refuses a mount that is not gcsmount\'s (as root, fusermount3 would unmount it)', async () => {
    const other = await tempDir('tmpfs-other');
    expect((await run('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', other])).code).toBe(0);
    try {
      const r = await run(GCSMOUNT, ['unmount', other]);
      expect(r.code).toBe(3);
      expect(r.stderr.trim()).toMatch(/is not a gcsmount mount \(it is tmpfs\); nothing was done$/);
      expect(await isMounted(other)).toBe(true);
    } finally {
      await run('umount', ['-l', other]);
    }
  });

  it('does not turn a download slower than fuse-native\'s 15 s op timeout into EIO', async () => {
    // The stall timeout off: it would cut the silent first byte at 5 s, then 10 s (tested in
    // stall-resume.test.ts), and this is about one operation that takes long.
    const m = await mount({ tb, args: ['--enable-read-stall-retry=false'] });
    // Look the file up first (the kernel keeps the entry for the TTL), so only the read itself is slow.
    expect((await run('stat', [join(m.path, 'top.txt')])).code).toBe(0);
    tb.emulator.setKnobs({ latencyMs: 16_000 });
    try {
      tb.emulator.resetStats();
      const r = await run('cat', [join(m.path, 'top.txt')], { timeoutMs: 80_000 });
      expect(r.stderr).toBe('');
      // One request that took its 16 s.
      expect(tb.emulator.requestLog().filter((e) => e.kind === 'media')).toHaveLength(1);
      expect(r.stdout).toBe('top');
    } finally {
      tb.emulator.setKnobs({ latencyMs: 0 });
      await unmount(m.path);
    }
  }, 100_000);
});
