import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { DEFAULT_RANGE_GETS_PER_READER } from '../cli/params.js';
import {
  benchBucket, catToNull, cleanup, cpuSeconds, curlBytes, curlRangesConfig, daemonPid, dropPageCache, median, mountBench, peakRssMiB, primeHashes, rangeBytes, sh, timed, type BenchBucket,
  type CurlRange,
} from './harness.js';

const MIB = 1024 * 1024;
/** gcsmount's default block size (range GETs in flight for one reader: DEFAULT_RANGE_GETS_PER_READER). */
const BLOCK = 4 * MIB;
const LATENCY_MS = 50;
const BANDWIDTH = 50 * MIB; // per response, like one GCS stream
/** The ceiling's stream counts: the best of them is what the machine does without gcsmount. */
const STREAM_SWEEP = [4, 8, 16, 32, 64, 128];

/**
 * The ceiling of one round: curl downloading the same ranges from the emulator (its own process) to
 * /dev/null at each stream count of the sweep, the page cache dropped before each; the fastest.
 */
async function ceiling(b: BenchBucket, ranges: CurlRange[]): Promise<{ seconds: number; streams: number; sweep: number[] }> {
  const want = rangeBytes(ranges);
  const sweep: number[] = [];
  for (const streams of STREAM_SWEEP) {
    const config = await curlRangesConfig(b, ranges, streams, join(b.dir, `ceiling-${streams}.cfg`));
    await dropPageCache();
    const t = await timed(() => sh('curl', ['-s', '-K', config]));
    const got = curlBytes(t.result.stdout);
    if (t.result.code !== 0 || got !== want) throw new Error(`ceiling: curl with ${streams} streams got ${got} of ${want} bytes: ${t.result.stderr.trim()}`);
    sweep.push(t.seconds);
  }
  const best = sweep.indexOf(Math.min(...sweep));
  return { seconds: sweep[best]!, streams: STREAM_SWEEP[best]!, sweep };
}

/** Each scenario runs this many times, ceiling and mount in turn: the shared host's noise moves single runs. */
const ROUNDS = 3;

interface Round {
  ceilingS: number;
  /** The stream count of the ceiling's best run. */
  ceilingStreams: number;
  /** The ceiling's seconds at each count of STREAM_SWEEP. */
  sweep: number[];
  mountS: number;
  media: number;
  rss: number;
  /** The daemon's CPU time (user + system) during the read, in seconds. */
  cpu: number;
}

interface Row {
  scenario: string;
  bytes: number;
  rounds: Round[];
}

/**
 * Cold reads through the mount against the ceiling measured in the same run: curl downloading the same
 * ranges from the same emulator, in its own process, at the best of a sweep of stream counts, no FUSE.
 */
