import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { benchBucket, cleanup, dropPageCache, GCSMOUNT, mountBench, primeHashes, primeMedia, sh, type BenchBucket } from './harness.js';

/**
 * The cost of metadata in front of a cold Zarr load (issue 27): an ERA5-like store with nested chunk
 * keys (`t2m/T/Y/X`, a folder per (T, Y) holding two chunks: every chunk's lookups pass through folders
 * nobody has listed), read through a fresh mount by xarray (`open_zarr(store).t2m.load()`, 16 dask
 * threads) and by a shuffled loader (8 processes opening random chunk files of all three variables).
 * The emulator answers after 30 ms, at 50 MB/s per response, and a list page costs 0.2 ms per entry
 * (real GCS: 100-300 ms for 1,000 entries). Requests by kind against the media requests, and time
 * against the local copy in the same run; a baseline build (GCSMOUNT_BASELINE_BIN) in the same run too.
 */

const PY = '/usr/bin/python3';
const FIXTURES = fileURLToPath(new URL('../../test/fixtures/', import.meta.url));
const TIME_STEPS = 64;
const LATENCY_MS = 30;
const BANDWIDTH = 50_000_000;
const LIST_MS_PER_ENTRY = 0.2;
const LOADER_PROCESSES = 8;
const LOADER_FILES = 240;

const LOAD = `
import sys, time, json
import dask
import xarray as xr
dask.config.set(scheduler='threads', num_workers=16)
t0 = time.perf_counter()
ds = xr.open_zarr(sys.argv[1])
v = ds.t2m.load()
print(json.dumps({'seconds': time.perf_counter() - t0, 'sum': float(v.sum())}))
`;

/** Opens and reads the chunk files named on stdin in a seeded shuffle, spread over N processes. */
const LOADER = `
import sys, os, time, json, random, zlib
from multiprocessing import Pool
root, procs = sys.argv[1], int(sys.argv[2])
names = sys.stdin.read().split()
def read(name):
    with open(os.path.join(root, name), 'rb') as f:
        return name, zlib.crc32(f.read())
t0 = time.perf_counter()
with Pool(procs) as p:
    crcs = dict(p.map(read, names, chunksize=1))
print(json.dumps({'seconds': time.perf_counter() - t0, 'crc': zlib.crc32(json.dumps(sorted(crcs.items())).encode())}))
`;

interface Row {
  reader: string;
  round: string;
  seconds: number;
  media: number;
  list: number;
  metadata: number;
  check: string;
}

