import { existsSync, promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RequestLogEntry } from '../src/emulator/server.js';
import { cleanupAll, isMounted, mount, REPO, run, startBucket, tempDir, unmount, type Mounted, type TestBucket } from './helpers/harness.js';

/**
 * The acceptance test of the Zarr issue: an xarray pipeline pointed at the mount gets the same numbers
 * as on the local copy. test/fixtures/make_zarr.py writes the stores (consolidated and not, nested
 * groups, float32 and int16, Blosc and Zlib, 1 MiB and 8 MiB chunks, missing chunks) straight into the
 * emulator's folder, which is also the local copy; test/fixtures/read_zarr.py opens each dataset with
 * xr.open_zarr on both, reads .isel/.sel slices, .load()s all of it, compares NaN-aware, and prints one
 * JSON line. Eight readers run at once, as separate processes: cold, warm, and after a daemon restart.
 */

const PY = '/usr/bin/python3';
const MAKE = join(REPO, 'test/fixtures/make_zarr.py');
const READ = join(REPO, 'test/fixtures/read_zarr.py');
const READERS = 8;
/** The folder of the bucket that holds the stores; --only-dir mounts it. */
const PREFIX = 'stores';
/** gcsmount's default --block-size-mb: a file is read in blocks of this size, one media request each. */
const BLOCK = 4 * 1024 * 1024;
/**
 * List requests of a round with empty metadata caches, for 91 objects: since lookups list flat from the
 * looked-up name on (one page answers the store's folders and chunks at every depth), measured 1 cold, 1
 * after a restart and 2 through --only-dir (2026-11-25); 1-3 in earlier runs. A round on a loaded machine
 * that outlasts the negative TTL (5 s) pays one page per fill-value folder per TTL more. With a listing
 * per folder (the lookups before c698e3e) it was 47-62, so the bound tells the two apart.
 */
const COLD_LIST_MAX = 15;
/** --metadata-cache-negative-ttl-secs (5 by default): how long a listing or a lookup may say "no such name". */
const NEGATIVE_TTL_MS = 5_000;

/**
 * The object name a list request asks about: a lookup lists from the name it looks up (startOffset), or,
 * with nothing listed to go on from, lists the name itself as prefix (a file, or a folder below it).
 * Null for a folder's listing (prefix ending in '/') or a page that goes on by token.
 */
function askedName(e: RequestLogEntry): string | null {
  if (!e.list || e.list.token) return null;
  if (e.list.startOffset !== null) return e.list.startOffset;
  return e.list.prefix !== '' && !e.list.prefix.endsWith('/') ? e.list.prefix : null;
}

/**
 * The folder a lookup of a missing name lists again whole: when the folder's listing is small, a "no
 * such name" older than the negative TTL is refreshed by listing the folder flat from its start (one
 * page, that answers the folder's other names too) rather than from the name. Null for anything else.
 */
function relistedFolder(e: RequestLogEntry): string | null {
  if (!e.list || e.list.token || e.list.delimiter !== null || e.list.startOffset !== null) return null;
  return e.list.prefix.endsWith('/') ? e.list.prefix : null;
}

interface ReaderResult {
  ok: boolean;
  checks: number;
  mismatches: string[];
}

interface Round {
  media: number;
  list: number;
  metadata: number;
  total: number;
  mediaBytes: number;
  /** Media requests for a range that an earlier request of the same round already fetched. */
  repeated: number;
  seconds: number;
  /** The round's requests, from the emulator's log. */
  log: RequestLogEntry[];
}

