import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { benchBucket, cleanup, cpuSplit, daemonPid, dropPageCache, median, mountBench, primeHashes, sh, threadCpuSeconds, timed, type BenchBucket } from './harness.js';

const MIB = 1024 * 1024;
const ROUNDS = Number(process.env.GCSMOUNT_BENCH_ROUNDS ?? 2);
const FILES = 1000;
const READERS = 16;
const WORKERS = [0, 1, 2];

/** Which CPUs the daemon gets, and which the emulator and the readers get (the other core, where it fits). */
const CORES: { label: string; daemon: string; others: string | null }[] = [
  { label: '1 (CPU 0; emulator and readers on CPU 1)', daemon: '0', others: '1' },
  { label: '2 (CPUs 0-1, shared with the emulator and readers)', daemon: '0,1', others: null },
];

interface Sample {
  mibPerSec: number;
  cpuPerGiB: number;
  mainPerGiB: number;
  filesPerSec: number;
  mainPer1000: number;
  cpuPer1000: number;
}

/** Pins every thread of `pid` (threads made later inherit the main thread's set) to `cpus`. */
async function pin(pid: number, cpus: string): Promise<void> {
  const r = await sh('taskset', ['-a', '-p', '-c', cpus, String(pid)]);
  if (r.code !== 0) throw new Error(`taskset ${cpus} ${pid}: ${r.stderr.trim()}`);
}

/** Runs `command` (sh -c) pinned to `cpus`, or anywhere when null; throws when it fails. */
async function readers(cpus: string | null, command: string): Promise<void> {
  const r = cpus === null ? await sh('sh', ['-c', command]) : await sh('taskset', ['-c', cpus, 'sh', '-c', command]);
  if (r.code !== 0) throw new Error(`readers failed: ${r.stderr.trim()}`);
}

async function measure(b: BenchBucket, cores: (typeof CORES)[number], workers: number, round: number): Promise<Sample> {
  const mountPinned = async (cache: string) => {
    const m = await mountBench(b, ['--cache-dir', join(b.dir, cache), '--download-workers', String(workers)]);
    const pid = await daemonPid(m.path);
    if (!pid) throw new Error('cannot find the daemon');
    await pin(pid, cores.daemon);
    return { m, pid };
  };
  await pin(b.emulator.pid, cores.others ?? '0,1');
  const tag = `${cores.daemon.replace(',', '')}-${workers}-${round}`;

  // 1 GiB, sequential, cold: as cold-cpu (50 ms to first byte, 50 MiB/s per response).
  await b.emulator.setKnobs({ latencyMs: 50, bandwidthBytesPerSec: 50 * MIB });
  const seq = await mountPinned(`seq-${tag}`);
  await dropPageCache();
  const [c0, main0] = [await cpuSplit(seq.pid), await threadCpuSeconds(seq.pid)];
  const t = await timed(() => readers(cores.others, `cat '${join(seq.m.path, 'big.bin')}' > /dev/null`));
  const [c1, main1] = [await cpuSplit(seq.pid), await threadCpuSeconds(seq.pid)];
  await seq.m.unmount();

  // 1,000 cold 1 MiB files by 16 readers, no latency: the per-file costs.
  await b.emulator.setKnobs({ latencyMs: 0, bandwidthBytesPerSec: 0 });
  const files = await mountPinned(`files-${tag}`);
  await sh('ls', [join(files.m.path, 'chunks')]);
  await dropPageCache();
  const [f0, fmain0] = [await cpuSplit(files.pid), await threadCpuSeconds(files.pid)];
  const tf = await timed(() => readers(cores.others, `cd '${join(files.m.path, 'chunks')}' && ls | xargs -P${READERS} -I{} cat {} > /dev/null`));
  const [f1, fmain1] = [await cpuSplit(files.pid), await threadCpuSeconds(files.pid)];
  await files.m.unmount();

  return {
    mibPerSec: 1024 / t.seconds,
    cpuPerGiB: c1.user + c1.sys - c0.user - c0.sys,
    mainPerGiB: main1 - main0,
    filesPerSec: FILES / tf.seconds,
    mainPer1000: fmain1 - fmain0,
    cpuPer1000: f1.user + f1.sys - f0.user - f0.sys,
  };
}

