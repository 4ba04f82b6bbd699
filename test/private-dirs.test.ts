import { spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CACHE_SUBDIR } from '../src/blocks/cache-home.js';
import { BLOCKS_DIR } from '../src/blocks/disk-cache.js';
import { cleanupAll, daemonEnv, eventually, GCSMOUNT, isMounted, run, sha256Of, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';
import { bytes, sha256 } from './helpers/objects.js';

const NOBODY = 65534;
const PYTHON = 'python3';
/** Holds a SQLite index's lock as a gcsmount daemon does, until killed; says "held" once it has it. */
const HOLD_INDEX = `import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute('PRAGMA locking_mode = EXCLUSIVE')
db.execute('BEGIN EXCLUSIVE'); db.execute('COMMIT')
print('held', flush=True)
time.sleep(600)`;

/** Processes whose command line names `needle` (a unique temporary path): what a test started and left. */
async function processesNaming(needle: string): Promise<number[]> {
  const out: number[] = [];
  for (const pid of await fsp.readdir('/proc')) {
    if (!/^\d+$/.test(pid) || Number(pid) === process.pid) continue;
    const cmd = await fsp.readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
    if (cmd.split('\0').includes(needle)) out.push(Number(pid));
  }
  return out;
}

describe('private state: the cache dir and the runtime dir', () => {
  let tb: TestBucket;
  const data = bytes(5 * 1024 * 1024, 7);

  beforeAll(async () => {
    tb = await startBucket('private');
    await writeObjects(tb.root, tb.bucket, { 'data/five.bin': data });
  });

  afterAll(async () => {
    tb?.emulator.setKnobs({ stall: false });
    await cleanupAll();
    await tb?.emulator.close();
  });

  const mountArgs = (mnt: string, ...extra: string[]) => [tb.bucket, mnt, '--custom-endpoint', tb.emulator.url, ...extra];

  it('keeps the cache owner-only (folders 0700, files 0600) under umask 000, through a symlink in a private folder', async () => {
    const parent = await tempDir('cache');
    // A symlink is fine where only its owner could have made it.
    const real = join(parent, 'real');
    await fsp.mkdir(real);
    await fsp.symlink(real, join(parent, 'link'));
    const cacheDir = join(parent, 'link', 'deep', 'cache');
    const mnt = await tempDir('mnt');
    const r = await run('sh', ['-c', 'umask 000 && exec "$0" "$@"', GCSMOUNT, ...mountArgs(mnt, '--cache-dir', cacheDir)], { env: daemonEnv() });
    expect(r.code, r.stderr).toBe(0);
    try {
      expect(await sha256Of(join(mnt, 'data/five.bin'))).toBe(sha256(data));
      const listing = async () => (await run('find', [join(real, 'deep'), '-printf', '%y %m %P\n'])).stdout.trim().split('\n');
      await eventually(async () => (await listing()).filter((l) => l.startsWith('f ') && l.includes(`${BLOCKS_DIR}/`)).length === 2);
      const found = await listing();
      // The folders above, the given one included, as mkdir -p makes them (never world-writable).
      expect(found).toContainEqual('d 755 ');
      expect(found).toContainEqual('d 755 cache');
      expect(found).toContainEqual(`d 700 cache/${CACHE_SUBDIR}`);
      expect(found).toContainEqual(`f 600 cache/${CACHE_SUBDIR}/index.sqlite`);
      for (const line of found.filter((l) => l.includes(`${CACHE_SUBDIR}/`))) expect(line, line).toMatch(/^(d 700|f 600) /);
    } finally {
      await unmount(mnt);
    }
  });

  it('refuses a cache folder owned by another user, for the daemon and for the cache tools, with one line and exit 6', async () => {
    const cacheDir = await tempDir('cache');
    const home = join(cacheDir, CACHE_SUBDIR);
    await fsp.mkdir(home);
    await fsp.chown(home, NOBODY, NOBODY);
    const mnt = await tempDir('mnt');
    const r = await run(GCSMOUNT, mountArgs(mnt, '--cache-dir', cacheDir), { env: daemonEnv() });
    expect(r.code).toBe(6);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/^gcsmount: cache dir .*gcsmount-cache belongs to uid 65534/);
    expect(await isMounted(mnt)).toBe(false);
    for (const tool of [['cache', 'info'], ['cache', 'clear'], ['stats']]) {
      const t = await run(GCSMOUNT, [...tool, '--cache-dir', cacheDir]);
      expect(t.code, tool.join(' ')).toBe(6);
      expect(t.stderr.trim().split('\n')).toHaveLength(1);
    }
    expect(await fsp.readdir(home)).toEqual([]); // nothing made in it
  });

  /** Every entry under `dir` with its type, mode, owner and size: what "touched nothing" compares. */
  const snapshot = async (dir: string) => (await run('find', [dir, '-printf', '%y %m %u %s %P\n'])).stdout.split('\n').sort();

  it('keeps its cache in DIR/gcsmount-cache and leaves the rest of DIR as it was (mode, tmp/, other files)', async () => {
    // The reproduction: a shared folder (1777) with a tmp/ of someone else's in it.
    const shared = await tempDir('shared');
    await fsp.mkdir(join(shared, 'tmp'));
    await fsp.writeFile(join(shared, 'tmp', 'f'), 'precious\n');
    await fsp.writeFile(join(shared, 'index.sqlite'), 'not ours');
    await fsp.chmod(shared, 0o1777);
    const before = await snapshot(shared);
    const mnt = await tempDir('mnt');
    const r = await run(GCSMOUNT, mountArgs(mnt, '--cache-dir', shared), { env: daemonEnv() });
    expect(r.code, r.stderr).toBe(0);
    try {
      expect(await sha256Of(join(mnt, 'data/five.bin'))).toBe(sha256(data));
      await eventually(async () => (await run('find', [join(shared, CACHE_SUBDIR, BLOCKS_DIR), '-type', 'f'])).stdout.trim().split('\n').length === 2);
    } finally {
      await unmount(mnt);
    }
    expect((await run('stat', ['-c', '%a', shared])).stdout.trim()).toBe('1777');
    expect(await fsp.readFile(join(shared, 'tmp', 'f'), 'utf8')).toBe('precious\n');
    // Outside its folder, everything is as it was; inside, it is private.
    expect((await snapshot(shared)).filter((l) => !l.includes(CACHE_SUBDIR))).toEqual(before);
    expect((await run('stat', ['-c', '%a', join(shared, CACHE_SUBDIR)])).stdout.trim()).toBe('700');
    // The cache tools find it there, once the daemon has let go of it.
    let info = { code: 1, stdout: '', stderr: '' };
    await eventually(async () => (info = await run(GCSMOUNT, ['cache', 'info', '--cache-dir', shared, '--json'])).code === 0);
    expect(JSON.parse(info.stdout)).toMatchObject({ blocks: 2, bytes: data.length });
    expect((await snapshot(shared)).filter((l) => !l.includes(CACHE_SUBDIR))).toEqual(before);
    // Given the cache's own folder (the one the log names), the tools and the daemon refuse, touching
    // nothing: it once passed for a cache of the previous layout and was moved into a folder inside itself.
    const home = join(shared, CACHE_SUBDIR);
    const inside = await snapshot(home);
    for (const args of [['cache', 'info', '--cache-dir', home], mountArgs(mnt, '--cache-dir', home)]) {
      const t = await run(GCSMOUNT, args, { env: daemonEnv() });
      expect(t.code, args.join(' ')).toBe(6);
      expect(t.stderr.trim().split('\n')).toHaveLength(1);
      expect(t.stderr).toContain("is gcsmount's own cache folder");
      expect(await snapshot(home)).toEqual(inside);
    }
    info = await run(GCSMOUNT, ['cache', 'info', '--cache-dir', shared, '--json']);
    expect(JSON.parse(info.stdout)).toMatchObject({ blocks: 2, bytes: data.length });
  });

  it('refuses, with one line and exit 6 and touching nothing, to inspect a folder that holds no gcsmount cache', async () => {
    const dir = await tempDir('other');
    await fsp.mkdir(join(dir, 'tmp'));
    await fsp.writeFile(join(dir, 'tmp', 'f'), 'precious\n');
    await fsp.chmod(dir, 0o1777);
    const before = await snapshot(dir);
    for (const tool of [['cache', 'info'], ['cache', 'verify'], ['cache', 'clear'], ['stats']]) {
      const t = await run(GCSMOUNT, [...tool, '--cache-dir', dir]);
      expect(t.code, tool.join(' ')).toBe(6);
      expect(t.stderr.trim().split('\n')).toHaveLength(1);
      expect(t.stderr).toMatch(/^gcsmount: cache dir .* holds no gcsmount cache/);
      expect(await snapshot(dir), tool.join(' ')).toEqual(before);
    }
  });

  it('moves a cache of the previous layout (index.sqlite and blocks-v2/ in DIR) into its folder, and reads from it', async () => {
    // Made as the previous version left it: a filled cache, then its files moved up into DIR.
    const dir = await tempDir('legacy');
    const mnt = await tempDir('mnt');
    expect((await run(GCSMOUNT, mountArgs(mnt, '--cache-dir', dir), { env: daemonEnv() })).code).toBe(0);
    expect(await sha256Of(join(mnt, 'data/five.bin'))).toBe(sha256(data));
    await unmount(mnt);
    await eventually(async () => (await run(GCSMOUNT, ['cache', 'info', '--cache-dir', dir])).code === 0);
    for (const name of ['index.sqlite', BLOCKS_DIR]) await fsp.rename(join(dir, CACHE_SUBDIR, name), join(dir, name));
    await fsp.rm(join(dir, CACHE_SUBDIR), { recursive: true });
    await fsp.mkdir(join(dir, 'tmp'));
    await fsp.writeFile(join(dir, 'tmp', 'f'), 'precious\n');
    // An older daemon still holding the index: nothing moves, the tools say it is in use, the mount says so once.
    const holder = spawn(PYTHON, ['-c', HOLD_INDEX, join(dir, 'index.sqlite')], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise((r) => holder.stdout!.once('data', r));
    const before = await snapshot(dir);
    try {
      const t = await run(GCSMOUNT, ['cache', 'info', '--cache-dir', dir]);
      expect(t.code).toBe(6);
      expect(t.stderr).toMatch(/in use by a running gcsmount/);
      expect(await snapshot(dir)).toEqual(before);
      const logFile = join(await tempDir('log'), 'gcsmount.log');
      expect((await run(GCSMOUNT, mountArgs(mnt, '--cache-dir', dir, '--log-file', logFile), { env: daemonEnv() })).code).toBe(0);
      await unmount(mnt);
      const log = await fsp.readFile(logFile, 'utf8');
      expect(log.split('\n').filter((l) => l.includes('left a block cache of the previous layout'))).toHaveLength(1);
      expect((await snapshot(dir)).filter((l) => !l.includes(CACHE_SUBDIR))).toEqual(before);
      await eventually(async () => (await run(GCSMOUNT, ['cache', 'clear', '--cache-dir', dir])).code === 0);
      await fsp.rm(join(dir, CACHE_SUBDIR), { recursive: true });
    } finally {
      holder.kill();
    }
    await new Promise((r) => holder.once('exit', r));
    // Once nobody holds it: moved by the next mount, which reads from it without a request.
    const logFile = join(await tempDir('log'), 'gcsmount.log');
    expect((await run(GCSMOUNT, mountArgs(mnt, '--cache-dir', dir, '--log-file', logFile), { env: daemonEnv() })).code).toBe(0);
    try {
      tb.emulator.resetStats();
      expect(await sha256Of(join(mnt, 'data/five.bin'))).toBe(sha256(data));
      expect(tb.emulator.stats().requests.media).toBe(0);
    } finally {
      await unmount(mnt);
    }
    expect((await fsp.readdir(dir)).sort()).toEqual([CACHE_SUBDIR, 'tmp']);
    expect(await fsp.readFile(join(dir, 'tmp', 'f'), 'utf8')).toBe('precious\n');
    expect(await fsp.readFile(logFile, 'utf8')).toContain('moved the block cache of the previous layout into its own folder');
  });

  it('refuses a cache dir reached through a symlink in a world-writable folder (the /tmp symlink attack)', async () => {
    const shared = await tempDir('shared');
    await fsp.chmod(shared, 0o1777); // like /tmp
    const elsewhere = await tempDir('elsewhere');
    await fsp.symlink(elsewhere, join(shared, 'cache'));
    const mnt = await tempDir('mnt');
    const r = await run(GCSMOUNT, mountArgs(mnt, '--cache-dir', join(shared, 'cache')), { env: daemonEnv() });
    expect(r.code).toBe(6);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/^gcsmount: cache dir .* is reached through the symlink .* in the world-writable/);
    const info = await run(GCSMOUNT, ['cache', 'info', '--cache-dir', join(shared, 'cache')]);
    expect(info.code).toBe(6);
    expect(await fsp.readdir(elsewhere)).toEqual([]);
  });

  it('keeps its control sockets in GCSMOUNT_RUNTIME_DIR/gcsmount, leaving the folder itself as it was', async () => {
    const runtime = await tempDir('run');
    await fsp.writeFile(join(runtime, 'other'), 'not ours');
    await fsp.chmod(runtime, 0o1777);
    const before = await snapshot(runtime);
    const env = daemonEnv({ GCSMOUNT_RUNTIME_DIR: runtime });
    const mnt = await tempDir('mnt');
    expect((await run(GCSMOUNT, mountArgs(mnt), { env })).code).toBe(0);
    try {
      const stats = await run(GCSMOUNT, ['stats', mnt, '--json'], { env });
      expect(stats.code, stats.stderr).toBe(0);
      expect((await fsp.readdir(join(runtime, 'gcsmount'))).filter((n) => n.endsWith('.sock'))).toHaveLength(1);
      expect((await run('stat', ['-c', '%a', join(runtime, 'gcsmount')])).stdout.trim()).toBe('700');
    } finally {
      await unmount(mnt);
    }
    expect((await snapshot(runtime)).filter((l) => !/ gcsmount(\/|$)/.test(l))).toEqual(before);
  });

  it('refuses a runtime dir owned by another user before it mounts', async () => {
    const parent = await tempDir('run');
    const runtime = join(parent, 'gcsmount');
    await fsp.mkdir(runtime);
    await fsp.chown(runtime, NOBODY, NOBODY);
    const mnt = await tempDir('mnt');
    const r = await run(GCSMOUNT, mountArgs(mnt), { env: daemonEnv({ GCSMOUNT_RUNTIME_DIR: parent }) });
    expect(r.code).toBe(6);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/^gcsmount: runtime dir .* belongs to uid 65534/);
    expect(await isMounted(mnt)).toBe(false);
  });
});

