import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import {
  benchBucket, cleanup, cpuSeconds, daemonPid, dropPageCache, median, mountBench, mountStats, peakRssMiB, sh, threadCpuSeconds, timed, type BenchBucket, type MountStats,
} from './harness.js';
import type { EmulatorStats } from '../emulator/server.js';

/**
 * Writes through the mount against curl uploading the same bytes to the same emulator (its own process)
 * in the same run: a 1 GiB sequential `dd` (streamed to a resumable upload in 32 MiB chunks), a
 * checkpoint of 64 files of 64 MiB by 16 writers at once, and a Zarr store of 10,000 chunk files of
 * 16 KiB written by xarray (requests per file, and the same store written to a local folder).
 * GCSMOUNT_BENCH_QUICK=1 shrinks every size (and runs one round) to check the scenario works;
 * GCSMOUNT_BENCH_ROUNDS=N runs N rounds of the full sizes (3 by default).
 */

const MIB = 1024 * 1024;
const GIB = 1024 * MIB;
const PY = '/usr/bin/python3';
const QUICK = process.env.GCSMOUNT_BENCH_QUICK === '1';
const SIZE = QUICK
  ? { bigMiB: 64, ckptFiles: 8, ckptMiB: 8, zarrRows: 20, zarrCols: 25, rounds: 1 }
  : { bigMiB: 1024, ckptFiles: 64, ckptMiB: 64, zarrRows: 100, zarrCols: 100, rounds: Number(process.env.GCSMOUNT_BENCH_ROUNDS ?? 3) };
/** GCSMOUNT_BENCH_WRITE_PARTS=dd,checkpoint,zarr (all by default): the Zarr part alone takes ~20 min. */
const PARTS = new Set((process.env.GCSMOUNT_BENCH_WRITE_PARTS ?? 'dd,checkpoint,zarr').split(',').map((p) => p.trim()));
/** gcsmount's default --write-block-size-mb: the resumable ceiling sends chunks of the same size. */
const CHUNK = 32 * MIB;
/** The data-path bench's knobs. The bandwidth cap applies to response bodies only: uploads are not capped. */
const LATENCY_MS = 50;
const BANDWIDTH = 50 * MIB;
const PARALLEL = [2, 4, 8];
const CKPT_WRITERS = 16;
/** Threads xarray's dask writes and reads the Zarr store with (as the zarr-nested bench reads). */
const ZARR_THREADS = 16;

/**
 * A checkpoint writer: copies the shard to each name given, 1 MiB at a time, as Python code saving a
 * checkpoint writes (open, write, close: not dd, whose dup2 of its output makes a first close, a FUSE
 * flush that uploads the still empty new file: one more request per file).
 */
const CKPT_WRITER = `
import sys, shutil
src, folder = sys.argv[1], sys.argv[2]
for name in sys.argv[3:]:
    with open(src, 'rb') as s, open(folder + '/' + name, 'wb') as d:
        shutil.copyfileobj(s, d, 1 << 20)
`;

const WRITE_ZARR = `
import sys, time, json
import numpy as np, xarray as xr, dask
path, rows, cols, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dask.config.set(scheduler='threads', num_workers=threads)
data = np.random.default_rng(0).random((64 * rows, 64 * cols), dtype=np.float32)
ds = xr.Dataset({'v': (('y', 'x'), data)}).chunk({'y': 64, 'x': 64})
t0 = time.perf_counter()
ds.to_zarr(path, mode='w-', encoding={'v': {'chunks': (64, 64), 'compressor': None}})
print(json.dumps({'seconds': time.perf_counter() - t0}))
`;

const READ_ZARR = `
import sys, time, json
import numpy as np, xarray as xr, dask
path, rows, cols, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dask.config.set(scheduler='threads', num_workers=threads)
t0 = time.perf_counter()
v = xr.open_zarr(path).v.values
seconds = time.perf_counter() - t0
expected = np.random.default_rng(0).random((64 * rows, 64 * cols), dtype=np.float32)
print(json.dumps({'seconds': seconds, 'equal': bool(np.array_equal(v, expected))}))
`;

interface Mounted {
  path: string;
  pid: number;
  unmount(): Promise<void>;
}

