import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { DEFAULT_DOWNLOAD_WORKERS, DEFAULT_RANGE_GETS_PER_READER } from '../cli/params.js';
import { crc32c } from '../crc32c.js';
import { buildCServer, startServer } from './fuse-ceiling.js';
import { benchBucket, catToNull, cleanup, cpuSplit, curlBytes, curlRangesConfig, daemonPid, dropPageCache, GCSMOUNT, median, mountBench, primeHashes, sh, threadCpuSeconds, threadSwitches, timed, type BenchBucket } from './harness.js';

const MIB = 1024 * 1024;
const ROUNDS = 3;
/** gcsmount's defaults, which the floor's download copies: 4 MiB blocks, as many range GETs at a time. */
const BLOCK = 4 * MIB;
const STREAMS = DEFAULT_RANGE_GETS_PER_READER;
const DEFAULT_LAYER = `this build (default: --download-workers ${DEFAULT_DOWNLOAD_WORKERS})`;

/**
 * The builds in round `round`'s order: each round starts one further along, so that over the rounds each
 * build takes each place. The first mount after the floor (a curl sweep, dd and a C server) paid more:
 * the same code measured 2.79 CPU-s first and 1.64 third in one run on an AMD EPYC machine.
 */
function inTurn<T>(layers: readonly T[], round: number): T[] {
  const k = round % layers.length;
  return [...layers.slice(k), ...layers.slice(0, k)];
}

async function loadAverage(): Promise<string> {
  return (await fsp.readFile('/proc/loadavg', 'utf8')).split(' ').slice(0, 3).join(' ');
}

interface Sample {
  user: number;
  sys: number;
  /** Of user + sys, the main (JavaScript) thread's; and the read's wall-clock seconds. */
  main: number;
  seconds: number;
  /** CPU of a second, other 1 GiB object read through the same mount right after: no start-up costs. */
  second: number;
}

/** The CPU time bash's `times` reports for the commands it ran (its second line: children's user and sys). */
async function childCpu(script: string): Promise<{ seconds: number; stdout: string }> {
  const r = await sh('bash', ['-c', `${script}\ntimes >&2`]);
  const lines = r.stderr.trim().split('\n');
  const m = /^(\d+)m([\d.]+)s (\d+)m([\d.]+)s$/.exec(lines[lines.length - 1] ?? '');
  if (r.code !== 0 || !m) throw new Error(`floor: ${script.split('\n')[0]} failed: ${r.stderr.trim()}`);
  return { seconds: Number(m[1]) * 60 + Number(m[2]) + Number(m[3]) * 60 + Number(m[4]), stdout: r.stdout };
}

/** The same work as a cold GiB, each part done by the machine's own tools (no gcsmount), in CPU seconds. */
interface Floor {
  /** curl: 1 GiB in 4 MiB range GETs, 16 at a time, from the same emulator with the same knobs. */
  download: number;
  /** dd: 1 GiB written with O_DIRECT in 4 MiB writes, to a file beside the cache dirs. */
  disk: number;
  /** The C libfuse3 server of the fuse-ceiling bench answering `cat` of 1 GiB from memory. */
  fuse: number;
  /** CRC32C of 1 GiB (the addon's, as the daemon checks blocks), in this process. */
  crc: number;
}

async function measureFloor(b: BenchBucket, object: string, cBinary: string): Promise<Floor> {
  const ranges = Array.from({ length: 1024 / 4 }, (_, i) => ({ object, from: i * BLOCK, to: (i + 1) * BLOCK }));
  const config = await curlRangesConfig(b, ranges, STREAMS, join(b.dir, 'floor-curl.cfg'));
  await dropPageCache();
  const download = await childCpu(`curl -s -K ${config}`);
  const bytes = curlBytes(download.stdout);
  if (bytes !== 1024 * MIB) throw new Error(`floor: curl received ${bytes} bytes, not 1 GiB`);

  const file = join(b.dir, 'floor-disk.bin');
  await dropPageCache();
  const disk = await childCpu(`dd if=/dev/zero of=${file} bs=4M count=256 oflag=direct status=none`);
  await fsp.rm(file, { force: true });

  const mnt = join(b.dir, `floor-mnt-${Date.now()}`);
  await fsp.mkdir(mnt);
  const server = await startServer(mnt, { name: 'floor: C libfuse3', io: 'buffered', readAheadKb: 4096, layer: 'c-single' }, cBinary);
  let fuse: number;
  try {
    await dropPageCache();
    const before = (await server.stats()).cpu;
    const r = await sh('sh', ['-c', `cat ${join(mnt, 'data')} | wc -c`]);
    if (Number(r.stdout.trim()) !== 1024 * MIB) throw new Error(`floor: the C server answered ${r.stdout.trim()} bytes`);
    fuse = (await server.stats()).cpu - before;
  } finally {
    await server.stop();
  }

  const piece = randomBytes(BLOCK);
  const c0 = process.cpuUsage();
  let crc = 0;
  for (let i = 0; i < 256; i++) crc = crc32c(piece, crc);
  const c = process.cpuUsage(c0);
  return { download: download.seconds, disk: disk.seconds, fuse, crc: (c.user + c.system) / 1e6 };
}