describe('start-up that cannot hang', () => {
  let tb: TestBucket;

  beforeAll(async () => {
    tb = await startBucket('bounded');
  });

  afterAll(async () => {
    tb?.emulator.setKnobs({ stall: false });
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('fails --cache-dir /proc/x with one line and exit 6 (Node\'s recursive mkdir spins there forever)', async () => {
    const mnt = await tempDir('mnt');
    try {
      const r = await run(GCSMOUNT, [tb.bucket, mnt, '--custom-endpoint', tb.emulator.url, '--cache-dir', '/proc/x'], { env: daemonEnv(), timeoutMs: 30_000 });
      expect(r.code).toBe(6);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toMatch(/^gcsmount: cache dir \/proc\/x cannot be used: ENOENT/);
    } finally {
      for (const pid of await processesNaming(mnt)) process.kill(pid, 'SIGKILL');
    }
  });

  it('Ctrl-C while the mount command waits stops the daemon it started: no mount appears after it said it failed', async () => {
    const mnt = await tempDir('mnt');
    tb.emulator.setKnobs({ latencyMs: 1500 }); // the bucket check takes a while
    try {
      const child = spawn(GCSMOUNT, [tb.bucket, mnt, '--custom-endpoint', tb.emulator.url], { env: daemonEnv(), stdio: ['ignore', 'ignore', 'pipe'] });
      let stderr = '';
      child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
      await new Promise((r) => setTimeout(r, 700));
      child.kill('SIGINT');
      expect(await exited).toBe(1);
      expect(stderr).toMatch(/^gcsmount: interrupted \(SIGINT\) while the daemon was starting; stopped it/);
      tb.emulator.setKnobs({ latencyMs: 0 });
      // Before: the daemon went on, mounted, and died at once telling a parent that was gone (a dead mount).
      await new Promise((r) => setTimeout(r, 4000));
      expect(await isMounted(mnt)).toBe(false);
      expect(await processesNaming(mnt)).toEqual([]);
    } finally {
      tb.emulator.setKnobs({ latencyMs: 0 });
      for (const pid of await processesNaming(mnt)) process.kill(pid, 'SIGKILL');
      await run('umount', ['-l', mnt]);
    }
  });

  it('stops waiting for a daemon that never reports (GCS silent during the bucket check) after --start-timeout, and kills it', async () => {
    const mnt = await tempDir('mnt');
    tb.emulator.setKnobs({ stall: true });
    try {
      const t0 = performance.now();
      // The default --http-client-timeout gives a silent endpoint 300 s per attempt: only the bound ends this.
      const r = await run(GCSMOUNT, [tb.bucket, mnt, '--custom-endpoint', tb.emulator.url, '--start-timeout', '3s'], { env: daemonEnv(), timeoutMs: 60_000 });
      expect(r.code).toBe(1);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toMatch(/^gcsmount: the daemon did not finish mounting within 3s \(--start-timeout\); stopped it/);
      expect((performance.now() - t0) / 1000).toBeLessThan(30);
      expect(await processesNaming(mnt)).toEqual([]);
      expect(await isMounted(mnt)).toBe(false);
    } finally {
      tb.emulator.setKnobs({ stall: false });
      for (const pid of await processesNaming(mnt)) process.kill(pid, 'SIGKILL');
    }
  });
});