/** What one measured write through a mount cost the daemon. */
interface MountRun {
  seconds: number;
  cpu: number;
  /** Of `cpu`, the daemon's main (JavaScript) thread's. */
  mainCpu: number;
  rssMiB: number;
  emulator: EmulatorStats;
  /** Deltas of the daemon's gcs_requests_* counters. */
  counters: Record<string, number>;
}

const objectFile = (b: BenchBucket, name: string) => join(b.root, b.bucket, name);
const mbps = (bytes: number, s: number) => bytes / MIB / s;
const fmt = (x: number, digits = 0) => (Number.isFinite(x) ? x.toFixed(digits) : '-');

async function sizeOf(path: string): Promise<number | null> {
  return (await fsp.stat(path).catch(() => null))?.size ?? null;
}

async function waitGone(pid: number): Promise<void> {
  for (let i = 0; i < 600 && (await fsp.access(`/proc/${pid}`).then(() => true, () => false)); i++) await new Promise((r) => setTimeout(r, 100));
}

function counterDelta(before: MountStats, after: MountStats): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(after.counters)) if (k.startsWith('gcs_requests_')) out[k.slice('gcs_requests_'.length)] = v - (before.counters[k] ?? 0);
  return out;
}

/** Throws with curl's output unless its transfers answered `want`, in order. */
function checkCodes(what: string, r: { stdout: string; stderr: string; code: number }, want: string[]): void {
  const got = r.stdout.split('\n').filter(Boolean);
  if (r.code !== 0 || got.length !== want.length || got.some((c, i) => c !== want[i])) {
    throw new Error(`${what}: curl exit ${r.code}, statuses ${got.join(' ')} (wanted ${[...new Set(want)].join('/')}): ${r.stderr.trim()}`);
  }
}

/** A curl config group uploading `file` as the whole object `name` in one request (uploadType=media). */
function mediaGroup(b: BenchBucket, name: string, file: string): string {
  return [
    `url = "${b.emulator.url}/upload/storage/v1/b/${b.bucket}/o?uploadType=media&name=${encodeURIComponent(name)}"`,
    `upload-file = "${file}"`,
    'request = "POST"',
    'header = "Expect:"',
    'header = "Content-Type: application/octet-stream"',
    'output = "/dev/null"',
    'write-out = "%{http_code}\\n"',
  ].join('\n');
}

/** curl uploading `files` as objects `names`, `parallel` at a time in one curl process; the seconds it took. */
async function curlMedia(b: BenchBucket, names: string[], files: string[], parallel: number, cfg: string): Promise<number> {
  const groups = names.map((n, i) => mediaGroup(b, n, files[i]!));
  await fsp.writeFile(cfg, `${parallel > 1 ? `parallel\nparallel-max = ${parallel}\n` : ''}${groups.join('\nnext\n')}\n`);
  const t = await timed(() => sh('curl', ['-s', '-K', cfg]));
  checkCodes(`media upload of ${names.length} objects, ${parallel} at a time`, t.result, names.map(() => '200'));
  return t.seconds;
}

/**
 * curl sending `chunks` (files, in order) to one resumable session for `name`, as gcsmount streams: the
 * session POST, then a PUT per chunk with `Content-Range: bytes a-b/*` (308), the last with the total.
 * One curl process for the PUTs, so they share a connection.
 */
async function curlResumable(b: BenchBucket, name: string, chunks: string[], chunkBytes: number, total: number, cfg: string): Promise<number> {
  const t = await timed(async () => {
    const start = await sh('curl', ['-s', '-D', '-', '-o', '/dev/null', '-X', 'POST', '-H', 'Content-Length: 0', `${b.emulator.url}/upload/storage/v1/b/${b.bucket}/o?uploadType=resumable&name=${encodeURIComponent(name)}`]);
    const location = /^location:\s*(\S+)/im.exec(start.stdout)?.[1];
    if (start.code !== 0 || !location) throw new Error(`resumable upload: no session: ${start.stdout} ${start.stderr}`);
    const groups = chunks.map((file, i) => {
      const from = i * chunkBytes;
      const to = Math.min(total, from + chunkBytes) - 1;
      return [
        `url = "${location}"`,
        `upload-file = "${file}"`,
        `header = "Content-Range: bytes ${from}-${to}/${i === chunks.length - 1 ? total : '*'}"`,
        'header = "Expect:"',
        'output = "/dev/null"',
        'write-out = "%{http_code}\\n"',
      ].join('\n');
    });
    await fsp.writeFile(cfg, `${groups.join('\nnext\n')}\n`);
    return sh('curl', ['-s', '-K', cfg]);
  });
  checkCodes('resumable upload', t.result, chunks.map((_, i) => (i === chunks.length - 1 ? '200' : '308')));
  return t.seconds;
}