describe('Zarr stores read by xarray through the mount', () => {
  let tb: TestBucket;
  let local: string;
  let cacheDir: string;
  let onlyDirCache: string;
  /** Chunk files (each must be read at least once) and their bytes; metadata files come on top. */
  let chunkFiles = 0;
  let chunkBytes = 0;
  /** Every object, metadata included, and the blocks they make: a round that reads each once. */
  let storeBytes = 0;
  let storeBlocks = 0;
  let m: Mounted;

  beforeAll(async () => {
    tb = await startBucket('zarr-acceptance');
    local = join(tb.root, tb.bucket, PREFIX);
    const made = await run(PY, [MAKE, local, '--scale', 'small'], { timeoutMs: 60_000 });
    expect(made.stderr).not.toMatch(/Traceback/);
    expect(made.code, made.stderr).toBe(0);
    const summary = JSON.parse(made.stdout) as { stores: Record<string, { missing_chunks: number }> };
    expect(summary.stores['consolidated.zarr']!.missing_chunks).toBeGreaterThan(0);
    expect(summary.stores['plain.zarr']!.missing_chunks).toBeGreaterThan(0);
    const files = (await run('find', [local, '-type', 'f', '-printf', '%f %s\n'])).stdout.trim().split('\n');
    for (const line of files) {
      const [name, size] = [line.slice(0, line.lastIndexOf(' ')), Number(line.slice(line.lastIndexOf(' ') + 1))];
      storeBytes += size;
      storeBlocks += Math.max(1, Math.ceil(size / BLOCK));
      if (!name.startsWith('.')) {
        chunkFiles++;
        chunkBytes += size;
      }
    }
    cacheDir = await tempDir('zarr-cache');
    onlyDirCache = await tempDir('zarr-cache');
  });

  afterAll(async () => {
    await cleanupAll();
    await tb?.emulator.close();
    // Tens of MB of fixture and cache per run: not left behind in /tmp.
    if (tb) await fsp.rm(tb.root, { recursive: true, force: true });
    for (const dir of [cacheDir, onlyDirCache]) if (dir) await fsp.rm(dir, { recursive: true, force: true });
  });

  /** Runs `count` readers at once, each a separate python process, and checks every one of them. */
  async function readers(root: string, count: number): Promise<void> {
    const runs = await Promise.all(Array.from({ length: count }, () => run(PY, [READ, root, local], { timeoutMs: 80_000 })));
    for (const r of runs) {
      expect(r.stderr).not.toMatch(/Traceback/);
      const result = JSON.parse(r.stdout.trim().split('\n').pop() || '{}') as ReaderResult;
      expect(result.mismatches).toEqual([]);
      expect(result.ok).toBe(true);
      expect(result.checks).toBe(9); // 4 datasets loaded, 5 slices
      expect(r.code).toBe(0);
    }
  }

  /** Resets the emulator's counters, runs the readers, and returns what they cost. */
  async function round(name: string, root: string, count = READERS): Promise<Round> {
    tb.emulator.resetStats();
    const t0 = Date.now();
    await readers(root, count);
    const seconds = (Date.now() - t0) / 1000;
    const s = tb.emulator.stats();
    const log = tb.emulator.requestLog();
    const ranges = new Set<string>();
    let repeated = 0;
    for (const e of log) {
      if (e.kind !== 'media') continue;
      const key = `${e.object} ${e.range?.start ?? 0}`;
      if (ranges.has(key)) repeated++;
      ranges.add(key);
    }
    const r: Round = { media: s.requests.media, list: s.requests.list, metadata: s.requests.metadata, total: s.requests.total, mediaBytes: s.mediaBytes, repeated, seconds, log };
    const { log: _, ...counts } = r;
    console.log(`zarr ${name}: ${count} readers, ${seconds} s, ${JSON.stringify(counts)}; bucket: ${storeBytes} bytes, ${storeBlocks} blocks, ${chunkFiles} chunk files`);
    return r;
  }

  async function expectCleanLog(logFile: string): Promise<void> {
    const log = await fsp.readFile(logFile, 'utf8');
    expect(log).not.toMatch(/"level":(50|60)/); // no error or fatal line
  }

  it('gives 8 concurrent readers the numbers of the local copy, cold then warm; warm costs next to nothing', { timeout: 90_000 }, async () => {
    m = await mount({ tb, foreground: true, args: ['--cache-dir', cacheDir] });
    const root = join(m.path, PREFIX);

    const cold = await round('cold', root);
    expect(cold.mediaBytes).toBeGreaterThanOrEqual(chunkBytes);
    expect(cold.media).toBeGreaterThanOrEqual(chunkFiles);
    expect(cold.list).toBeLessThanOrEqual(COLD_LIST_MAX);
    // Eight readers of the same files share one download per block: concurrent readers wait on the
    // same download, later ones find the block in the disk cache (or the kernel's page cache). So the
    // round costs at most one request per block and the bytes of the bucket, like a single reader.
    // Measured 2026-11-21: one reader (the --only-dir test below) 75 media requests, 27.9 MB. Eight:
    // 102-116 requests, 56-62 MB, of which 27-40 fetched a block again a few ms after its first
    // download ended, before its background disk write had landed. With the block kept in flight
    // until the disk has it: 75 requests, 27.9 MB, none repeated.
    // (Soft, so that a failure here still lets the warm round below be checked and measured.)
    expect.soft(cold.repeated).toBe(0);
    expect.soft(cold.media).toBeLessThanOrEqual(storeBlocks);
    expect.soft(cold.mediaBytes).toBeLessThanOrEqual(storeBytes);

    const warm = await round('warm', root);
    // The kernel's page cache is kept across opens (size and mtime unchanged), and every name that
    // exists is answered from listings within the metadata TTL (60 s). A listing says "no such name"
    // only within --metadata-cache-negative-ttl-secs (5 s) of when it was taken, as README promises (a
    // new object shows up after it), so the warm round asks GCS only about missing names (chunks of
    // fill values, a plain store's .zarray), each at most once per negative TTL however long the round
    // takes: eight readers share a lookup and its answer. Read from the log, by the name each list
    // request starts at (a lookup lists from the name it looks up). Measured: 4-5 list requests, each
    // for a different missing name (2026-11-25). With the negative cache off, a missing name is asked
    // again within milliseconds.
    expect(warm.media).toBe(0);
    expect(warm.mediaBytes).toBe(0);
    const asked = new Map<string, number[]>();
    const others: string[] = [];
    for (const e of warm.log) {
      const name = askedName(e);
      const folder = relistedFolder(e);
      if (name !== null && !existsSync(join(tb.root, tb.bucket, name))) asked.set(name, [...(asked.get(name) ?? []), e.startMs]);
      else if (folder !== null) asked.set(folder, [...(asked.get(folder) ?? []), e.startMs]);
      else others.push(`${e.kind} ${JSON.stringify(e.list ?? e.object)}`);
    }
    // A few listings besides (a listing that expired), never a name that exists. A whole folder listed
    // again is a lookup of one of its missing names (every name that exists is held for the metadata
    // TTL): CI once saw 4 on a round slowed past the negative TTL, so those are held to the same
    // spacing as the names below, not counted here.
    expect(others.length, others.join('\n')).toBeLessThanOrEqual(3);
    for (const [name, starts] of asked) {
      // Arrivals: the window opens when the daemon sends the request, a little before it arrives.
      for (let i = 1; i < starts.length; i++) expect(starts[i]! - starts[i - 1]!, name).toBeGreaterThanOrEqual(NEGATIVE_TTL_MS - 1_000);
    }
    await expectCleanLog(m.logFile);
  });

  it('gives the same numbers after the daemon is stopped and started again on the same --cache-dir', { timeout: 90_000 }, async () => {
    const path = m.path;
    const daemon = m.daemon!;
    const exited = new Promise<number | null>((done) => daemon.once('exit', (code) => done(code)));
    daemon.kill('SIGTERM'); // unmounts and exits 0, releasing the cache directory
    expect(await exited).toBe(0);
    expect(await isMounted(path)).toBe(false);
    await unmount(path);

    m = await mount({ tb, foreground: true, mountPoint: path, args: ['--cache-dir', cacheDir] });
    // Two readers: what is asked of GCS after a restart does not depend on how many read (8 cost 14 s).
    const restarted = await round('restarted', join(m.path, PREFIX), 2);
    // Measured: 0 media requests (every block from the disk cache) and 1 list request (the new
    // daemon's metadata caches start empty).
    expect(restarted.media).toBe(0);
    expect(restarted.list).toBeLessThanOrEqual(COLD_LIST_MAX);
    await expectCleanLog(m.logFile);
  });

  it('reads the same through --only-dir', { timeout: 60_000 }, async () => {
    // A cache directory of its own: the reader reads each chunk twice (slices, then all of it), and the
    // second read must not depend on the kernel's page cache, which anything on the machine may drop.
    const only = await mount({ tb, args: ['--only-dir', PREFIX, '--cache-dir', onlyDirCache] });
    const r = await round('only-dir', only.path, 1);
    // Measured: 75 media requests, 27.9 MB: each object that xarray needs read once (a consolidated
    // store's per-array .zarray and .zattrs are never read: .zmetadata holds them).
    expect(r.mediaBytes).toBeGreaterThanOrEqual(chunkBytes);
    expect(r.mediaBytes).toBeLessThanOrEqual(storeBytes);
    expect(r.repeated).toBe(0);
    expect(r.list).toBeLessThanOrEqual(COLD_LIST_MAX);
    await expectCleanLog(only.logFile);
    await unmount(only.path);
  });
});
