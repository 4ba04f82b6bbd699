import { spawn } from 'node:child_process';
import { closeSync, openSync, promises as fsp, writeSync } from 'node:fs';
import { join } from 'node:path';
import { benchBucket, cleanup, cpuSeconds, daemonPid, mountBench, timed } from './harness.js';

const FILES = 10_000;
const THREADS = [1, 4] as const;

/** Python stats every path once, split over `threads` threads (os.stat lets go of the GIL). */
async function statAll(paths: string[], threads: number): Promise<void> {
  const script = `
import os, sys
from concurrent.futures import ThreadPoolExecutor
paths = sys.stdin.read().split('\\n')
with ThreadPoolExecutor(${threads}) as ex:
    sizes = list(ex.map(lambda p: os.stat(p).st_size, paths, chunksize=64))
assert all(s == 64 for s in sizes), 'wrong size'
`;
  const r = await new Promise<{ code: number; stderr: string }>((done) => {
    // The paths go through stdin: 10,000 of them are too long for an argument list.
    const child = spawn('/usr/bin/python3', ['-c', script], { stdio: ['pipe', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('close', (code) => done({ code: code ?? 1, stderr }));
    child.stdin.end(paths.join('\n'));
  });
  if (r.code !== 0) throw new Error(`stat reader failed: ${r.stderr}`);
}

/** Forgets the kernel's dentries and inodes (FUSE's included: the daemon gets FORGETs, keeps its own caches). */
async function dropDentries(): Promise<void> {
  await fsp.writeFile('/proc/sys/vm/drop_caches', '2');
}

/**
 * stat(2) of 10,000 distinct files in one folder by 1 and 4 threads, with no latency at the emulator, so
 * the figure is the FUSE layer's and the daemon's cost per lookup: on a fresh mount (the daemon lists the
 * folder on the first lookup), and again with the daemon's caches warm but the kernel's dentries dropped
 * (every stat a FUSE LOOKUP answered from memory). The baseline is the same stats of the emulator's own
 * files on local disk, dentries dropped first, in the same run.
 */
export async function statScenario(): Promise<string> {
  const b = await benchBucket('stat-bench');
  const folder = join(b.root, b.bucket, 'many');
  await fsp.mkdir(folder);
  const body = Buffer.alloc(64, 7);
  const names = Array.from({ length: FILES }, (_, i) => `chunk.${i}`);
  for (const n of names) {
    const fd = openSync(join(folder, n), 'w');
    writeSync(fd, body);
    closeSync(fd);
  }
  // Shuffled, the same for every reader: not the listing's order.
  const order = names.map((n, i) => ({ n, k: (i * 7919) % FILES })).sort((x, y) => x.k - y.k).map((x) => x.n);
  const rows: string[] = [];
  const perSec = (s: number) => Math.round(FILES / s).toLocaleString('en');
  try {
    for (const threads of THREADS) {
      await dropDentries();
      const local = await timed(() => statAll(order.map((n) => join(folder, n)), threads));
      const m = await mountBench(b);
      try {
        const pid = await daemonPid(m.path);
        const paths = order.map((n) => join(m.path, 'many', n));
        for (const round of ['fresh mount', 'daemon warm, kernel dentries dropped'] as const) {
          if (round !== 'fresh mount') await dropDentries();
          await b.emulator.resetStats();
          const cpu0 = pid ? await cpuSeconds(pid) : NaN;
          const t = await timed(() => statAll(paths, threads));
          const cpu = pid ? (await cpuSeconds(pid)) - cpu0 : NaN;
          const req = (await b.emulator.stats()).requests;
          rows.push(
            `| ${threads} | ${round} | ${perSec(t.seconds)} | ${perSec(local.seconds)} | ${((cpu / FILES) * 1e6).toFixed(0)} µs | ${req.list} | ${req.metadata} |`,
          );
        }
      } finally {
        await m.unmount();
      }
    }
    return [
      `${FILES.toLocaleString('en')} files of 64 bytes in one folder, stat(2) of each once in a shuffled order by python threads; emulator latency 0; gcsmount defaults.`,
      '',
      '| threads | round | stats/s through gcsmount | stats/s on local disk (dentries dropped) | daemon CPU per stat | list requests | metadata requests |',
      '|---|---|---|---|---|---|---|',
      ...rows,
    ].join('\n');
  } finally {
    await cleanup(b);
  }
}