/** `split` of `file` into pieces of `bytes` under `dir`, their paths in order. */
async function splitFile(file: string, bytes: number, dir: string): Promise<string[]> {
  await fsp.rm(dir, { recursive: true, force: true });
  await fsp.mkdir(dir);
  const r = await sh('split', ['-b', String(bytes), '-d', '-a', '4', file, join(dir, 'p')]);
  if (r.code !== 0) throw new Error(`split: ${r.stderr}`);
  return (await fsp.readdir(dir)).sort().map((f) => join(dir, f));
}

export async function writeScenario(): Promise<string> {
  const b = await benchBucket('write-bench');
  // The bytes the writers read: in memory (/dev/shm) when there is one, so their reads cost no disk.
  const scratch = await fsp.mkdtemp(join(await fsp.access('/dev/shm').then(() => '/dev/shm', () => b.dir), 'gcsmount-wbench-'));
  const mounted = new Set<Mounted>();
  let dropped = false;

  /** A fresh mount on a fresh --cache-dir (staging goes in it), as a user would mount. */
  const mount = async (label: string): Promise<Mounted> => {
    const cacheDir = join(b.dir, `cache-${label}`);
    const m = await mountBench(b, ['--cache-dir', cacheDir]);
    const pid = await daemonPid(m.path);
    const entry: Mounted = {
      path: m.path,
      pid: pid ?? 0,
      unmount: async () => {
        mounted.delete(entry);
        await m.unmount();
        if (pid) await waitGone(pid);
        await fsp.rm(cacheDir, { recursive: true, force: true });
      },
    };
    mounted.add(entry);
    if (!pid) {
      await entry.unmount();
      throw new Error('cannot find the daemon');
    }
    return entry;
  };

  /** `work` through a fresh mount: time, the daemon's CPU and peak RSS, and the requests it made. */
  const throughMount = async (label: string, prepare: (m: Mounted) => Promise<void>, work: (m: Mounted) => Promise<void>): Promise<MountRun> => {
    const m = await mount(label);
    try {
      await prepare(m);
      dropped = await dropPageCache();
      await b.emulator.resetStats();
      const s0 = await mountStats(m.path);
      const c0 = await cpuSeconds(m.pid);
      const main0 = await threadCpuSeconds(m.pid);
      const t = await timed(() => work(m));
      const cpu = (await cpuSeconds(m.pid)) - c0;
      const mainCpu = (await threadCpuSeconds(m.pid)) - main0;
      const emulator = await b.emulator.stats();
      const counters = counterDelta(s0, await mountStats(m.path));
      return { seconds: t.seconds, cpu, mainCpu, rssMiB: await peakRssMiB(m.pid), emulator, counters };
    } finally {
      await m.unmount();
    }
  };

  try {
    await b.emulator.setKnobs({ latencyMs: LATENCY_MS, bandwidthBytesPerSec: BANDWIDTH });
    const big = PARTS.has('dd') ? await sequential(b, scratch, throughMount) : '(dd part not run: GCSMOUNT_BENCH_WRITE_PARTS)';
    const ckpt = PARTS.has('checkpoint') ? await checkpoint(b, scratch, throughMount) : '(checkpoint part not run: GCSMOUNT_BENCH_WRITE_PARTS)';
    const zarr = PARTS.has('zarr') ? await zarrStore(b, throughMount) : '(zarr part not run: GCSMOUNT_BENCH_WRITE_PARTS)';
    return [
      `Emulator in its own process with the data-path bench's knobs: ${LATENCY_MS} ms before each answer, ${BANDWIDTH / MIB} MiB/s per response body (the cap does not apply to request bodies, so no upload is capped). ` +
        `gcsmount defaults (--write-block-size-mb 32, 4 chunks in flight mount-wide), a fresh --cache-dir per mount (files are staged in it). Writers read from ${scratch.startsWith('/dev/shm') ? '/dev/shm' : 'a temp folder'}. ` +
        `${SIZE.rounds} round(s) per measurement, curl and gcsmount in turn; medians. Page cache ${dropped ? 'dropped before each measured write' : 'not dropped (not root)'}. ` +
        `Daemon CPU is the whole process's; "main" is its JavaScript thread's share (/proc/PID/task/PID/stat).${QUICK ? ' **Quick mode (GCSMOUNT_BENCH_QUICK=1): sizes shrunk, not a result.**' : ''}`,
      '',
      big,
      '',
      ckpt,
      '',
      zarr,
    ].join('\n');
  } finally {
    for (const m of [...mounted]) await m.unmount().catch(() => undefined);
    await fsp.rm(scratch, { recursive: true, force: true });
    await cleanup(b);
  }
}

