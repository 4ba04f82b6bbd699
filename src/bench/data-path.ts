import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { AdaptiveConcurrency } from '../gcs/adaptive-concurrency.js';
import { HttpObjectClient } from '../gcs/http-client.js';
import { DEFAULT_RETRY } from '../gcs/retry.js';
import { silentLogger } from '../observe/logger.js';
import { Metrics } from '../observe/metrics.js';
import { benchBucket, cleanup, cpuSeconds, daemonPid, dropPageCache, median, mountBench, peakRssMiB, sh, timed, type BenchBucket } from './harness.js';

const MIB = 1024 * 1024;
/** gcsmount's defaults on this machine: 4 MiB blocks, max(16, 2 x CPUs) = 16 range GETs in flight. */
const BLOCK = 4 * MIB;
const PARALLEL = 16;
const LATENCY_MS = 50;
const BANDWIDTH = 50 * MIB; // per response, like one GCS stream

/**
 * Runs `jobs` with at most `limit` in flight, each worker downloading into a block buffer of its own that
 * it reuses, as the daemon reuses its pooled block buffers.
 */
async function pool<T>(limit: number, jobs: ((into: Buffer) => Promise<T>)[]): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: limit }, async () => {
    const into = Buffer.allocUnsafe(BLOCK);
    while (next < jobs.length) await jobs[next++]!(into);
  }));
}

function ceilingClient(b: BenchBucket): HttpObjectClient {
  return new HttpObjectClient({
    endpoint: { origin: b.emulator.url, custom: true },
    bucket: b.bucket,
    auth: null,
    maxConnections: 0,
    timeoutMs: 0,
    retry: DEFAULT_RETRY,
    concurrency: new AdaptiveConcurrency({ max: 100, min: 1, cooldownMs: 1000 }),
    log: silentLogger,
    metrics: new Metrics(),
  });
}

/** Each scenario runs this many times, ceiling and mount in turn: the shared host's noise moves single runs. */
const ROUNDS = 3;

