import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { benchBucket, cleanup, dropPageCache, fmt, median, sh, type BenchBucket } from './harness.js';
import { curlMedia, curlResumable, splitFile } from './upload-ceiling.js';
import { objectFile, WriteMounts, type MountRun, type ThroughMount } from './write-mounts.js';
import { zarrStore } from './write-zarr.js';

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

const mbps = (bytes: number, s: number) => bytes / MIB / s;

async function sizeOf(path: string): Promise<number | null> {
  return (await fsp.stat(path).catch(() => null))?.size ?? null;
}

export async function writeScenario(): Promise<string> {
  const b = await benchBucket('write-bench');
  // The bytes the writers read: in memory (/dev/shm) when there is one, so their reads cost no disk.
  const scratch = await fsp.mkdtemp(join(await fsp.access('/dev/shm').then(() => '/dev/shm', () => b.dir), 'gcsmount-wbench-'));
  const mounts = new WriteMounts(b);

  try {
    await b.emulator.setKnobs({ latencyMs: LATENCY_MS, bandwidthBytesPerSec: BANDWIDTH });
    const big = PARTS.has('dd') ? await sequential(b, scratch, mounts.throughMount) : '(dd part not run: GCSMOUNT_BENCH_WRITE_PARTS)';
    const ckpt = PARTS.has('checkpoint') ? await checkpoint(b, scratch, mounts.throughMount) : '(checkpoint part not run: GCSMOUNT_BENCH_WRITE_PARTS)';
    const zarr = PARTS.has('zarr') ? await zarrStore(b, mounts.throughMount, SIZE.zarrRows, SIZE.zarrCols) : '(zarr part not run: GCSMOUNT_BENCH_WRITE_PARTS)';
    return [
      `Emulator in its own process with the data-path bench's knobs: ${LATENCY_MS} ms before each answer, ${BANDWIDTH / MIB} MiB/s per response body (the cap does not apply to request bodies, so no upload is capped). ` +
        `gcsmount defaults (--write-block-size-mb 32, 4 chunks in flight mount-wide), a fresh --cache-dir per mount (files are staged in it). Writers read from ${scratch.startsWith('/dev/shm') ? '/dev/shm' : 'a temp folder'}. ` +
        `${SIZE.rounds} round(s) per measurement, curl and gcsmount in turn; medians. Page cache ${mounts.dropped ? 'dropped before each measured write' : 'not dropped (not root)'}. ` +
        `Daemon CPU is the whole process's; "main" is its JavaScript thread's share (/proc/PID/task/PID/stat).${QUICK ? ' **Quick mode (GCSMOUNT_BENCH_QUICK=1): sizes shrunk, not a result.**' : ''}`,
      '',
      big,
      '',
      ckpt,
      '',
      zarr,
    ].join('\n');
  } finally {
    await mounts.unmountAll();
    await fsp.rm(scratch, { recursive: true, force: true });
    await cleanup(b);
  }
}

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