type ThroughMount = (label: string, prepare: (m: Mounted) => Promise<void>, work: (m: Mounted) => Promise<void>) => Promise<MountRun>;

/** 1. One big file written in order by dd, against curl's resumable, single-request and parallel uploads. */
async function sequential(b: BenchBucket, scratch: string, throughMount: ThroughMount): Promise<string> {
  const bytes = SIZE.bigMiB * MIB;
  const src = join(scratch, 'big.bin');
  const made = await sh('dd', ['if=/dev/urandom', `of=${src}`, 'bs=1M', `count=${SIZE.bigMiB}`, 'status=none']);
  if (made.code !== 0) throw new Error(`dd: ${made.stderr}`);
  const chunks = await splitFile(src, CHUNK, join(scratch, 'chunks'));
  const ceilings = new Map<string, number[]>();
  const note = (k: string, s: number) => ceilings.set(k, [...(ceilings.get(k) ?? []), s]);
  const mountRuns: (MountRun & { check: string; uploads: number })[] = [];
  const best: number[] = [];
  const resumableUploads = 1 + chunks.length;

  for (let r = 0; r < SIZE.rounds; r++) {
    let roundBest = Infinity;
    const ceiling = async (key: string, run: () => Promise<number>, objects: string[], sizes: number[]) => {
      await dropPageCache();
      const s = await run();
      for (const [i, o] of objects.entries()) {
        const got = await sizeOf(objectFile(b, o));
        if (got !== sizes[i]) throw new Error(`${key}: object ${o} holds ${got} bytes, not ${sizes[i]}`);
        await fsp.rm(objectFile(b, o), { force: true });
      }
      note(key, s);
      roundBest = Math.min(roundBest, s);
    };
    await ceiling('resumable', () => curlResumable(b, `r${r}-resumable`, chunks, CHUNK, bytes, join(b.dir, 'resumable.cfg')), [`r${r}-resumable`], [bytes]);
    await ceiling('media', () => curlMedia(b, [`r${r}-media`], [src], 1, join(b.dir, 'media.cfg')), [`r${r}-media`], [bytes]);
    for (const n of PARALLEL) {
      const pieces = await splitFile(src, bytes / n, join(scratch, `par-${n}`));
      const names = pieces.map((_, i) => `r${r}-par${n}-${i}`);
      await ceiling(`par${n}`, () => curlMedia(b, names, pieces, n, join(b.dir, `par-${n}.cfg`)), names, pieces.map(() => bytes / n));
      await fsp.rm(join(scratch, `par-${n}`), { recursive: true, force: true });
    }
    best.push(roundBest);

    const name = `r${r}-mount.bin`;
    let atExit: number | null = null;
    const run = await throughMount(`big-${r}`, async () => undefined, async (m) => {
      const dd = await sh('dd', [`if=${src}`, `of=${join(m.path, name)}`, 'bs=1M', 'status=none']);
      if (dd.code !== 0) throw new Error(`dd through the mount: ${dd.stderr.trim()}`);
      atExit = await sizeOf(objectFile(b, name));
    });
    // After the unmount (the daemon gone): the object must hold the source's bytes.
    const same = (await sh('cmp', ['-s', src, objectFile(b, name)])).code === 0;
    const check = `${atExit === bytes ? 'object complete at dd exit' : `object ${atExit === null ? 'absent' : `${atExit} bytes`} at dd exit`}; ${same ? 'bytes equal' : '**bytes differ after unmount**'}`;
    mountRuns.push({ ...run, check, uploads: run.emulator.requests.upload });
    await fsp.rm(objectFile(b, name), { force: true });
  }

  const labels: [string, string, string][] = [
    ['resumable', `curl: one resumable session, ${chunks.length} PUTs of ${CHUNK / MIB} MiB in order on one connection`, `curl -X POST '...?uploadType=resumable&name=N'; curl -K cfg (PUT -T chunk, Content-Range: bytes a-b/*, last a-b/${bytes})`],
    ['media', 'curl: one request', `curl -X POST -T big.bin '...?uploadType=media&name=N'`],
    ...PARALLEL.map((n): [string, string, string] => [`par${n}`, `curl: ${n} objects of 1/${n} at once`, `curl -K cfg (parallel-max ${n}; POST -T piece, uploadType=media)`]),
  ];
  const ceilingMedian = median(best);
  const mountMedian = median(mountRuns.map((x) => x.seconds));
  const ratios = mountRuns.map((x, i) => best[i]! / x.seconds);
  const cpuPerGiB = mountRuns.map((x) => x.cpu / (bytes / GIB));
  const mainPerGiB = mountRuns.map((x) => x.mainCpu / (bytes / GIB));
  return [
    `#### 1. Sequential write of ${SIZE.bigMiB} MiB: \`dd bs=1M\` through the mount, until dd exits (close sends the last chunk)`,
    '',
    '| writer | command | MiB/s (median) | range | upload requests | daemon CPU s per GiB (median) | check |',
    '|---|---|---|---|---|---|---|',
    ...labels.map(([k, label, cmd]) => {
      const s = ceilings.get(k)!;
      const requests = k === 'resumable' ? resumableUploads : k === 'media' ? 1 : Number(k.slice(3));
      return `| ${label} | \`${cmd}\` | ${fmt(mbps(bytes, median(s)))} | ${fmt(mbps(bytes, Math.max(...s)))}-${fmt(mbps(bytes, Math.min(...s)))} | ${requests} | - | sizes checked |`;
    }),
    `| **gcsmount** | \`dd if=big.bin of=MNT/big bs=1M\` | **${fmt(mbps(bytes, mountMedian))}** | ${fmt(mbps(bytes, Math.max(...mountRuns.map((x) => x.seconds))))}-${fmt(mbps(bytes, Math.min(...mountRuns.map((x) => x.seconds))))} | ${median(mountRuns.map((x) => x.uploads))} | **${fmt(median(cpuPerGiB), 2)}** | ${[...new Set(mountRuns.map((x) => x.check))].join('; ')} |`,
    '',
    'gcsmount\'s upload requests include one for an empty object: dd opens its output, dup2()s it onto descriptor 1 and closes the first descriptor, a FUSE flush of the new, still empty file, which is uploaded.',
    '',
    `Ceiling (the fastest curl upload of each round, median): ${fmt(mbps(bytes, ceilingMedian))} MiB/s. gcsmount / ceiling: **${fmt(median(ratios), 2)}** (range ${fmt(Math.min(...ratios), 2)}-${fmt(Math.max(...ratios), 2)}; goal >= 0.8). Daemon CPU s per GiB: **${fmt(median(cpuPerGiB), 2)}** (range ${fmt(Math.min(...cpuPerGiB), 2)}-${fmt(Math.max(...cpuPerGiB), 2)}; goal <= 1.0), of which the main thread ${fmt(median(mainPerGiB), 2)}. Peak daemon RSS ${fmt(Math.max(...mountRuns.map((x) => x.rssMiB)))} MiB.`,
  ].join('\n');
}

