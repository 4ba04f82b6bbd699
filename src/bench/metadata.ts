import { closeSync, openSync, writeSync } from 'node:fs';
import { promises as fsp } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { benchBucket, cleanup, cpuSeconds, daemonPid, mountBench, peakRssMiB, primeHashes, sh, timed } from './harness.js';

const LATENCY_MS = 30;
/** Real GCS answers a 1,000-entry list page in 100-300 ms, a 1-entry one in a round trip. */
const LIST_MS_PER_ENTRY = 0.2;
const BIG = 100_000;
const READERS = 16;
const OPENS_PER_READER = 10;

/** Current resident memory of a process, in MiB. */
async function rssMiB(pid: number): Promise<number> {
  const status = await fsp.readFile(`/proc/${pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+)/.exec(status)![1]) / 1024;
}

/** 16 reader processes, each opening (and closing) its 10 paths one after another; all at once. */
function openAll(paths: string[]): Promise<unknown> {
  const per = Math.ceil(paths.length / READERS);
  return Promise.all(
    Array.from({ length: READERS }, (_, r) =>
      sh('/usr/bin/python3', ['-c', 'import os, sys\nfor p in sys.argv[1:]:\n    os.close(os.open(p, os.O_RDONLY))', ...paths.slice(r * per, (r + 1) * per)]).then((res) => {
        if (res.code !== 0) throw new Error(`reader failed: ${res.stderr}`);
      }),
    ),
  );
}

function row(phase: string, seconds: number, requests: { list: number; metadata: number; total: number }, local: number | null, goal: string): string {
  return `| ${phase} | ${seconds.toFixed(2)} s | ${requests.list} | ${requests.metadata} | ${requests.total} | ${local === null ? '' : `${local.toFixed(3)} s`} | ${goal} |`;
}

/**
 * Metadata at scale, 30 ms per request: `ls -f` of a 100,000-object folder cold and warm, 160 random
 * opens by 16 readers in it on a fresh mount, a cold `find -ls` over 10,000 objects in 100 folders on
 * a fresh mount, and the daemons' memory after it all. The baseline is the same command on the
 * emulator's own folders on local disk, in the same run.
 */
export async function metadataScenario(): Promise<string> {
  const b = await benchBucket('meta-bench');
  const bucketDir = join(b.root, b.bucket);
  await fsp.mkdir(join(bucketDir, 'big'));
  // 64 bytes each, like a tiny chunk; written synchronously, which is seconds for 100,000.
  const body = Buffer.alloc(64, 7);
  for (let i = 0; i < BIG; i++) {
    const fd = openSync(join(bucketDir, 'big', `c.${i}`), 'w');
    writeSync(fd, body);
    closeSync(fd);
  }
  for (let d = 0; d < 100; d++) {
    const dir = join(bucketDir, 'walk', `folder-${String(d).padStart(3, '0')}`);
    await fsp.mkdir(dir, { recursive: true });
    for (let f = 0; f < 100; f++) closeSync(openSync(join(dir, `chunk.${f}`), 'w'));
  }
  await primeHashes(b);
  const picks = Array.from({ length: READERS * OPENS_PER_READER }, (_, i) => `c.${(i * 7919 + 13) % BIG}`);
  try {
    const localLs = await timed(() => sh('ls', ['-f', join(bucketDir, 'big')]));
    const localFind = await timed(() => sh('find', [join(bucketDir, 'walk'), '-ls']));
    const localOpens = await timed(() => openAll(picks.map((p) => join(bucketDir, 'big', p))));
    const rows: string[] = [];
    const rss: string[] = [];
    const cpu: string[] = [];

    // One mount: cold ls -f, then warm.
    const a = await mountBench(b);
    await b.emulator.setKnobs({ latencyMs: LATENCY_MS, listMsPerEntry: LIST_MS_PER_ENTRY });
    await b.emulator.resetStats();
    const cold = await timed(() => sh('ls', ['-f', join(a.path, 'big')]));
    const lines = cold.result.stdout.trim().split('\n').length - 2;
    if (lines !== BIG) throw new Error(`ls -f listed ${lines} names, not ${BIG}`);
    rows.push(row(`cold \`ls -f\` of ${BIG.toLocaleString('en')} objects`, cold.seconds, (await b.emulator.stats()).requests, localLs.seconds, '<= 4 s'));
    await b.emulator.resetStats();
    const warm = await timed(() => sh('ls', ['-f', join(a.path, 'big')]));
    rows.push(row('warm `ls -f` (same mount)', warm.seconds, (await b.emulator.stats()).requests, localLs.seconds, '<= 0.5 s, 0 requests'));
    const pidA = await daemonPid(a.path);
    if (pidA) rss.push(`after the two \`ls -f\`: RSS ${(await rssMiB(pidA)).toFixed(0)} MiB (peak ${(await peakRssMiB(pidA)).toFixed(0)} MiB)`);
    await a.unmount();

    // A fresh mount: 160 random opens by 16 readers, then a cold find -ls elsewhere, then ls -f again.
    await b.emulator.setKnobs({ latencyMs: 0 });
    const m = await mountBench(b);
    await b.emulator.setKnobs({ latencyMs: LATENCY_MS, listMsPerEntry: LIST_MS_PER_ENTRY });
    await b.emulator.resetStats();
    const mPid = await daemonPid(m.path);
    const cpuBefore = { daemon: mPid ? await cpuSeconds(mPid) : 0, emulator: await cpuSeconds(b.emulator.pid) };
    const opens = await timed(() => openAll(picks.map((p) => join(m.path, 'big', p))));
    const openRequests = (await b.emulator.stats()).requests;
    rows.push(row(`${picks.length} random opens by ${READERS} readers (fresh mount): ${(openRequests.total / picks.length).toFixed(2)} requests per open`, opens.seconds, openRequests, localOpens.seconds, '<= 2 s, <= 1.2 requests per open'));
    // The emulator's CPU next to the daemon's: on 2 cores the two share the machine.
    const emulatorCpu = (await cpuSeconds(b.emulator.pid)) - cpuBefore.emulator;
    cpu.push(
      `during the ${picks.length} opens: daemon ${((mPid ? await cpuSeconds(mPid) : 0) - cpuBefore.daemon).toFixed(2)} CPU-s, ` +
        `emulator ${emulatorCpu.toFixed(2)} CPU-s`,
    );
    // The same opens through a baseline build on a fresh mount, when one is given (GCSMOUNT_BASELINE_BIN).
    const baseline = process.env.GCSMOUNT_BASELINE_BIN;
    if (baseline) {
      await b.emulator.setKnobs({ latencyMs: 0 });
      const bm = await mountBench(b, [], baseline);
      await b.emulator.setKnobs({ latencyMs: LATENCY_MS, listMsPerEntry: LIST_MS_PER_ENTRY });
      await b.emulator.resetStats();
      const baseOpens = await timed(() => openAll(picks.map((p) => join(bm.path, 'big', p))));
      const baseRequests = (await b.emulator.stats()).requests;
      rows.push(row(`the same opens, baseline ${process.env.GCSMOUNT_BASELINE_LABEL ?? baseline}: ${(baseRequests.total / picks.length).toFixed(2)} requests per open`, baseOpens.seconds, baseRequests, localOpens.seconds, ''));
      await bm.unmount();
    }
    // Pages ahead that the opens paid for may still be under way; let them end before the next figure.
    await new Promise((r) => setTimeout(r, 5_000));
    await b.emulator.resetStats();
    const find = await timed(() => sh('find', [join(m.path, 'walk'), '-ls']));
    const found = find.result.stdout.trim().split('\n').length;
    if (found !== 10_101) throw new Error(`find -ls listed ${found} lines, not 10,101`);
    rows.push(row('cold `find -ls`, 10,000 objects in 100 folders', find.seconds, (await b.emulator.stats()).requests, localFind.seconds, '<= 1.5 s'));
    await b.emulator.resetStats();
    const again = await timed(() => sh('ls', ['-f', join(m.path, 'big')]));
    rows.push(row('`ls -f` after the opens (the folder was never listed whole for them)', again.seconds, (await b.emulator.stats()).requests, localLs.seconds, ''));
    const pid = await daemonPid(m.path);
    if (pid) rss.push(`after opens, find and ls: RSS ${(await rssMiB(pid)).toFixed(0)} MiB (peak ${(await peakRssMiB(pid)).toFixed(0)} MiB); goal <= 256 MiB`);
    const stats = await sh(join(process.cwd(), 'bin/gcsmount'), ['stats', m.path, '--json']);
    let memory = '';
    if (stats.code === 0) {
      const g = (JSON.parse(stats.stdout) as { gauges: Record<string, number | undefined> }).gauges;
      // A daemon without the per-cache gauges (the baseline build) reports none.
      memory =
        g.meta_listing_bytes === undefined
          ? 'listings held: not reported by this build'
          : `listings held: ${g.meta_listing_folders} folders, ${g.meta_listing_entries} entries, ${(g.meta_listing_bytes / 2 ** 20).toFixed(1)} MiB of the ${((g.meta_stat_limit_bytes ?? 0) / 2 ** 20).toFixed(0)} MiB stat budget`;
    }
    await m.unmount();
    return [
      `Emulator latency ${LATENCY_MS} ms per request and ${LIST_MS_PER_ENTRY} ms per list entry returned; default flags (metadata prefetch on, 10 list workers, 33 MiB stat cache).`,
      '',
      '| phase | wall time | list requests | metadata requests | all requests | local disk (same run) | goal |',
      '|---|---|---|---|---|---|---|',
      ...rows,
      '',
      `Daemon memory: ${rss.join('; ')}. ${memory}.`,
      '',
      `CPU ${cpu.join('; ')} (${cpus().length} cores in all).`,
    ].join('\n');
  } finally {
    await cleanup(b);
  }
}