/**
 * #30's scaling check without a bigger machine: the same cold workloads (1 GiB sequential; 1,000 files of
 * 1 MiB by 16 readers) with the daemon pinned to 1 core and to 2 (taskset), for 0, 1 and 2 download
 * workers. With one core, the emulator and the readers run on the other. More workers must never make
 * the 1-core case slower.
 */
export async function scalingScenario(): Promise<string> {
  const b = await benchBucket('scaling-bench');
  const got = new Map<string, Sample[]>();
  try {
    const dir = join(b.root, b.bucket);
    await sh('dd', ['if=/dev/urandom', `of=${join(dir, 'big.bin')}`, 'bs=1M', 'count=1024', 'status=none']);
    await fsp.mkdir(join(dir, 'chunks'));
    for (let i = 0; i < FILES; i++) await fsp.writeFile(join(dir, 'chunks', `c${i}`), randomBytes(MIB));
    // GCS keeps each object's hashes; the emulator computes them when it first describes an object.
    await primeHashes(b);
    for (let r = 0; r < ROUNDS; r++) {
      for (const cores of CORES) {
        for (const w of WORKERS) {
          const key = `${cores.label}\0${w}`;
          if (!got.has(key)) got.set(key, []);
          got.get(key)!.push(await measure(b, cores, w, r));
        }
      }
    }
  } finally {
    await sh('taskset', ['-a', '-p', '-c', '0,1', String(b.emulator.pid)]);
    await cleanup(b);
  }
  const f = (x: number, d = 2) => x.toFixed(d);
  const med = (xs: Sample[], pick: (s: Sample) => number) => median(xs.map(pick));
  const range = (xs: Sample[], pick: (s: Sample) => number, d = 0) => `${f(Math.min(...xs.map(pick)), d)}-${f(Math.max(...xs.map(pick)), d)}`;
  const rows = [...got.entries()].map(([key, xs]) => {
    const [cores, w] = key.split('\0');
    return `| ${cores} | ${w} | ${f(med(xs, (s) => s.mibPerSec), 0)} (${range(xs, (s) => s.mibPerSec)}) | ${f(med(xs, (s) => s.cpuPerGiB))} | ${f(med(xs, (s) => s.mainPerGiB))} | ${f(med(xs, (s) => s.filesPerSec), 0)} (${range(xs, (s) => s.filesPerSec)}) | ${f(med(xs, (s) => s.mainPer1000))} | ${f(med(xs, (s) => s.cpuPer1000))} |`;
  });
  const oneCore = WORKERS.map((w) => med(got.get(`${CORES[0]!.label}\0${w}`)!, (s) => s.mibPerSec));
  const oneCoreFiles = WORKERS.map((w) => med(got.get(`${CORES[0]!.label}\0${w}`)!, (s) => s.filesPerSec));
  return [
    `The daemon pinned with \`taskset -a -p -c CPUS\` right after it mounted (threads made later inherit it); ${ROUNDS} rounds, medians (range). ` +
      `1 GiB: \`cat\` of one cold object, emulator at 50 ms to first byte and 50 MiB/s per response, page cache dropped. ` +
      `Files: ${FILES} cold 1 MiB files by ${READERS} readers (\`ls | xargs -P${READERS} -I{} cat {}\`), emulator without latency, the folder listed first. A fresh mount and cache dir for each.`,
    '',
    '| daemon cores | --download-workers | 1 GiB cold: MiB/s | daemon CPU s per GiB | main thread s per GiB | 1,000 files: files/s | main thread s per 1,000 | daemon CPU s per 1,000 |',
    '|---|---|---|---|---|---|---|---|',
    ...rows,
    '',
    `One core, by workers ${WORKERS.join(' / ')}: ${oneCore.map((x) => f(x, 0)).join(' / ')} MiB/s, ${oneCoreFiles.map((x) => f(x, 0)).join(' / ')} files/s.`,
  ].join('\n');
}
