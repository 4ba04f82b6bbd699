import { promises as fsp } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BLOCKS_DIR } from '../src/blocks/disk-cache.js';
import { CACHE_SUBDIR } from '../src/blocks/cache-home.js';
import { cleanupAll, daemonEnv, finalCounters, GCSMOUNT, mount, run, sha256Of, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';
import { bytes, sha256, upload } from './helpers/objects.js';

const PY = '/usr/bin/python3';

describe('hostile names and bad input', () => {
  let tb: TestBucket;

  beforeAll(async () => {
    tb = await startBucket('hostile');
    await writeObjects(tb.root, tb.bucket, { 'ok/plain.txt': 'plain' });
  });

  afterAll(async () => {
    tb?.emulator.setKnobs({ stall: false });
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('refuses object names over 1,024 bytes, as GCS does', async () => {
    await expect(upload(tb, `names/${'d'.repeat(1100)}`)).rejects.toThrow(/400.*longer than 1024 bytes/);
  });

  it('shows what can be a path, hides the rest, and writes nothing outside the cache dir', async () => {
    const escape = `gcsmount-escape-${process.pid}`;
    const hostile = [
      `../../../../../../tmp/${escape}`,
      'names/./dot',
      'names/a//b',
      '/leading-slash',
      'names/with\nnewline',
      'names/nul\0inside',
      `names/${'x'.repeat(300)}`,
      // GCS caps names at 1,024 bytes (the emulator too): a name just under it, every part a fine path.
      `names/${Array.from({ length: 8 }, () => 'c'.repeat(120)).join('/')}`,
      'names/both',
      'names/both/child',
    ];
    for (const name of hostile) await upload(tb, name, `content of ${JSON.stringify(name)}`);
    const cacheDir = await tempDir('cache');
    const m = await mount({ tb, args: ['--cache-dir', cacheDir] });
    const r = await run('find', [join(m.path, 'names'), '-type', 'f', '-print0']); // one name has a newline
    const found = r.stdout.split('\0').filter(Boolean).map((p) => p.slice(join(m.path, 'names').length + 1)).sort();
    expect(found).toEqual([`${Array.from({ length: 8 }, () => 'c'.repeat(120)).join('/')}`, 'both/child', 'with\nnewline'].sort());
    // Read everything visible (find ran inside the mount, so every lookup went through the daemon).
    const all = await run('sh', ['-c', `find ${m.path} -type f -exec cat {} + > /dev/null`]);
    expect(all.code, all.stderr).toBe(0);
    expect(await fsp.access(`/tmp/${escape}`).then(() => true, () => false)).toBe(false);
    // The cache dir holds only the index, its journal and hashed block files (and, while a block is on
    // its way to disk after the read returned, its hashed temporary file, numbered by a per-process count),
    // and the lock file of the daemon's staging folder (named by its pid, start time and a random tag).
    const cached = (await run('find', [cacheDir, '-type', 'f'])).stdout.trim().split('\n');
    const allowed = new RegExp(`^/${CACHE_SUBDIR}/(index\\.sqlite(-wal|-shm)?|${BLOCKS_DIR}/[0-9a-f]{2}/[0-9a-f]{32}|tmp/[0-9a-f]{32}\\.[0-9]+|staging/[0-9]+-[0-9]+-[0-9a-f]+/\\.alive(-journal)?)$`);
    for (const f of cached) expect(f.slice(cacheDir.length), f).toMatch(allowed);
    await unmount(m.path);
  });

  it('answers ENOENT for a name that is not UTF-8, never another object', async () => {
    // "\uFFFD" is what a lenient decoder makes of any invalid byte.
    await upload(tb, 'utf/\uFFFD', 'replacement');
    await upload(tb, 'utf/\u00e9t\u00e9', 'summer');
    const m = await mount({ tb });
    const dir = join(m.path, 'utf');
    // Raw bytes in the path: python, since a command line from here is UTF-8.
    const cat = (hex: string) =>
      run(PY, ['-c', 'import sys,os\ntry:\n print(open(os.fsencode(sys.argv[1])+b"/"+bytes.fromhex(sys.argv[2]),"rb").read().decode())\nexcept OSError as e:\n print(e.errno)', dir, hex]);
    expect((await cat('ff')).stdout.trim()).toBe('2');
    expect((await cat('fe')).stdout.trim()).toBe('2');
    expect((await cat('e9')).stdout.trim()).toBe('2'); // Latin-1 bytes of "\u00e9"
    expect((await cat('c3a974a9')).stdout.trim()).toBe('2'); // "\u00e9t" then a stray continuation byte
    expect((await cat('c080')).stdout.trim()).toBe('2'); // an overlong NUL
    expect((await cat('efbfbd')).stdout.trim()).toBe('replacement');
    expect((await cat('c3a974c3a9')).stdout.trim()).toBe('summer');
    await unmount(m.path);
  });

  it('lists a folder of 100,000 objects completely', async () => {
    const dir = join(tb.root, tb.bucket, 'huge');
    await fsp.mkdir(dir, { recursive: true });
    for (let i = 0; i < 100_000; i += 1000) {
      await Promise.all(Array.from({ length: 1000 }, (_, j) => fsp.writeFile(join(dir, `c${String(i + j).padStart(6, '0')}`), '')));
    }
    const m = await mount({ tb });
    tb.emulator.resetStats();
    const r = await run('sh', ['-c', `ls -f ${join(m.path, 'huge')} | grep -c '^c'`], { timeoutMs: 180_000 });
    expect(r.stdout.trim()).toBe('100000');
    const lists = tb.emulator.stats().requests.list;
    await unmount(m.path);
    // 100 pages and the lookup, plus any page the daemon cut as stalled and asked again (a loaded machine
    // can keep the emulator silent past the stall timeout while it reads a 100,000-entry folder). The
    // folder is listed in up to ten parts at once (startOffset/endOffset): a part cut where a full page
    // ended asks once more to find its end, and a guessed part past the last name costs one empty page;
    // a few here (parts of 10,000 names: 'c01'..'c09'), never a page per name.
    const stalls = (await finalCounters(m.logFile)).gcs_stalls ?? 0;
    expect(lists).toBeGreaterThanOrEqual(101);
    expect(lists).toBeLessThanOrEqual(120 + stalls);
    await fsp.rm(dir, { recursive: true, force: true });
  }, 240_000);

  it('rebuilds a corrupt index.sqlite and ignores garbage files in the cache dir', async () => {
    const cacheDir = await tempDir('cache');
    const first = await mount({ tb, args: ['--cache-dir', cacheDir] });
    await writeObjects(tb.root, tb.bucket, { 'ok/big.bin': bytes(6 * 1024 * 1024, 3) });
    await sha256Of(join(first.path, 'ok/big.bin'));
    await unmount(first.path);
    await new Promise((r) => setTimeout(r, 1500)); // the daemon sees its mount go and lets go of the index
    await fsp.writeFile(join(cacheDir, CACHE_SUBDIR, 'index.sqlite'), 'this is not a database, it is garbage'.repeat(100));
    await fsp.rm(join(cacheDir, CACHE_SUBDIR, 'index.sqlite-wal'), { force: true });
    await fsp.writeFile(join(cacheDir, CACHE_SUBDIR, BLOCKS_DIR, 'zz-garbage'), 'junk');
    await fsp.mkdir(join(cacheDir, CACHE_SUBDIR, BLOCKS_DIR, 'ab'), { recursive: true });
    await fsp.writeFile(join(cacheDir, CACHE_SUBDIR, BLOCKS_DIR, 'ab', 'ab00000000000000000000000000junk'), 'junk');
    const second = await mount({ tb, args: ['--cache-dir', cacheDir], mountPoint: first.path });
    expect(await sha256Of(join(second.path, 'ok/big.bin'))).toBe(sha256(bytes(6 * 1024 * 1024, 3)));
    await unmount(second.path);
    expect(await fsp.readFile(second.logFile, 'utf8')).toContain('block cache index was unreadable; moved aside and started empty');
  });

  it('refuses a read-only cache dir with one line', async () => {
    const ro = await tempDir('ro');
    expect((await run('mount', ['-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', ro])).code).toBe(0);
    try {
      const mnt = await tempDir('mnt');
      const r = await run(GCSMOUNT, [tb.bucket, mnt, '--custom-endpoint', tb.emulator.url, '--cache-dir', join(ro, 'cache')], { env: daemonEnv() });
      expect(r.code).toBe(6);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toMatch(/^gcsmount: cache dir .* cannot be used: EROFS/);
    } finally {
      await run('umount', ['-l', ro]);
    }
  });

  it('keeps the daemon up when the bucket vanishes while mounted', async () => {
    const other = await startBucket('vanishing');
    await writeObjects(other.root, other.bucket, { 'a.txt': 'a', 'b.txt': 'b' });
    const m = await mount({ tb: other, args: ['--metadata-cache-ttl-secs', '0'] });
    expect((await run('cat', [join(m.path, 'a.txt')])).stdout).toBe('a');
    await fsp.rm(join(other.root, other.bucket), { recursive: true });
    const after = await run('cat', [join(m.path, 'b.txt')]);
    expect(after.code).not.toBe(0);
    expect(after.stderr).toMatch(/No such file|Input\/output error/);
    expect((await run('stat', [m.path])).code).toBe(0); // still answering
    await unmount(m.path);
    await other.emulator.close();
  });

  it('times out against an endpoint that never answers: EIO, not a hang', async () => {
    const m = await mount({ tb, args: ['--http-client-timeout', '1s', '--max-retry-attempts', '2', '--max-retry-sleep', '200ms', '--metadata-cache-ttl-secs', '0'] });
    tb.emulator.setKnobs({ stall: true });
    try {
      const t0 = performance.now();
      const r = await run('cat', [join(m.path, 'ok/plain.txt')], { timeoutMs: 60_000 });
      expect(r.code).not.toBe(0);
      expect(r.stderr).toMatch(/Input\/output error/);
      expect((performance.now() - t0) / 1000).toBeLessThan(20);
    } finally {
      tb.emulator.setKnobs({ stall: false });
    }
    await unmount(m.path);
  });

  it('fails start-up with one line when the endpoint accepts connections but never answers', async () => {
    const sockets: import('node:net').Socket[] = [];
    const silent: Server = createServer((s) => sockets.push(s));
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', () => r()));
    const port = (silent.address() as { port: number }).port;
    try {
      const mnt = await tempDir('mnt');
      const t0 = performance.now();
      const r = await run(GCSMOUNT, [tb.bucket, mnt, '--custom-endpoint', `http://127.0.0.1:${port}`, '--http-client-timeout', '1s', '--startup-check-timeout', '3s'], { env: daemonEnv(), timeoutMs: 60_000 });
      expect(r.code).toBe(4);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toMatch(/^gcsmount: cannot reach bucket/);
      expect((performance.now() - t0) / 1000).toBeLessThan(20);
    } finally {
      for (const s of sockets) s.destroy();
      silent.close();
    }
  });
});
