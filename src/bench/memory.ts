import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import {
  benchBucket, catToNull, cleanup, daemonPid, dropPageCache, GCSMOUNT, mountGcsmount, mountStats, peakRssMiB, primeHashes, sh, timed, type BenchBucket,
} from './harness.js';

const MIB = 1024 * 1024;
const LATENCY_MS = 50;
const BANDWIDTH = 50 * MIB; // per response, like one GCS stream
/** What the issue allows the daemon beyond its budget: the runtime itself. */
const OVERHEAD_MIB = 64;

/**
 * The scale, from the environment so a quick check can run small: 96 readers of 64 MiB files (6 GiB
 * through the mount per round, 12 GiB of cache at most) through a 512 MiB budget by default, a budget
 * that binds (96 readers of 4 MiB blocks plus readahead want more), unlike the default of 1/8 of RAM.
 */
function scale() {
  const n = (name: string, fallback: number) => Number(process.env[name] ?? fallback);
  return {
    readers: n('MEMORY_BENCH_READERS', 96),
    fileMiB: n('MEMORY_BENCH_FILE_MB', 64),
    limitMiB: n('MEMORY_BENCH_LIMIT_MB', 512),
    /** Another build's bin/gcsmount (today's, say): its 16-reader rows are measured too, without the flag. */
    baseline: process.env.MEMORY_BENCH_BASELINE_BIN ?? null,
  };
}

interface Row {
  build: string;
  readers: number;
  cache: boolean;
  round: 'cold' | 'warm';
  bytes: number;
  seconds: number;
  /** The daemon's RSS once mounted, before the read, and its peak during it (a fresh daemon each row). */
  idleRssMiB: number;
  peakRssMiB: number;
  memoryPeakMiB: number | null;
  memoryWaits: number | null;
}

/** The daemon's resident memory now, in MiB. */
async function rssMiB(pid: number): Promise<number> {
  return Number(/VmRSS:\s+(\d+)/.exec(await fsp.readFile(`/proc/${pid}/status`, 'utf8'))![1]) / 1024;
}

/**
 * One row: a fresh daemon (so its peak RSS is this read's), `readers` cats of different files at once,
 * the page cache dropped first. Warm rows mount the cache dir a cold row filled.
 */
async function measure(b: BenchBucket, row: Omit<Row, 'bytes' | 'seconds' | 'idleRssMiB' | 'peakRssMiB' | 'memoryPeakMiB' | 'memoryWaits'>, files: string[], args: string[], bin: string): Promise<Row> {
  const path = join(b.dir, `mnt-${Date.now()}`);
  await fsp.mkdir(path);
  const m = await mountGcsmount(b.emulator.url, b.bucket, path, join(b.dir, 'gcsmount.log'), args, bin);
  const pid = await daemonPid(m.path);
  try {
    if (!pid) throw new Error('daemon not found');
    await dropPageCache();
    const idleRssMiB = await rssMiB(pid);
    const t = await timed(() => Promise.all(files.map((f) => catToNull([join(m.path, f)]))));
    const stats = await mountStats(m.path, bin);
    return {
      ...row,
      bytes: files.length * scale().fileMiB * MIB,
      seconds: t.seconds,
      idleRssMiB,
      peakRssMiB: await peakRssMiB(pid),
      memoryPeakMiB: stats.gauges.memory_peak_bytes === undefined ? null : stats.gauges.memory_peak_bytes / MIB,
      memoryWaits: stats.counters.memory_waits ?? null,
    };
  } finally {
    await m.unmount();
    // The next row may mount the same cache dir, which one daemon at a time may hold: wait for this one
    // to finish its writes and go.
    for (let i = 0; pid && i < 600 && (await fsp.access(`/proc/${pid}`).then(() => true, () => false)); i++) await new Promise((r) => setTimeout(r, 100));
  }
}

/** 16 and N readers, without and with a cache dir, cold and warm, for one build. */
async function rowsFor(b: BenchBucket, build: string, bin: string, readerCounts: number[], flags: string[]): Promise<Row[]> {
  const rows: Row[] = [];
  for (const readers of readerCounts) {
    const files = Array.from({ length: readers }, (_, i) => `f${i}.bin`);
    for (const cache of [false, true]) {
      const cacheDir = join(b.dir, `cache-${build}-${readers}`);
      const args = [...flags, ...(cache ? ['--cache-dir', cacheDir] : [])];
      for (const round of ['cold', 'warm'] as const) rows.push(await measure(b, { build, readers, cache, round }, files, args, bin));
      await fsp.rm(cacheDir, { recursive: true, force: true });
    }
  }
  return rows;
}