interface Round {
  ceilingS: number;
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
 * Cold reads through the mount against the ceiling measured in the same run: the same undici Pool
 * downloading the same ranges straight into memory, with the same parallelism, without FUSE.
 */
export async function dataPathScenario(): Promise<string> {
  const b = await benchBucket('data-bench');
  const rows: Row[] = [];
  const client = ceilingClient(b);
  let pageCacheDropped = false;
  try {
    const dir = join(b.root, b.bucket);
    await sh('dd', ['if=/dev/urandom', `of=${join(dir, 'one-gib.bin')}`, 'bs=1M', 'count=1024', 'status=none']);
    await fsp.mkdir(join(dir, 'small'));
    for (let i = 0; i < 256; i++) await sh('dd', ['if=/dev/urandom', `of=${join(dir, 'small', `c${i}`)}`, 'bs=1M', 'count=1', 'status=none']);
    // Let the emulator hash everything once, outside the timings.
    const big = (await client.statObject('one-gib.bin'))!;
    const smalls = await Promise.all(Array.from({ length: 256 }, async (_, i) => (await client.statObject(`small/c${i}`))!));
    b.emulator.setKnobs({ latencyMs: LATENCY_MS, bandwidthBytesPerSec: BANDWIDTH });

    const measure = async (scenario: string, bytes: number, ceiling: () => Promise<void>, viaMount: (mnt: string) => Promise<void>, diskCache = true) => {
      const rounds: Round[] = [];
      for (let r = 0; r < ROUNDS; r++) {
        // Before each side alike: both then read the emulator's files from disk, as a cold bucket would be.
        await dropPageCache();
        const c = await timed(ceiling);
        const m = await mountBench(b, diskCache ? ['--cache-dir', join(b.dir, `cache-${rows.length}-${r}`)] : []);
        const pid = await daemonPid(m.path);
        // The daemon's CPU figure then leaves out the host's faults on memory the guest had freed.
        pageCacheDropped = await dropPageCache();
        b.emulator.resetStats();
        const cpu0 = pid ? await cpuSeconds(pid) : NaN;
        const t = await timed(() => viaMount(m.path));
        const cpu = pid ? (await cpuSeconds(pid)) - cpu0 : NaN;
        const media = b.emulator.stats().requests.media;
        const rss = pid ? await peakRssMiB(pid) : NaN;
        await m.unmount();
        rounds.push({ ceilingS: c.seconds, mountS: t.seconds, media, rss, cpu });
      }
      rows.push({ scenario, bytes, rounds });
    };

    await measure(
      'cold sequential read of a 1 GiB object (`cat`)',
      big.size,
      () => pool(PARALLEL, Array.from({ length: big.size / BLOCK }, (_, i) => (into: Buffer) => client.readRange(big, i * BLOCK, (i + 1) * BLOCK, into).then(() => undefined))),
      (mnt) => sh('sh', ['-c', `cat ${join(mnt, 'one-gib.bin')} > /dev/null`]).then(() => undefined),
    );
    await measure(
      'the same, without --cache-dir (no block writes to disk)',
      big.size,
      () => pool(PARALLEL, Array.from({ length: big.size / BLOCK }, (_, i) => (into: Buffer) => client.readRange(big, i * BLOCK, (i + 1) * BLOCK, into).then(() => undefined))),
      (mnt) => sh('sh', ['-c', `cat ${join(mnt, 'one-gib.bin')} > /dev/null`]).then(() => undefined),
      false,
    );
    await measure(
      '16 parallel readers of 256 files of 1 MiB',
      256 * MIB,
      () => pool(PARALLEL, smalls.map((o) => (into: Buffer) => client.readRange(o, 0, o.size, into).then(() => undefined))),
      (mnt) =>
        Promise.all(Array.from({ length: 16 }, (_, r) => sh('sh', ['-c', `cat ${Array.from({ length: 16 }, (_, k) => join(mnt, 'small', `c${r * 16 + k}`)).join(' ')} > /dev/null`]))).then(() => undefined),
    );
    const offsets = Array.from({ length: 200 }, (_, i) => ((i * 7919) % 16384) * 65536);
    await measure(
      '200 random 64 KiB reads of the 1 GiB object, 8 at a time',
      200 * 65536,
      () => pool(8, offsets.map((o) => (into: Buffer) => client.readRange(big, o, o + 65536, into).then(() => undefined))),
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
    await client.close();
    await cleanup(b);
  }
  const mbps = (bytes: number, s: number) => (bytes / MIB / s).toFixed(0);
  return [
    `Emulator: ${LATENCY_MS} ms to first byte, ${BANDWIDTH / MIB} MiB/s per response. gcsmount defaults (4 MiB blocks, 16 range GETs in flight), a fresh --cache-dir per run unless stated. ${ROUNDS} runs per scenario, ceiling and mount in turn; medians, and the range of the per-run ratios. Page cache ${pageCacheDropped ? 'dropped before each read, the ceiling\'s and the mount\'s (see dropPageCache in src/bench/harness.ts)' : 'not dropped (not root): CPU figures include the host\'s faults on fresh memory'}.`,
    '',
    '| scenario | ceiling (Pool, no FUSE) | gcsmount cold | ratio (median) | ratio (range) | media requests | daemon peak RSS | daemon CPU s per GiB (median) |',
    '|---|---|---|---|---|---|---|---|',
    ...rows.map((r) => {
      const ratios = r.rounds.map((x) => x.ceilingS / x.mountS);
      return `| ${r.scenario} | ${mbps(r.bytes, median(r.rounds.map((x) => x.ceilingS)))} MiB/s | ${mbps(r.bytes, median(r.rounds.map((x) => x.mountS)))} MiB/s | ${median(ratios).toFixed(2)} | ${Math.min(...ratios).toFixed(2)}-${Math.max(...ratios).toFixed(2)} | ${median(r.rounds.map((x) => x.media))} | ${Math.max(...r.rounds.map((x) => x.rss)).toFixed(0)} MiB | ${median(r.rounds.map((x) => x.cpu / (r.bytes / 2 ** 30))).toFixed(2)} |`;
    }),
  ].join('\n');
}