/**
 * The daemon's CPU time per GiB of a cold sequential read (GCS through the mount, into the block cache
 * or not), split into user and kernel time. The first GiB is read by a fresh daemon (JIT warm-up, block
 * buffers touched for the first time, a new cache dir); the second, another object, by the same daemon
 * right after. GCSMOUNT_BASELINE_BIN names another build's bin/gcsmount, measured in turn in each round.
 * The baseline of every round is the floor: the same work (download, disk write, FUSE replies, CRC) done
 * by the machine's own tools without gcsmount (curl, dd, the fuse-ceiling bench's C libfuse3 server).
 */
export async function coldCpuScenario(): Promise<string> {
  const b = await benchBucket('cold-cpu-bench');
  // The same build with and without download workers: what they take off the main thread.
  const layers: [string, string, string[]][] = [
    [DEFAULT_LAYER, GCSMOUNT, []],
    ['this build, --download-workers 0', GCSMOUNT, ['--download-workers', '0']],
  ];
  if (process.env.GCSMOUNT_BASELINE_BIN) layers.push(['baseline', process.env.GCSMOUNT_BASELINE_BIN, []]);
  const samples = new Map<string, Sample[]>();
  const floors: Floor[] = [];
  let dropped = false;
  const loadBefore = await loadAverage();
  let floorNote = '';
  let perFile: string[] = [];
  try {
    const dir = join(b.root, b.bucket);
    for (const name of ['first.bin', 'second.bin']) await sh('dd', ['if=/dev/urandom', `of=${join(dir, name)}`, 'bs=1M', 'count=1024', 'status=none']);
    // GCS keeps each object's hashes; the emulator computes them when it first describes an object, which
    // the first round's lookup of first.bin would otherwise wait for.
    await primeHashes(b);
    // Emulator defaults as in the data-path scenario: 50 ms to first byte, 50 MiB/s per response.
    await b.emulator.setKnobs({ latencyMs: 50, bandwidthBytesPerSec: 50 * MIB });
    const c = await buildCServer(b.dir);
    if (!c.binary) floorNote = `no floor: ${c.why}`;
    for (let r = 0; r < ROUNDS; r++) {
      if (c.binary) floors.push(await measureFloor(b, 'first.bin', c.binary));
      for (const cache of [true, false]) {
        for (const [layer, bin, extra] of inTurn(layers, r)) {
          const m = await mountBench(b, [...(cache ? ['--cache-dir', join(b.dir, `cache-${layer.replace(/\W/g, '')}-${r}`)] : []), ...extra], bin);
          const pid = await daemonPid(m.path);
          if (!pid) throw new Error('cannot find the daemon');
          dropped = await dropPageCache();
          const c0 = await cpuSplit(pid);
          const main0 = await threadCpuSeconds(pid);
          const t = await timed(() => catToNull([join(m.path, 'first.bin')]));
          const c1 = await cpuSplit(pid);
          const main1 = await threadCpuSeconds(pid);
          await dropPageCache();
          const c1b = await cpuSplit(pid);
          await catToNull([join(m.path, 'second.bin')]);
          const c2 = await cpuSplit(pid);
          await m.unmount();
          const key = `${layer}\0${cache}`;
          if (!samples.has(key)) samples.set(key, []);
          samples.get(key)!.push({ user: c1.user - c0.user, sys: c1.sys - c0.sys, main: main1 - main0, seconds: t.seconds, second: c2.user + c2.sys - (c1b.user + c1b.sys) });
        }
      }
    }
    perFile = await perFileCpu(b, layers);
  } finally {
    await cleanup(b);
  }
  const loadAfter = await loadAverage();
  const f = (x: number) => x.toFixed(2);
  const rows = [...samples.entries()].map(([key, s]) => {
    const [layer, cache] = key.split('\0');
    const totals = s.map((x) => x.user + x.sys);
    const mainS = median(s.map((x) => x.main));
    return `| ${layer} | ${cache === 'true' ? 'yes' : 'no'} | ${f(median(totals))} | ${f(Math.min(...totals))}-${f(Math.max(...totals))} | ${f(median(s.map((x) => x.user)))} / ${f(median(s.map((x) => x.sys)))} | ${f(mainS)} (ceiling ${(1 / mainS).toFixed(1)} GiB/s) | ${(1024 / median(s.map((x) => x.seconds))).toFixed(0)} | ${f(median(s.map((x) => x.second)))} | ${f(Math.min(...s.map((x) => x.second)))}-${f(Math.max(...s.map((x) => x.second)))} |`;
  });
  const floorRows: string[] = [];
  if (floors.length) {
    const part = (name: string, pick: (x: Floor) => number) => {
      const xs = floors.map(pick);
      return `| ${name} | ${f(median(xs))} | ${f(Math.min(...xs))}-${f(Math.max(...xs))} |`;
    };
    const total = (x: Floor) => x.download + x.disk + x.fuse + x.crc;
    const ours = (cache: boolean, pick: (s: Sample) => number) => median((samples.get(`${DEFAULT_LAYER}\0${cache}`) ?? []).map(pick));
    const floorTotal = median(floors.map(total));
    const noDisk = median(floors.map((x) => x.download + x.fuse + x.crc));
    floorRows.push(
      '',
      'The floor: the same work done by the machine\'s own tools in the same rounds (no gcsmount), CPU seconds per GiB:',
      '',
      '| part | median | range |',
      '|---|---|---|',
      part(`download: curl, 4 MiB range GETs, ${STREAMS} at a time, same emulator and knobs`, (x) => x.download),
      part('disk: dd, 4 MiB writes with O_DIRECT', (x) => x.disk),
      part('FUSE: the C libfuse3 server answering `cat` from memory', (x) => x.fuse),
      part('CRC32C (the addon\'s)', (x) => x.crc),
      part('**all four (with a cache dir)**', total),
      part('download, FUSE and CRC (without one)', (x) => x.download + x.fuse + x.crc),
      '',
      `This build against the floor: with a cache dir ${(ours(true, (s) => s.user + s.sys) / floorTotal).toFixed(2)}x (first GiB) and ${(ours(true, (s) => s.second) / floorTotal).toFixed(2)}x (second); without ${(ours(false, (s) => s.user + s.sys) / noDisk).toFixed(2)}x and ${(ours(false, (s) => s.second) / noDisk).toFixed(2)}x.`,
    );
  } else if (floorNote) floorRows.push('', floorNote);
  return [
    `Emulator: 50 ms to first byte, 50 MiB/s per response; gcsmount defaults (4 MiB blocks, ${STREAMS} range GETs); \`cat\` of a 1 GiB object. ${ROUNDS} rounds, builds in turn within each, each round starting one build further on. Load average before ${loadBefore}, after ${loadAfter}.`,
    `Page cache ${dropped ? 'dropped before each measured read, gcsmount\'s and the floor\'s (see dropPageCache in src/bench/harness.ts)' : 'not dropped (not root): figures include the host\'s faults on fresh memory'}.`,
    '',
    '| build | --cache-dir | daemon CPU s, first GiB of a fresh daemon (median) | range | user / sys (median) | of it the main thread (median; 1 / it: the one-mount ceiling) | MiB/s (median) | CPU s, a second GiB on the same mount (median) | range |',
    '|---|---|---|---|---|---|---|---|---|',
    ...rows,
    ...floorRows,
    ...perFile,
  ].join('\n');
}

