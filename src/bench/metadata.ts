import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { benchBucket, cleanup, mountBench, sh, timed } from './harness.js';

/**
 * `find -ls` over 10,000 objects in 100 folders with 50 ms of emulator latency: cold (every folder
 * listed once, every entry's attributes from the listing), then warm within the TTL (no request at all).
 * The baseline is the same `find -ls` over the emulator's own folder on local disk.
 */
export async function metadataScenario(): Promise<string> {
  const b = await benchBucket('meta-bench');
  for (let d = 0; d < 100; d++) {
    const dir = join(b.root, b.bucket, `folder-${String(d).padStart(3, '0')}`);
    await fsp.mkdir(dir);
    await Promise.all(Array.from({ length: 100 }, (_, f) => fsp.writeFile(join(dir, `chunk.${f}`), String(f))));
  }
  try {
    const local = await timed(() => sh('find', [join(b.root, b.bucket), '-ls']));
    const m = await mountBench(b);
    b.emulator.setKnobs({ latencyMs: 50 });
    const rows: string[] = [];
    for (const phase of ['cold', 'warm'] as const) {
      b.emulator.resetStats();
      const run = await timed(() => sh('find', [m.path, '-ls']));
      const lines = run.result.stdout.trim().split('\n').length;
      const req = b.emulator.stats().requests;
      rows.push(`| ${phase} | ${run.seconds.toFixed(2)} s | ${lines} | ${req.list} | ${req.metadata} | ${req.total} | ${(run.seconds / local.seconds).toFixed(0)}x |`);
    }
    await m.unmount();
    return [
      '| phase | wall time | entries | list requests | metadata requests | all requests | vs local disk |',
      '|---|---|---|---|---|---|---|',
      ...rows,
      `| local disk (baseline) | ${local.seconds.toFixed(3)} s | ${local.result.stdout.trim().split('\n').length} | | | | 1x |`,
    ].join('\n');
  } finally {
    await cleanup(b);
  }
}
