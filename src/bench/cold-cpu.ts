import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { benchBucket, cleanup, daemonPid, GCSMOUNT, mountBench, sh } from './harness.js';

const MIB = 1024 * 1024;
const ROUNDS = 3;

/** User and system CPU time of a process so far, in seconds (proc(5) fields 14 and 15). */
async function cpuSplit(pid: number): Promise<{ user: number; sys: number }> {
  const stat = await fsp.readFile(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { user: Number(fields[11]) / 100, sys: Number(fields[12]) / 100 };
}

async function loadAverage(): Promise<string> {
  return (await fsp.readFile('/proc/loadavg', 'utf8')).split(' ').slice(0, 3).join(' ');
}

interface Sample {
  user: number;
  sys: number;
  /** CPU of a second, other 1 GiB object read through the same mount right after: no start-up costs. */
  second: number;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

/**
 * The daemon's CPU time per GiB of a cold sequential read (GCS through the mount, into the block cache
 * or not), split into user and kernel time. The first GiB is read by a fresh daemon (JIT warm-up, block
 * buffers touched for the first time, a new cache dir); the second, another object, by the same daemon
 * right after. GCSMOUNT_BASELINE_BIN names another build's bin/gcsmount, measured in turn in each round.
 */
export async function coldCpuScenario(): Promise<string> {
  const b = await benchBucket('cold-cpu-bench');
  const layers: [string, string][] = [['this build', GCSMOUNT]];
  if (process.env.GCSMOUNT_BASELINE_BIN) layers.push(['baseline', process.env.GCSMOUNT_BASELINE_BIN]);
  const samples = new Map<string, Sample[]>();
  const loadBefore = await loadAverage();
  try {
    const dir = join(b.root, b.bucket);
    for (const name of ['first.bin', 'second.bin']) await sh('dd', ['if=/dev/urandom', `of=${join(dir, name)}`, 'bs=1M', 'count=1024', 'status=none']);
    // Emulator defaults as in the data-path scenario: 50 ms to first byte, 50 MiB/s per response.
    b.emulator.setKnobs({ latencyMs: 50, bandwidthBytesPerSec: 50 * MIB });
    for (let r = 0; r < ROUNDS; r++) {
      for (const cache of [true, false]) {
        for (const [layer, bin] of layers) {
          const m = await mountBench(b, cache ? ['--cache-dir', join(b.dir, `cache-${layer.replace(/\W/g, '')}-${r}`)] : [], bin);
          const pid = await daemonPid(m.path);
          if (!pid) throw new Error('cannot find the daemon');
          const c0 = await cpuSplit(pid);
          await sh('sh', ['-c', `cat ${join(m.path, 'first.bin')} > /dev/null`]);
          const c1 = await cpuSplit(pid);
          await sh('sh', ['-c', `cat ${join(m.path, 'second.bin')} > /dev/null`]);
          const c2 = await cpuSplit(pid);
          await m.unmount();
          const key = `${layer}\0${cache}`;
          if (!samples.has(key)) samples.set(key, []);
          samples.get(key)!.push({ user: c1.user - c0.user, sys: c1.sys - c0.sys, second: c2.user + c2.sys - (c1.user + c1.sys) });
        }
      }
    }
  } finally {
    await cleanup(b);
  }
  const loadAfter = await loadAverage();
  const f = (x: number) => x.toFixed(2);
  const rows = [...samples.entries()].map(([key, s]) => {
    const [layer, cache] = key.split('\0');
    const totals = s.map((x) => x.user + x.sys);
    return `| ${layer} | ${cache === 'true' ? 'yes' : 'no'} | ${f(median(totals))} | ${f(Math.min(...totals))}-${f(Math.max(...totals))} | ${f(median(s.map((x) => x.user)))} / ${f(median(s.map((x) => x.sys)))} | ${f(median(s.map((x) => x.second)))} | ${f(Math.min(...s.map((x) => x.second)))}-${f(Math.max(...s.map((x) => x.second)))} |`;
  });
  return [
    `Emulator: 50 ms to first byte, 50 MiB/s per response; gcsmount defaults (4 MiB blocks, 16 range GETs); \`cat\` of a 1 GiB object. ${ROUNDS} rounds, builds in turn within each. Load average before ${loadBefore}, after ${loadAfter}.`,
    '',
    '| build | --cache-dir | daemon CPU s, first GiB of a fresh daemon (median) | range | user / sys (median) | CPU s, a second GiB on the same mount (median) | range |',
    '|---|---|---|---|---|---|---|',
    ...rows,
  ].join('\n');
}
