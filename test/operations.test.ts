import { spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { gunzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LogRotation } from '../src/observe/log-rotation.js';
import { createLogger } from '../src/observe/logger.js';
import { cleanupAll, daemonEnv, eventually, GCSMOUNT, isMounted, mount, REPO, run, sha256Of, startBucket, tempDir, unmount, writeObjects, type TestBucket } from './helpers/harness.js';
import { bytes, sha256 } from './helpers/objects.js';

const MIB = 1024 * 1024;

interface Stats {
  mountPoint: string;
  counters: Record<string, number>;
  gauges: Record<string, number>;
  fuseOps: Record<string, { count: number }>;
  summary: { blockCacheHitRatio: number | null };
  threads: { mainUtilization: number | null; downloadWorkers: { utilization: number; inFlight: number }[] };
}

/** Prometheus text format, parsed strictly enough that a malformed line fails the test. */
function parsePrometheus(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('# HELP ') || line.startsWith('# TYPE ')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (-?[0-9.e+-]+|NaN|\+Inf|-Inf)$/.exec(line);
    if (!m) throw new Error(`not Prometheus text: ${line}`);
    out.set(m[1]!, Number(m[2]));
  }
  return out;
}

describe('operating a mount', () => {
  let tb: TestBucket;
  const files: Record<string, Buffer> = {};

  beforeAll(async () => {
    tb = await startBucket('ops');
    for (let i = 0; i < 6; i++) files[`data/part-${i}.bin`] = bytes((i + 1) * MIB + 777, 50 + i);
    files['data/deep/nested.bin'] = bytes(9 * MIB, 99);
    await writeObjects(tb.root, tb.bucket, files);
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
  });

  it('reports in stats --json and on Prometheus exactly the requests the emulator saw', async () => {
    const m = await mount({ tb, args: ['--cache-dir', await tempDir('cache'), '--prometheus-port', '19464'] });
    tb.emulator.resetStats();
    for (const n of Object.keys(files)) expect(await sha256Of(join(m.path, n))).toBe(sha256(files[n]!));
    await run('ls', ['-lR', m.path]);
    const seen = tb.emulator.stats().requests;
    const r = await run(GCSMOUNT, ['stats', m.path, '--json']);
    expect(r.code, r.stderr).toBe(0);
    const s = JSON.parse(r.stdout) as Stats;
    expect(s.mountPoint).toBe(m.path);
    // The daemon's bucket check at start-up happened before resetStats.
    expect(s.counters.gcs_requests_list).toBe(seen.list);
    expect(s.counters.gcs_requests_media).toBe(seen.media);
    expect(s.counters.gcs_requests_metadata).toBe(seen.metadata);
    expect(s.counters.block_fetches).toBeGreaterThan(0);
    expect(s.fuseOps.read!.count).toBeGreaterThan(0);
    expect(s.gauges.block_cache_bytes).toBe(s.counters.block_fetch_bytes);
    const text = await (await fetch('http://127.0.0.1:19464/metrics')).text();
    const prom = parsePrometheus(text);
    expect(prom.get('gcsmount_gcs_requests_media_total')).toBe(seen.media);
    expect(prom.get('gcsmount_gcs_requests_list_total')).toBe(seen.list);
    expect(prom.get('gcsmount_block_cache_bytes')).toBe(s.gauges.block_cache_bytes);
    expect(prom.get('gcsmount_fuse_operations_total{op="read"}')).toBeGreaterThanOrEqual(s.fuseOps.read!.count);
    const table = await run(GCSMOUNT, ['stats']);
    expect(table.stdout).toContain(m.path);
    expect(table.stdout).toMatch(/hit ratio/);
    // Which thread limits the mount: the main thread's and each download worker's load.
    expect(table.stdout).toMatch(/threads +main \d+% busy +download workers (#1 \d+% busy, \d+ in flight|none)/);
    expect(s.threads.downloadWorkers.length).toBe(s.gauges.download_workers ?? 0);
    expect(s.threads.mainUtilization).toBe(s.gauges.main_thread_utilization);
    await unmount(m.path);
  });

  it('refuses a warm-up of a mount without a cache dir with one line, and the mount stays up (the daemon died of it)', async () => {
    const m = await mount({ tb });
    const w = await run(GCSMOUNT, ['warm', m.path, 'data']);
    expect(w.code).not.toBe(0);
    expect(w.stderr.trim().split('\n')).toHaveLength(1);
    expect(w.stderr).toContain('no --cache-dir');
    expect(await sha256Of(join(m.path, 'data/part-0.bin'))).toBe(sha256(files['data/part-0.bin']!));
    expect((await run(GCSMOUNT, ['stats', m.path])).code).toBe(0);
    await unmount(m.path);
  });

  it('warms the cache so that reading afterwards costs no media request, and a second warm downloads nothing', async () => {
    const cacheDir = await tempDir('cache');
    const m = await mount({ tb, args: ['--cache-dir', cacheDir] });
    const w = await run(GCSMOUNT, ['warm', m.path, 'data']);
    expect(w.code, w.stderr).toBe(0);
    expect(w.stdout).toMatch(/7 files, .* downloaded, 0 B already cached/);
    const again = await run(GCSMOUNT, ['warm', m.path, join(m.path, 'data')]);
    expect(again.stdout).toMatch(/7 files, 0 B downloaded/);
    tb.emulator.resetStats();
    for (const n of Object.keys(files)) expect(await sha256Of(join(m.path, n))).toBe(sha256(files[n]!));
    expect(tb.emulator.stats().requests.media).toBe(0);
    await unmount(m.path);
  });

  it('warms a prefix page by page: downloads start with the first list page, and few blocks wait listed at once', async () => {
    const many: Record<string, Buffer> = {};
    for (let i = 0; i < 200; i++) many[`many/m${String(i).padStart(3, '0')}.bin`] = bytes(1000 + i, 1000 + i);
    await writeObjects(tb.root, tb.bucket, many);
    const m = await mount({ tb, args: ['--cache-dir', await tempDir('cache'), '--file-cache-max-parallel-downloads', '4'] });
    const pageSize = 10;
    tb.emulator.setKnobs({ pageSize });
    try {
      tb.emulator.resetStats();
      const w = await run(GCSMOUNT, ['warm', m.path, 'many']);
      expect(w.code, w.stderr).toBe(0);
      expect(w.stdout).toMatch(/200 files, .* downloaded, 0 B already cached/);
      // Each list page names 10 objects, each one GET (a whole small object). When page k is asked for,
      // 10k objects have been listed; those not yet fetched are what the warm-up holds: a bound of 4
      // workers x 2 queued, 4 in hand and one page, not the whole prefix (which would list all 20 first).
      const log = tb.emulator.requestLog();
      let listed = 0;
      let fetched = 0;
      let mostHeld = 0;
      for (const e of log) {
        if (e.kind === 'media') fetched++;
        if (e.kind === 'list') {
          mostHeld = Math.max(mostHeld, listed - fetched);
          listed += pageSize;
        }
      }
      expect(log.filter((e) => e.kind === 'list')).toHaveLength(20);
      expect(fetched).toBe(200);
      expect(mostHeld).toBeLessThanOrEqual(4 * 2 + 4 + pageSize);
      tb.emulator.setKnobs({ pageSize: 1000 });
      tb.emulator.resetStats();
      const all = await run('sh', ['-c', `cat ${join(m.path, 'many')}/* | sha256sum`]);
      expect(all.stdout.split(' ')[0]).toBe(sha256(Buffer.concat(Object.keys(many).sort().map((n) => many[n]!))));
      expect(tb.emulator.stats().requests.media).toBe(0); // every object came from the warmed cache
    } finally {
      tb.emulator.setKnobs({ pageSize: 1000 });
      await unmount(m.path);
    }
  });

  it('on SIGTERM unmounts, leaves a consistent index, and starts warm again', async () => {
    const cacheDir = await tempDir('cache');
    const m = await mount({ tb, args: ['--cache-dir', cacheDir], foreground: true });
    for (const n of Object.keys(files)) await sha256Of(join(m.path, n));
    const exited = new Promise<number | null>((r) => m.daemon!.on('exit', (code) => r(code)));
    m.daemon!.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(await isMounted(m.path)).toBe(false);
    const verify = await run(GCSMOUNT, ['cache', 'verify', '--cache-dir', cacheDir, '--json']);
    // 1-6 MiB files: 1 or 2 blocks each (9 blocks), the 9 MiB one 3: every downloaded block was kept.
    expect(JSON.parse(verify.stdout)).toMatchObject({ checked: 12, dropped: 0 });
    const again = await mount({ tb, args: ['--cache-dir', cacheDir], mountPoint: m.path });
    expect((await fsp.readFile(again.logFile, 'utf8'))).not.toContain('reconciled after an unclean stop');
    tb.emulator.resetStats();
    for (const n of Object.keys(files)) expect(await sha256Of(join(again.path, n))).toBe(sha256(files[n]!));
    expect(tb.emulator.stats().requests.media).toBe(0);
    await unmount(again.path);
  });

  it('takes its bucket, mountpoint and settings from a gcsfuse-style config file', async () => {
    const mnt = await tempDir('mnt');
    const config = join(await tempDir('conf'), 'mount.yaml');
    const example = await fsp.readFile(join(REPO, 'systemd/example.yaml'), 'utf8');
    // The shipped example, pointed at this test's emulator, mountpoint and cache.
    await fsp.writeFile(
      config,
      example
        .replace('bucket: my-era5-bucket', `bucket: ${tb.bucket}`)
        .replace('mount-point: /mnt/era5', `mount-point: ${mnt}`)
        .replace('cache-dir: /nvme/gcsmount/era5', `cache-dir: ${await tempDir('cache')}`)
        .replace('gcs-connection:', `gcs-connection:\n  custom-endpoint: ${tb.emulator.url}`),
    );
    const r = await run(GCSMOUNT, ['--config-file', config]);
    expect(r.code, r.stderr).toBe(0);
    expect((await run(GCSMOUNT, ['wait', '--config-file', config, '--timeout', '10'])).code).toBe(0);
    const st = await run('stat', ['-c', '%A %u %g', join(mnt, 'data/part-0.bin')]);
    expect(st.stdout.trim()).toBe('-r--r--r-- 1000 1000');
    expect((await run('stat', ['-c', '%A', join(mnt, 'data')])).stdout.trim()).toBe('dr-xr-xr-x');
    await unmount(mnt);
  });

  it('ships a systemd unit that systemd-analyze verify accepts', async () => {
    const dir = await tempDir('unit');
    const unit = (await fsp.readFile(join(REPO, 'systemd/gcsmount@.service'), 'utf8')).replaceAll('/usr/local/bin/gcsmount', join(REPO, 'bin/gcsmount'));
    await fsp.writeFile(join(dir, 'gcsmount@verify.service'), unit);
    await fsp.mkdir('/etc/gcsmount', { recursive: true });
    await fsp.copyFile(join(REPO, 'systemd/example.yaml'), '/etc/gcsmount/verify.yaml');
    try {
      const r = await run('systemd-analyze', ['verify', '--man=no', join(dir, 'gcsmount@verify.service')]);
      expect(r.stderr).toBe('');
      expect(r.code).toBe(0);
    } finally {
      await fsp.rm('/etc/gcsmount/verify.yaml', { force: true });
    }
  });

  it('reopens its log file on SIGHUP, as logrotate expects', async () => {
    const m = await mount({ tb, foreground: true });
    await fsp.rename(m.logFile, `${m.logFile}.1`);
    m.daemon!.kill('SIGHUP');
    await eventually(async () => (await fsp.readFile(m.logFile, 'utf8').catch(() => '')).includes('log file reopened'));
    await unmount(m.path);
  });

  it('logs to syslog when daemonised without --log-file, as gcsfuse does (local7, tag gcsmount, each level its severity)', async () => {
    const sock = join(await tempDir('syslog'), 'log');
    // The system's log socket stand-in: a datagram socket that prints each message it gets as a line.
    const receiver = spawn('/usr/bin/python3', ['-u', '-c', `
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print('ready')
s.settimeout(60)
while True:
    print(s.recv(65536).decode().replace('\\n', ' '))
`, sock]);
    let got = '';
    receiver.stdout.on('data', (d: Buffer) => (got += d.toString()));
    try {
      await eventually(async () => got.includes('ready'));
      const path = await tempDir('mnt');
      const r = await run(GCSMOUNT, [tb.bucket, path, '--custom-endpoint', tb.emulator.url], { env: daemonEnv({ GCSMOUNT_SYSLOG_SOCKET: sock }) });
      expect(r.code, r.stderr).toBe(0);
      try {
        await eventually(async () => /^<190>\w{3} [ \d]\d \d\d:\d\d:\d\d gcsmount\[\d+\]: \{.*"msg":"mounted"/m.test(got));
        // Reads log at debug, below the default severity (info): no severity-7 line is sent.
        expect((await run('cat', [join(path, 'data', 'part-0.bin')])).code).toBe(0);
      } finally {
        await unmount(path);
      }
      await eventually(async () => got.includes('final counters'));
      expect(got).not.toMatch(/^<191>/m);
    } finally {
      receiver.kill();
    }
  });

  it('rotates a --log-file already past --log-rotate-max-file-size-mb as it starts writing to it, gzipped', async () => {
    const dir = await tempDir('daemonlog');
    const logFile = join(dir, 'gcsmount.log');
    const before = '{"msg":"from an earlier run"}\n'.repeat(40_000);
    await fsp.writeFile(logFile, before);
    const m = await mount({ tb, foreground: true, logFile, args: ['--log-rotate-max-file-size-mb', '1'] });
    try {
      await eventually(async () => (await fsp.readdir(dir)).some((n) => n.endsWith('.log.gz')));
      const gz = (await fsp.readdir(dir)).find((n) => n.endsWith('.log.gz'))!;
      expect(gz).toMatch(/^gcsmount-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3}\.log\.gz$/);
      const rotated = gunzipSync(await fsp.readFile(join(dir, gz))).toString('utf8');
      expect(rotated.startsWith(before)).toBe(true);
      await eventually(async () => `${rotated}${await fsp.readFile(logFile, 'utf8')}`.includes('"msg":"mounted"'));
      expect((await fsp.stat(logFile)).size).toBeLessThan(MIB);
    } finally {
      await unmount(m.path);
    }
  });

  it("keeps answering right while its log's disk is full, and says in the log what it lost once there is room", async () => {
    const logDir = await tempDir('logfs');
    expect((await run('mount', ['-t', 'tmpfs', '-o', 'size=256k', 'tmpfs', logDir])).code).toBe(0);
    try {
      const m = await mount({ tb, foreground: true, logFile: join(logDir, 'gcsmount.log') });
      // The mount shows a moment before the daemon logs "mounted" (longer while download workers load):
      // a start-up line written after the padding below would leave room on the log's last page.
      await eventually(async () => (await fsp.readFile(m.logFile, 'utf8')).includes('"msg":"mounted"'));
      // Full to the last byte: the log's own last page padded with blank lines, then a file over the rest.
      const pad = 4096 - ((await fsp.stat(m.logFile)).size % 4096);
      await fsp.appendFile(m.logFile, '\n'.repeat(pad));
      await run('sh', ['-c', `dd if=/dev/zero of=${join(logDir, 'filler')} bs=4k 2>/dev/null; true`]);
      // Every retry is logged: with the log's disk full, each one is a write that fails. Seed 7 rolls a
      // 429 for the first two requests, however few the reads take (seed 11 rolled its first at the
      // seventh, and since lookups list ahead the reads make fewer: no retry at all).
      tb.emulator.setKnobs({ rate429: 0.4, retryAfterSeconds: null, seed: 7 });
      try {
        for (const name of ['data/part-1.bin', 'data/deep/nested.bin']) expect(await sha256Of(join(m.path, name))).toBe(sha256(files[name]!));
      } finally {
        tb.emulator.setKnobs({ rate429: 0, rate503: 0 });
      }
      const stats = JSON.parse((await run(GCSMOUNT, ['stats', m.path, '--json'])).stdout) as Stats;
      const retries = stats.counters.gcs_retries!;
      expect(retries).toBeGreaterThan(0);
      // A few dozen lines, far below the 1 MiB backlog: all held, none dropped.
      expect(stats.counters.log_lines_lost).toBe(0);
      await fsp.rm(join(logDir, 'filler'));
      // The lines held back go out within a few seconds, with one saying the log was full.
      await eventually(async () => (await fsp.readFile(m.logFile, 'utf8')).includes('the log could not be written for a while'));
      // Every retry was logged while the disk was full (none before: no faults then), and each of those
      // lines reached the file, once.
      const lines = (await fsp.readFile(m.logFile, 'utf8')).split('\n').filter((l) => l.trim() !== '');
      const retryLines = lines.filter((l) => (JSON.parse(l) as { msg: string }).msg.startsWith('GCS retry'));
      expect(retryLines).toHaveLength(retries);
      expect(new Set(retryLines).size).toBe(retries);
      const notice = JSON.parse(lines.find((l) => l.includes('the log could not be written for a while'))!) as { lostLines: number };
      expect(notice.lostLines).toBe(0);
      expect(m.daemon!.exitCode).toBeNull();
      await unmount(m.path);
    } finally {
      await run('umount', ['-l', logDir]);
    }
  });
});

describe("the daemon's log on a full disk", () => {
  /** Every JSON line of a log directory's files, oldest file first (backups sort by their time). */
  const linesOf = async (dir: string, current: string): Promise<string[]> => {
    const names = (await fsp.readdir(dir)).filter((n) => /^gcsmount-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3}\.log(\.gz)?$/.test(n)).sort();
    const texts = await Promise.all([...names.map((n) => join(dir, n)), current].map(async (f) => {
      const raw = await fsp.readFile(f);
      return (f.endsWith('.gz') ? gunzipSync(raw) : raw).toString('utf8');
    }));
    return texts.join('').split('\n').filter((l) => l !== '').map((l) => (JSON.parse(l) as { msg: string }).msg);
  };

  it('rotates its log file by size as gcsfuse does: gzipped backups named by time, the oldest past the count removed, nothing else touched', async () => {
    const dir = await tempDir('logrotate');
    const file = join(dir, 'gcsmount.log');
    // Not backups: names of another shape stay whatever rotation does.
    for (const other of ['gcsmount-notes.log', 'other.log', 'gcsmount-2020-01-01T00-00-00.000.txt']) await fsp.writeFile(join(dir, other), 'keep');
    const { log, rotationsSettled } = createLogger({ severity: 'info', file, rotation: { maxBytes: 64 * 1024, backups: 2, compress: true } });
    const pad = 'x'.repeat(500);
    const name = (i: number) => `line ${String(i).padStart(5, '0')}`;
    // 600 lines of about 560 bytes: five rotations at 64 KiB.
    for (let i = 0; i < 600; i++) {
      log.info({ pad }, name(i));
      if (i % 20 === 19) await new Promise((r) => setImmediate(r));
    }
    await new Promise((r) => setImmediate(r));
    await rotationsSettled();
    const names = (await fsp.readdir(dir)).sort();
    const backups = names.filter((n) => /^gcsmount-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3}\.log\.gz$/.test(n));
    expect(backups, names.join(' ')).toHaveLength(2);
    expect(names).toEqual([...backups, 'gcsmount-2020-01-01T00-00-00.000.txt', 'gcsmount-notes.log', 'gcsmount.log', 'other.log'].sort());
    for (const other of ['gcsmount-notes.log', 'other.log', 'gcsmount-2020-01-01T00-00-00.000.txt']) expect(await fsp.readFile(join(dir, other), 'utf8')).toBe('keep');
    // What is kept is the newest lines, every one of them, in order: a rotation loses nothing.
    const kept = await linesOf(dir, file);
    expect(kept.length).toBeGreaterThan(200);
    expect(kept).toEqual(Array.from({ length: kept.length }, (_, i) => name(600 - kept.length + i)));
    for (const b of backups) expect((await fsp.stat(join(dir, b))).size).toBeLessThan(64 * 1024);
  });

  it('writes on to the full log when no fresh one can be opened (out of descriptors), never failing the daemon', async () => {
    const dir = await tempDir('logrotate-emfile');
    const file = join(dir, 'gcsmount.log');
    await fsp.writeFile(file, 'x'.repeat(2000));
    const problems: string[] = [];
    const dest = { reopen: () => { throw Object.assign(new Error('EMFILE: too many open files'), { code: 'EMFILE' }); } };
    const rotation = new LogRotation(file, { maxBytes: 1000, backups: 2, compress: true }, dest, (_f, msg) => problems.push(msg));
    rotation.wrote(10);
    await new Promise((r) => setImmediate(r));
    await rotation.settled();
    expect(problems).toEqual(['log rotation: could not open a fresh log file; writing on to the full one']);
    // The full file is back under its name (the descriptor still writes to it), and nothing else is there.
    expect(await fsp.readdir(dir)).toEqual(['gcsmount.log']);
    expect((await fsp.stat(file)).size).toBe(2000);
  });

  it('never rotates a log that is not a regular file (a symlink such as /dev/stdout, a FIFO): nothing is renamed', async () => {
    const dir = await tempDir('logrotate-link');
    const target = join(dir, 'elsewhere.log');
    await fsp.writeFile(target, 'x'.repeat(2000));
    const file = join(dir, 'stdout');
    await fsp.symlink(target, file);
    const problems: string[] = [];
    let reopens = 0;
    const rotation = new LogRotation(file, { maxBytes: 1000, backups: 2, compress: true }, { reopen: () => void reopens++ }, (_f, msg) => problems.push(msg));
    rotation.wrote(10);
    await new Promise((r) => setImmediate(r));
    rotation.wrote(5000);
    await new Promise((r) => setImmediate(r));
    await rotation.settled();
    expect(problems).toEqual(['log rotation: the log is not a regular file; it is not rotated']);
    expect(reopens).toBe(0);
    expect((await fsp.readdir(dir)).sort()).toEqual(['elsewhere.log', 'stdout']);
    expect((await fsp.lstat(file)).isSymbolicLink()).toBe(true);
  });

  it('keeps every rotated log with a backup count of 0, uncompressed when asked', async () => {
    const dir = await tempDir('logrotate-all');
    const file = join(dir, 'gcsmount.log');
    const { log, rotationsSettled } = createLogger({ severity: 'info', file, rotation: { maxBytes: 32 * 1024, backups: 0, compress: false } });
    const name = (i: number) => `line ${String(i).padStart(5, '0')}`;
    for (let i = 0; i < 400; i++) {
      log.info({ pad: 'y'.repeat(300) }, name(i));
      if (i % 10 === 9) await new Promise((r) => setImmediate(r));
    }
    await new Promise((r) => setImmediate(r));
    await rotationsSettled();
    const backups = (await fsp.readdir(dir)).filter((n) => n !== 'gcsmount.log');
    expect(backups.length).toBeGreaterThanOrEqual(4);
    for (const b of backups) expect(b).toMatch(/^gcsmount-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3}\.log$/);
    expect(await linesOf(dir, file)).toEqual(Array.from({ length: 400 }, (_, i) => name(i)));
  });

  it('holds 1 MiB of lines, drops and counts the rest, and writes what it held, in order, once there is room', async () => {
    const dir = await tempDir('logfull');
    expect((await run('mount', ['-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', dir])).code).toBe(0);
    try {
      const file = join(dir, 'gcsmount.log');
      const { log, lostLines } = createLogger({ severity: 'info', file });
      await run('sh', ['-c', `dd if=/dev/zero of=${join(dir, 'filler')} bs=4k 2>/dev/null; true`]);
      // Lines of one length (numbered, padded), 1.5 MiB in all while no byte can be written.
      const lines = 1_500;
      const name = (i: number) => `line ${String(i).padStart(5, '0')}`;
      const pad = 'x'.repeat(1_000);
      for (let i = 0; i < lines; i++) log.info({ pad }, name(i));
      const lost = lostLines();
      expect(lost).toBeGreaterThan(0);
      // Room for more than the backlog: the retry (every 2 s) writes what was held.
      expect((await run('mount', ['-o', 'remount,size=4m', dir])).code).toBe(0);
      await fsp.rm(join(dir, 'filler'));
      await eventually(async () => (await fsp.readFile(file, 'utf8')).includes('the log could not be written for a while'));
      const raw = (await fsp.readFile(file, 'utf8')).trim().split('\n');
      const parsed = raw.map((l) => JSON.parse(l) as { msg: string; lostLines?: number });
      // The oldest lines, in order, and exactly those not counted lost: the count is of lines really gone.
      expect(parsed.filter((l) => l.msg.startsWith('line ')).map((l) => l.msg)).toEqual(Array.from({ length: lines - lost }, (_, i) => name(i)));
      // As many as the 1 MiB backlog holds, not one fewer.
      const lineBytes = Buffer.byteLength(raw[0]!) + 1;
      expect((lines - lost) * lineBytes).toBeLessThanOrEqual(1024 * 1024);
      expect((lines - lost + 1) * lineBytes).toBeGreaterThan(1024 * 1024);
      expect(parsed.find((l) => l.msg.startsWith('the log could not be written'))!.lostLines).toBe(lost);
    } finally {
      await run('umount', ['-l', dir]);
    }
  });
});