const FILES = 1000;
const READERS = 16;

/**
 * The per-file costs (#30): 1,000 cold 1 MiB files (whole-object GETs, as Zarr chunks are read) by 16
 * readers at once (`xargs -P16 cat`), on a fresh mount with a cache dir after the folder was listed;
 * the main thread's CPU per 1,000 files is what caps a cold Zarr load. Then 1,000 more cold files on
 * the same mount: a fresh daemon's first thousand also pays for V8's warm-up (its functions still in
 * baseline code: 0.53 ms per file against 0.37-0.42 for the next four thousands, /work/probe in session
 * 20), which a load of many thousand chunks does not.
 */
async function perFileCpu(b: BenchBucket, layers: [string, string, string[]][]): Promise<string[]> {
  for (const folder of ['chunks', 'chunks2']) {
    const dir = join(b.root, b.bucket, folder);
    await fsp.mkdir(dir, { recursive: true });
    for (let i = 0; i < FILES; i++) await fsp.writeFile(join(dir, `c${i}`), randomBytes(MIB));
  }
  await primeHashes(b);
  await b.emulator.setKnobs({ latencyMs: 0, bandwidthBytesPerSec: 0 });
  const got = new Map<string, { main: number; total: number; perSec: number; switches: number; mainNext: number; totalNext: number }[]>();
  for (let r = 0; r < ROUNDS; r++) {
    for (const [layer, bin, extra] of inTurn(layers, r)) {
      const m = await mountBench(b, ['--cache-dir', join(b.dir, `files-${layer.replace(/\W/g, '')}-${r}`), ...extra], bin);
      const pid = await daemonPid(m.path);
      if (!pid) throw new Error('cannot find the daemon');
      await sh('ls', [join(m.path, 'chunks')]);
      await sh('ls', [join(m.path, 'chunks2')]);
      const batch = async (folder: string) => {
        await dropPageCache();
        const [main0, c0, s0] = [await threadCpuSeconds(pid), await cpuSplit(pid), await threadSwitches(pid)];
        const t = await timed(() => sh('sh', ['-c', `cd ${join(m.path, folder)} && ls | xargs -P${READERS} -I{} cat {} > /dev/null`]));
        if (t.result.code !== 0) throw new Error(`readers failed: ${t.result.stderr}`);
        const [main1, c1, s1] = [await threadCpuSeconds(pid), await cpuSplit(pid), await threadSwitches(pid)];
        return { main: main1 - main0, total: c1.user + c1.sys - c0.user - c0.sys, perSec: FILES / t.seconds, switches: (s1 - s0) / FILES };
      };
      const first = await batch('chunks');
      const next = await batch('chunks2');
      await m.unmount();
      if (!got.has(layer)) got.set(layer, []);
      got.get(layer)!.push({ ...first, mainNext: next.main, totalNext: next.total });
    }
  }
  const f = (x: number) => x.toFixed(2);
  return [
    '',
    `Per-file costs: ${FILES} cold 1 MiB files read whole by ${READERS} readers at once (\`ls | xargs -P${READERS} -I{} cat {}\`), emulator without latency, a fresh mount and cache dir, the folders listed first; then ${FILES} more cold files on the same mount (V8 warmed up, as in a long load); ${ROUNDS} rounds:`,
    '',
    '| build | main thread CPU s per 1,000 files (median) | range | 1 / it: files/s one mount can reach | main thread switched out, per file | daemon CPU s per 1,000 files | files/s here | the next 1,000 on the same mount: main thread (range; ceiling) | daemon |',
    '|---|---|---|---|---|---|---|---|---|',
    ...[...got.entries()].map(([layer, xs]) => {
      const main = xs.map((x) => x.main);
      const next = xs.map((x) => x.mainNext);
      return `| ${layer} | ${f(median(main))} | ${f(Math.min(...main))}-${f(Math.max(...main))} | ${(FILES / median(main)).toFixed(0)} | ${f(median(xs.map((x) => x.switches)))} | ${f(median(xs.map((x) => x.total)))} | ${median(xs.map((x) => x.perSec)).toFixed(0)} | ${f(median(next))} (${f(Math.min(...next))}-${f(Math.max(...next))}; ${(FILES / median(next)).toFixed(0)} files/s) | ${f(median(xs.map((x) => x.totalNext)))} |`;
    }),
  ];
}
