import { closeSync, openSync, promises as fsp, writeSync } from 'node:fs';
import { join } from 'node:path';
import { benchBucket, cleanup, cpuSeconds, daemonPid, GCSMOUNT, mountBench, mountStats, sh, timed } from './harness.js';

const FILES = 10_000;

/** Forgets the kernel's dentries and inodes (FUSE's included: the daemon gets FORGETs, keeps its own caches). */
async function dropDentries(): Promise<void> {
  await fsp.writeFile('/proc/sys/vm/drop_caches', '2');
}

async function fuseOps(bin: string, mountPoint: string): Promise<Record<string, number>> {
  const s = await mountStats(mountPoint, bin);
  return Object.fromEntries(Object.entries(s.fuseOps).map(([op, v]) => [op, v.count]));
}

/**
 * `ls -l` of 10,000 files in one folder (emulator latency 0, so the figures are the FUSE layer's and the
 * daemon's): on a fresh mount, again on the same mount, and with the daemon warm but the kernel's
 * dentries dropped (root). Counts the FUSE requests each round cost: with READDIRPLUS the listing
 * carries every entry's attributes, without it every name is a LOOKUP. GCSMOUNT_BENCH_BASELINE names
 * another gcsmount binary (an older build) to run the same rounds in the same run; the baseline on disk
 * is `ls -l` of the emulator's own folder, dentries dropped first.
 */
export async function listingScenario(): Promise<string> {
  const b = await benchBucket('listing-bench');
  const folder = join(b.root, b.bucket, 'many');
  await fsp.mkdir(folder);
  for (let i = 0; i < FILES; i++) {
    const fd = openSync(join(folder, `f.${i}`), 'w');
    writeSync(fd, Buffer.alloc(i % 100, 7));
    closeSync(fd);
  }
  const bins: [string, string][] = [['this build', GCSMOUNT]];
  if (process.env.GCSMOUNT_BENCH_BASELINE) bins.push(['baseline', process.env.GCSMOUNT_BENCH_BASELINE]);
  const rows: string[] = [];
  try {
    // The emulator (in this process) lists the folder once before any mount does, so that the first
    // build measured does not pay for its warm-up.
    let token: string | undefined;
    do {
      const url = `${b.emulator.url}/storage/v1/b/${b.bucket}/o?prefix=many/&delimiter=/&maxResults=1000${token ? `&pageToken=${token}` : ''}`;
      token = ((await (await fetch(url)).json()) as { nextPageToken?: string }).nextPageToken;
    } while (token);
    await dropDentries();
    const local = await timed(() => sh('ls', ['-l', folder]));
    for (const [label, bin] of bins) {
      const m = await mountBench(b, [], bin);
      try {
        const pid = await daemonPid(m.path);
        for (const round of ['fresh mount', 'same mount again', 'daemon warm, kernel dentries dropped'] as const) {
          if (round === 'daemon warm, kernel dentries dropped') await dropDentries();
          await b.emulator.resetStats();
          const ops0 = await fuseOps(bin, m.path);
          const cpu0 = pid ? await cpuSeconds(pid) : NaN;
          const t = await timed(() => sh('ls', ['-l', join(m.path, 'many')]));
          const cpu = pid ? (await cpuSeconds(pid)) - cpu0 : NaN;
          const lines = t.result.stdout.split('\n').filter((l) => l.startsWith('-')).length;
          if (lines !== FILES) throw new Error(`ls -l showed ${lines} files, not ${FILES}`);
          const ops = await fuseOps(bin, m.path);
          const d = (op: string) => (ops[op] ?? 0) - (ops0[op] ?? 0);
          rows.push(
            `| ${label} | ${round} | ${t.seconds.toFixed(3)} s | ${d('lookup')} | ${d('readdir')} + ${d('readdirplus')} | ${cpu.toFixed(2)} | ${(await b.emulator.stats()).requests.total} | ${local.seconds.toFixed(3)} s |`,
          );
        }
      } finally {
        await m.unmount();
      }
    }
    return [
      `${FILES.toLocaleString('en')} files of 0-99 bytes in one folder, \`ls -l\` of it; emulator latency 0; gcsmount defaults.`,
      '',
      '| build | round | wall time | LOOKUPs | READDIR + READDIRPLUS requests | daemon CPU-s | GCS requests | local disk (dentries dropped) |',
      '|---|---|---|---|---|---|---|---|',
      ...rows,
    ].join('\n');
  } finally {
    await cleanup(b);
  }
}