export async function zarrNestedScenario(): Promise<string> {
  const b = await benchBucket('zarr-nested');
  const local = join(b.root, b.bucket);
  const rows: Row[] = [];
  try {
    const made = await sh(PY, [join(FIXTURES, 'make_nested_zarr.py'), local, '--time', String(TIME_STEPS)]);
    if (made.code !== 0) throw new Error(`make_nested_zarr.py: ${made.stderr}`);
    const store = JSON.parse(made.stdout.trim()) as { files: number; bytes: number };
    await primeMedia(b, await primeHashes(b));
    await b.emulator.setKnobs({ latencyMs: LATENCY_MS, bandwidthBytesPerSec: BANDWIDTH, listMsPerEntry: LIST_MS_PER_ENTRY });
    const chunks = shuffledChunks(LOADER_FILES);

    const load = async (reader: string, round: string, root: string) => {
      await b.emulator.resetStats();
      await dropPageCache();
      const r = await sh(PY, ['-c', LOAD, join(root, 'era5.zarr')]);
      if (r.code !== 0) throw new Error(`load through ${root}: ${r.stderr}`);
      const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { seconds: number; sum: number };
      rows.push({ reader, round, seconds: out.seconds, ...(await counts(b)), check: `sum ${out.sum.toFixed(0)}` });
    };
    const loader = async (reader: string, round: string, root: string) => {
      await b.emulator.resetStats();
      await dropPageCache();
      const r = await sh('sh', ['-c', `printf '%s\\n' ${chunks.join(' ')} | ${PY} -c "$0" "$1" "$2"`, LOADER, join(root, 'era5.zarr'), String(LOADER_PROCESSES)]);
      if (r.code !== 0) throw new Error(`loader through ${root}: ${r.stderr}`);
      const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { seconds: number; crc: number };
      rows.push({ reader, round, seconds: out.seconds, ...(await counts(b)), check: `crc ${out.crc}` });
    };

    await load('local copy', 'xarray load, cold', local);
    await loader('local copy', `loader, ${LOADER_FILES} random chunks`, local);
    const builds: [string, string][] = [['gcsmount', GCSMOUNT]];
    if (process.env.GCSMOUNT_BASELINE_BIN) builds.push([`baseline (${process.env.GCSMOUNT_BASELINE_LABEL ?? process.env.GCSMOUNT_BASELINE_BIN})`, process.env.GCSMOUNT_BASELINE_BIN]);
    for (const [label, bin] of builds) {
      const cache = await fsp.mkdtemp(join(b.dir, 'cache-'));
      const m = await mountQuietly(b, ['--cache-dir', cache], bin);
      await load(label, 'xarray load, cold (fresh mount)', m.path);
      await load(label, 'xarray load, warm (same mount)', m.path);
      await m.unmount();
      const cache2 = await fsp.mkdtemp(join(b.dir, 'cache-'));
      const m2 = await mountQuietly(b, ['--cache-dir', cache2], bin);
      await loader(label, `loader, ${LOADER_FILES} random chunks, cold (fresh mount)`, m2.path);
      await m2.unmount();
    }
    const localOf = (round: string) => rows.find((r) => r.reader === 'local copy' && round.startsWith(r.round.split(',')[0]!))!;
    return [
      `Store: era5.zarr, ${store.files} files, ${(store.bytes / 1e6).toFixed(0)} MB (3 float32 variables, ${TIME_STEPS} x 361 x 720, chunks 1 x 181 x 360, ` +
        `Blosc LZ4, nested keys \`t2m/T/Y/X\`, consolidated). Emulator in its own process: ${LATENCY_MS} ms per request, ${BANDWIDTH / 1e6} MB/s per response, ` +
        `${LIST_MS_PER_ENTRY} ms per list entry returned. Page cache dropped before each round; every gcsmount round on a fresh \`--cache-dir\`.`,
      '',
      '| reader | round | time | vs local | media | list | metadata | all / media | check |',
      '|---|---|---|---|---|---|---|---|---|',
      ...rows.map((r) => {
        const base = localOf(r.round);
        const all = r.media + r.list + r.metadata;
        return `| ${r.reader} | ${r.round} | ${r.seconds.toFixed(2)} s | ${(r.seconds / base.seconds).toFixed(2)}x | ${r.media} | ${r.list} | ${r.metadata} | ${r.media ? (all / r.media).toFixed(2) : '-'} | ${r.check} |`;
      }),
      '',
      'Goal (issue 27): all requests <= 1.15 x media requests on a cold load. The check column must match the local copy\'s.',
    ].join('\n');
  } finally {
    await cleanup(b);
  }
}

async function counts(b: BenchBucket): Promise<{ media: number; list: number; metadata: number }> {
  const r = (await b.emulator.stats()).requests;
  return { media: r.media, list: r.list, metadata: r.metadata };
}

/** The store's chunk keys, all three variables, in a seeded shuffle (a loader's random patches). */
function shuffledChunks(n: number): string[] {
  const keys: string[] = [];
  for (const v of ['t2m', 'u10', 'v10']) for (let t = 0; t < TIME_STEPS; t++) for (let y = 0; y < 2; y++) for (let x = 0; x < 2; x++) keys.push(`${v}/${t}/${y}/${x}`);
  let seed = 27;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  for (let i = keys.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [keys[i], keys[j]] = [keys[j]!, keys[i]!];
  }
  return keys.slice(0, n);
}

/** A mount made while the emulator answers at once: the start-up check is not what is measured. */
async function mountQuietly(b: BenchBucket, args: string[], bin: string): Promise<{ path: string; unmount(): Promise<void> }> {
  await b.emulator.setKnobs({ latencyMs: 0 });
  try {
    return await mountBench(b, args, bin);
  } finally {
    await b.emulator.setKnobs({ latencyMs: LATENCY_MS });
  }
}