/** 2. A checkpoint: many files of tens of MiB, 16 writers at once, against curl uploading them 16 at a time. */
async function checkpoint(b: BenchBucket, scratch: string, throughMount: ThroughMount): Promise<string> {
  const fileBytes = SIZE.ckptMiB * MIB;
  const bytes = SIZE.ckptFiles * fileBytes;
  const writers = Math.min(CKPT_WRITERS, SIZE.ckptFiles);
  const src = join(scratch, 'shard.bin');
  const made = await sh('dd', ['if=/dev/urandom', `of=${src}`, 'bs=1M', `count=${SIZE.ckptMiB}`, 'status=none']);
  if (made.code !== 0) throw new Error(`dd: ${made.stderr}`);
  const names = Array.from({ length: SIZE.ckptFiles }, (_, i) => `shard-${String(i).padStart(3, '0')}.bin`);
  const curlS: number[] = [];
  const runs: (MountRun & { complete: number })[] = [];
  for (let r = 0; r < SIZE.rounds; r++) {
    const folder = `r${r}-ckpt-curl`;
    await dropPageCache();
    curlS.push(await curlMedia(b, names.map((n) => `${folder}/${n}`), names.map(() => src), writers, join(b.dir, 'ckpt.cfg')));
    for (const n of names) if ((await sizeOf(objectFile(b, `${folder}/${n}`))) !== fileBytes) throw new Error(`checkpoint: curl's ${folder}/${n} is incomplete`);
    await fsp.rm(objectFile(b, folder), { recursive: true, force: true });

    const dir = `r${r}-ckpt`;
    let complete = 0;
    const run = await throughMount(
      `ckpt-${r}`,
      async (m) => {
        const mk = await sh('mkdir', [join(m.path, dir)]);
        if (mk.code !== 0) throw new Error(`mkdir through the mount: ${mk.stderr}`);
      },
      async (m) => {
        const results = await Promise.all(
          Array.from({ length: writers }, (_, w) => sh(PY, ['-c', CKPT_WRITER, src, join(m.path, dir), ...names.filter((_, i) => i % writers === w)])),
        );
        const failed = results.find((x) => x.code !== 0);
        if (failed) throw new Error(`checkpoint writer: ${failed.stderr.trim()}`);
        for (const n of names) if ((await sizeOf(objectFile(b, `${dir}/${n}`))) === fileBytes) complete++;
      },
    );
    runs.push({ ...run, complete });
    await fsp.rm(objectFile(b, dir), { recursive: true, force: true });
  }
  const mountS = median(runs.map((x) => x.seconds));
  const ratios = runs.map((x, i) => curlS[i]! / x.seconds);
  return [
    `#### 2. A checkpoint: ${SIZE.ckptFiles} files of ${SIZE.ckptMiB} MiB (${fmt(bytes / MIB)} MiB) by ${writers} writers at once`,
    '',
    '| writer | command | time (median) | MiB/s | upload requests | daemon CPU s per GiB | daemon peak RSS | check |',
    '|---|---|---|---|---|---|---|---|',
    `| curl, ${writers} at a time | \`curl -K cfg\` (parallel-max ${writers}; POST -T shard, uploadType=media) | ${fmt(median(curlS), 2)} s | ${fmt(mbps(bytes, median(curlS)))} | ${SIZE.ckptFiles} | - | - | sizes checked |`,
    `| **gcsmount** | ${writers} x \`python3 -c CKPT_WRITER shard.bin MNT/dir NAMES...\` (open, copyfileobj in 1 MiB pieces, close; see src/bench/write.ts) | ${fmt(mountS, 2)} s | **${fmt(mbps(bytes, mountS))}** | ${median(runs.map((x) => x.emulator.requests.upload))} | **${fmt(median(runs.map((x) => x.cpu / (bytes / GIB))), 2)}** (main ${fmt(median(runs.map((x) => x.mainCpu / (bytes / GIB))), 2)}) | ${fmt(Math.max(...runs.map((x) => x.rssMiB)))} MiB | ${Math.min(...runs.map((x) => x.complete))}/${SIZE.ckptFiles} objects complete when the writers exited |`,
    '',
    `gcsmount / curl: **${fmt(median(ratios), 2)}** (range ${fmt(Math.min(...ratios), 2)}-${fmt(Math.max(...ratios), 2)}).`,
  ].join('\n');
}

