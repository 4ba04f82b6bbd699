import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BLOCKS_DIR } from '../src/blocks/disk-cache.js';
import { cleanupAll, daemonEnv, eventually, GCSMOUNT, isMounted, run, sha256Of, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';
import { bytes, sha256 } from './helpers/objects.js';

const NOBODY = 65534;

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
      expect(found).toContainEqual('d 755 '); // the folder above, as mkdir -p makes it (never world-writable)
      expect(found).toContainEqual('d 700 cache');
      expect(found).toContainEqual('f 600 cache/index.sqlite');
      for (const line of found.filter((l) => l.includes('cache/'))) expect(line, line).toMatch(/^(d 700|f 600) /);
    } finally {
      await unmount(mnt);
    }
  });

  it('refuses a cache dir owned by another user, for the daemon and for the cache tools, with one line and exit 6', async () => {
    const cacheDir = await tempDir('cache');
    await fsp.chown(cacheDir, NOBODY, NOBODY);
    const mnt = await tempDir('mnt');
    const r = await run(GCSMOUNT, mountArgs(mnt, '--cache-dir', cacheDir), { env: daemonEnv() });
    expect(r.code).toBe(6);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/^gcsmount: cache dir .* belongs to uid 65534/);
    expect(await isMounted(mnt)).toBe(false);
    for (const tool of [['cache', 'info'], ['cache', 'clear'], ['stats']]) {
      const t = await run(GCSMOUNT, [...tool, '--cache-dir', cacheDir]);
      expect(t.code, tool.join(' ')).toBe(6);
      expect(t.stderr.trim().split('\n')).toHaveLength(1);
    }
    expect(await fsp.readdir(cacheDir)).toEqual([]); // nothing made in it
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

  it('refuses a runtime dir owned by another user before it mounts', async () => {
    const runtime = await tempDir('run');
    await fsp.chown(runtime, NOBODY, NOBODY);
    const mnt = await tempDir('mnt');
    const r = await run(GCSMOUNT, mountArgs(mnt), { env: daemonEnv({ GCSMOUNT_RUNTIME_DIR: runtime }) });
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