/**
 * Many readers at once through one memory budget: peak daemon RSS against the budget + 64 MiB, and the
 * throughput of N readers against 16 measured in the same run. Without a cache dir "warm" is a second
 * read through a fresh daemon (from GCS again); with one, a fresh daemon over the cache the cold row filled.
 */
export async function memoryScenario(): Promise<string> {
  const s = scale();
  const b = await benchBucket('memory-bench');
  const rows: Row[] = [];
  try {
    const dir = join(b.root, b.bucket);
    for (let i = 0; i < s.readers; i++) await sh('dd', ['if=/dev/urandom', `of=${join(dir, `f${i}.bin`)}`, 'bs=1M', `count=${s.fileMiB}`, 'status=none']);
    await primeHashes(b);
    await b.emulator.setKnobs({ latencyMs: LATENCY_MS, bandwidthBytesPerSec: BANDWIDTH });
    const counts = [...new Set([Math.min(16, s.readers), s.readers])];
    rows.push(...(await rowsFor(b, 'this', GCSMOUNT, counts, ['--memory-limit-mb', String(s.limitMiB)])));
    if (s.baseline) rows.push(...(await rowsFor(b, 'baseline', s.baseline, [Math.min(16, s.readers)], [])));
  } finally {
    await cleanup(b);
  }
  return report(s, rows);
}

function report(s: ReturnType<typeof scale>, rows: Row[]): string {
  const mbps = (r: Row) => r.bytes / MIB / r.seconds;
  const at16 = (r: Row) => rows.find((x) => x.build === 'this' && x.readers === Math.min(16, s.readers) && x.cache === r.cache && x.round === r.round);
  const bound = s.limitMiB + OVERHEAD_MIB;
  return [
    `Emulator in its own process: ${LATENCY_MS} ms to first byte, ${BANDWIDTH / MIB} MiB/s per response. ${s.readers} files of ${s.fileMiB} MiB, one \`cat\` each, all at once; \`--memory-limit-mb ${s.limitMiB}\` (peak RSS bound: budget + ${OVERHEAD_MIB} MiB = ${bound} MiB); a fresh daemon per row, page cache dropped before each read when root. Scale: MEMORY_BENCH_READERS, MEMORY_BENCH_FILE_MB, MEMORY_BENCH_LIMIT_MB; MEMORY_BENCH_BASELINE_BIN adds another build's 16-reader rows (without the flag).`,
    '',
    'Peak RSS is the whole process: the idle daemon (Node, its code and heap; the "idle" column) is in it, so the bound is also checked on the growth over idle, the part that grows with readers. With a cache dir, warm reads are answered by the native read path from its own memory (up to 128 MiB, outside the budget).',
    '',
    '| build | readers | cache dir | round | throughput | against 16 readers | daemon RSS idle | peak RSS | peak within budget + 64 MiB | growth over idle | growth within budget + 64 MiB | budget peak in use | reads that waited for memory |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|',
    ...rows.map((r) => {
      const base = at16(r);
      const ratio = base && base !== r ? (mbps(r) / mbps(base)).toFixed(2) : '-';
      const verdict = (mib: number) => (r.build === 'this' ? (mib <= bound ? 'yes' : 'NO') : '-');
      const growth = r.peakRssMiB - r.idleRssMiB;
      return `| ${r.build} | ${r.readers} | ${r.cache ? 'yes' : 'no'} | ${r.round} | ${mbps(r).toFixed(0)} MiB/s | ${ratio} | ${r.idleRssMiB.toFixed(0)} MiB | ${r.peakRssMiB.toFixed(0)} MiB | ${verdict(r.peakRssMiB)} | ${growth.toFixed(0)} MiB | ${verdict(growth)} | ${r.memoryPeakMiB === null ? '-' : `${r.memoryPeakMiB.toFixed(0)} MiB`} | ${r.memoryWaits ?? '-'} |`;
    }),
  ].join('\n');
}