export async function dataPathScenario(): Promise<string> {
  const b = await benchBucket('data-bench');
  const rows: Row[] = [];
  let pageCacheDropped = false;
  try {
    const dir = join(b.root, b.bucket);
    await sh('dd', ['if=/dev/urandom', `of=${join(dir, 'one-gib.bin')}`, 'bs=1M', 'count=1024', 'status=none']);
    await fsp.mkdir(join(dir, 'small'));
    for (let i = 0; i < 256; i++) await sh('dd', ['if=/dev/urandom', `of=${join(dir, 'small', `c${i}`)}`, 'bs=1M', 'count=1', 'status=none']);
    const smallNames = Array.from({ length: 256 }, (_, i) => `small/c${i}`);
    await primeHashes(b);
    await b.emulator.setKnobs({ latencyMs: LATENCY_MS, bandwidthBytesPerSec: BANDWIDTH });

    const measure = async (scenario: string, ranges: CurlRange[], viaMount: (mnt: string) => Promise<void>, { diskCache = true, args = [] as string[] } = {}) => {
      const rounds: Round[] = [];
      for (let r = 0; r < ROUNDS; r++) {
        const c = await ceiling(b, ranges);
        const m = await mountBench(b, [...(diskCache ? ['--cache-dir', join(b.dir, `cache-${rows.length}-${r}`)] : []), ...args]);
        const pid = await daemonPid(m.path);
        // As before each of the ceiling's runs: both read the emulator's files from disk, as a cold bucket
        // would be, and the daemon's CPU figure leaves out the host's faults on memory the guest had freed.
        pageCacheDropped = await dropPageCache();
        await b.emulator.resetStats();
        const cpu0 = pid ? await cpuSeconds(pid) : NaN;
        const t = await timed(() => viaMount(m.path));
        const cpu = pid ? (await cpuSeconds(pid)) - cpu0 : NaN;
        const media = (await b.emulator.stats()).requests.media;
        const rss = pid ? await peakRssMiB(pid) : NaN;
        await m.unmount();
        rounds.push({ ceilingS: c.seconds, ceilingStreams: c.streams, sweep: c.sweep, mountS: t.seconds, media, rss, cpu });
      }
      rows.push({ scenario, bytes: rangeBytes(ranges), rounds });
    };

    const catBig = (mnt: string) => catToNull([join(mnt, 'one-gib.bin')]);
    const blocks = Array.from({ length: 1024 * MIB / BLOCK }, (_, i) => ({ object: 'one-gib.bin', from: i * BLOCK, to: (i + 1) * BLOCK }));
    await measure(
      'cold sequential read of a 1 GiB object (`cat`)',
      blocks,
      catBig,
    );
    await measure(
      'the same, without --cache-dir (no block writes to disk)',
      blocks,
      catBig,
      { diskCache: false },
    );
    // The defaults above keep DEFAULT_RANGE_GETS_PER_READER range GETs in flight for one reader; this row
    // lets gcsmount have the ceiling's best stream count, to tell its parallelism from its CPU cost as the limit.
    await measure(
      'the same as the first, with 64 range GETs in flight (`--file-cache-max-parallel-downloads 64 --file-cache-parallel-downloads-per-file 64 --sequential-read-size-mb 256 --read-global-max-blocks 80`)',
      blocks,
      catBig,
      { args: ['--file-cache-max-parallel-downloads', '64', '--file-cache-parallel-downloads-per-file', '64', '--sequential-read-size-mb', '256', '--read-global-max-blocks', '80'] },
    );
    await measure(
      '16 parallel readers of 256 files of 1 MiB',
      smallNames.map((object) => ({ object, from: 0, to: MIB })),
      (mnt) =>
        Promise.all(Array.from({ length: 16 }, (_, r) => catToNull(Array.from({ length: 16 }, (_, k) => join(mnt, 'small', `c${r * 16 + k}`))))).then(() => undefined),
    );
    const offsets = Array.from({ length: 200 }, (_, i) => ((i * 7919) % 16384) * 65536);
    await measure(
      '200 random 64 KiB reads of the 1 GiB object, 8 at a time',
      offsets.map((o) => ({ object: 'one-gib.bin', from: o, to: o + 65536 })),
      (mnt) =>
        sh('/usr/bin/python3', ['-c', `
import os
from concurrent.futures import ThreadPoolExecutor
f = os.open(${JSON.stringify(join(mnt, 'one-gib.bin'))}, os.O_RDONLY)
offs = ${JSON.stringify(offsets)}
with ThreadPoolExecutor(8) as ex:
    assert all(len(b) == 65536 for b in ex.map(lambda o: os.pread(f, 65536, o), offs))
`]).then((r) => {
          if (r.code !== 0) throw new Error(r.stderr);
        }),
    );
  } finally {
    await cleanup(b);
  }
  const mbps = (bytes: number, s: number) => (bytes / MIB / s).toFixed(0);
  return [
    `Emulator in its own process: ${LATENCY_MS} ms to first byte, ${BANDWIDTH / MIB} MiB/s per response. Ceiling: curl downloading the same byte ranges (4 MiB range GETs for the 1 GiB object, whole files, 64 KiB ranges) to /dev/null at ${STREAM_SWEEP.join(', ')} streams, the fastest; in brackets, the stream counts that were fastest. gcsmount defaults (4 MiB blocks, ${DEFAULT_RANGE_GETS_PER_READER} range GETs in flight for one reader), a fresh --cache-dir per run unless stated. ${ROUNDS} runs per scenario, ceiling and mount in turn; medians, and the range of the per-run ratios. Page cache ${pageCacheDropped ? 'dropped before each read, the ceiling\'s and the mount\'s (see dropPageCache in src/bench/harness.ts)' : 'not dropped (not root): CPU figures include the host\'s faults on fresh memory'}.`,
    '',
    '| scenario | ceiling (curl, no FUSE) | gcsmount cold | ratio (median) | ratio (range) | media requests | daemon peak RSS | daemon CPU s per GiB (median) |',
    '|---|---|---|---|---|---|---|---|',
    ...rows.map((r) => {
      const ratios = r.rounds.map((x) => x.ceilingS / x.mountS);
      const streams = [...new Set(r.rounds.map((x) => x.ceilingStreams))].sort((x, y) => x - y).join(', ');
      return `| ${r.scenario} | ${mbps(r.bytes, median(r.rounds.map((x) => x.ceilingS)))} MiB/s (${streams}) | ${mbps(r.bytes, median(r.rounds.map((x) => x.mountS)))} MiB/s | ${median(ratios).toFixed(2)} | ${Math.min(...ratios).toFixed(2)}-${Math.max(...ratios).toFixed(2)} | ${median(r.rounds.map((x) => x.media))} | ${Math.max(...r.rounds.map((x) => x.rss)).toFixed(0)} MiB | ${median(r.rounds.map((x) => x.cpu / (r.bytes / 2 ** 30))).toFixed(2)} |`;
    }),
    '',
    `The ceiling at each stream count (curl, medians of the rounds): gcsmount reads one file with ${DEFAULT_RANGE_GETS_PER_READER} range GETs in flight by default (--file-cache-parallel-downloads-per-file within --file-cache-max-parallel-downloads).`,
    '',
    `| scenario | ${STREAM_SWEEP.map((n) => `${n} streams`).join(' | ')} |`,
    `|---|${STREAM_SWEEP.map(() => '---|').join('')}`,
    ...rows.map((r) => `| ${r.scenario} | ${STREAM_SWEEP.map((_, i) => `${mbps(r.bytes, median(r.rounds.map((x) => x.sweep[i]!)))} MiB/s`).join(' | ')} |`),
  ].join('\n');
}