/** 3. A Zarr store of small chunk files written by xarray: time and GCS requests per file, against a local folder. */
async function zarrStore(b: BenchBucket, throughMount: ThroughMount): Promise<string> {
  const { zarrRows: rows, zarrCols: cols } = SIZE;
  const chunkFiles = rows * cols;
  const args = (path: string) => [path, String(rows), String(cols), String(ZARR_THREADS)];
  const py = async (script: string, path: string) => {
    const r = await sh(PY, ['-c', script, ...args(path)]);
    if (r.code !== 0) throw new Error(`python (${path}): ${r.stderr.trim().split('\n').slice(-3).join(' ')}`);
    return JSON.parse(r.stdout.trim().split('\n').pop()!) as { seconds: number; equal?: boolean };
  };
  const local = join(b.dir, 'local', 'store.zarr');
  await fsp.mkdir(join(b.dir, 'local'));
  await dropPageCache();
  const localWrite = await timed(() => py(WRITE_ZARR, local));
  const localFiles = Number((await sh('sh', ['-c', `find '${local}' -type f | wc -l`])).stdout.trim());

  let write = { seconds: NaN };
  let read: { seconds: number; equal?: boolean } = { seconds: NaN };
  const run = await throughMount(
    'zarr',
    async () => undefined,
    async (m) => {
      write = await py(WRITE_ZARR, join(m.path, 'store.zarr'));
    },
  );
  const stored = Number((await sh('sh', ['-c', `find '${objectFile(b, 'store.zarr')}' -type f | wc -l`])).stdout.trim());
  // Read back through a fresh mount: what GCS holds, not what the writer's daemon remembers.
  await throughMount('zarr-read', async () => undefined, async (m) => {
    read = await py(READ_ZARR, join(m.path, 'store.zarr'));
  });
  const localRead = await py(READ_ZARR, local);

  const req = run.emulator.requests;
  const kinds = (Object.keys(req) as (keyof typeof req)[]).filter((k) => k !== 'total' && req[k] > 0).map((k) => `${k} ${req[k]}`).join(', ');
  const daemonKinds = Object.entries(run.counters).filter(([, v]) => v > 0).map(([k, v]) => `${k} ${v}`).join(', ');
  return [
    `#### 3. A Zarr store written by xarray: ${chunkFiles.toLocaleString('en')} chunk files of 16 KiB (float32, ${64 * rows} x ${64 * cols}, chunks 64 x 64, compressor=None, dask ${ZARR_THREADS} threads)`,
    '',
    '| where | command | write time | files/s | GCS requests per chunk file | check |',
    '|---|---|---|---|---|---|',
    `| local folder (${localFiles} files) | \`ds.to_zarr(local + '/store.zarr')\` | ${fmt(localWrite.result.seconds, 2)} s | ${fmt(localFiles / localWrite.result.seconds)} | - | read back ${localRead.equal ? 'equal' : '**differs**'} (${fmt(localRead.seconds, 2)} s) |`,
    `| **gcsmount** (${stored} objects stored) | \`ds.to_zarr(MNT + '/store.zarr')\` | ${fmt(write.seconds, 2)} s | **${fmt(stored / write.seconds)}** | **${fmt(req.total / chunkFiles, 2)}** (${req.total} requests: ${kinds}) | read back through a fresh mount with xr.open_zarr ${read.equal ? 'equal' : '**differs**'} (${fmt(read.seconds, 2)} s) |`,
    '',
    `Write time is to_zarr's own (python start-up and data generation left out). Requests as the emulator counted them during the write; the daemon's gcs_requests_* counters: ${daemonKinds || 'none'}. ` +
      `Daemon CPU during the write ${fmt(run.cpu, 2)} s (main thread ${fmt(run.mainCpu, 2)} s, ${fmt((run.mainCpu / stored) * 1000, 2)} ms per file), peak RSS ${fmt(run.rssMiB)} MiB. Goal: 1 request per chunk file. gcsmount / local time: ${fmt(write.seconds / localWrite.result.seconds, 1)}x. ` +
      'zarr 2\'s DirectoryStore writes each chunk to a `.partial` file and renames it into place: an upload and a move per chunk file, and the chunk files of one array share a folder, where the kernel runs renames one at a time (it holds the folder\'s lock across a rename within it).',
  ].join('\n');
}
