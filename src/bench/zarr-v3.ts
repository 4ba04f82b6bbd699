import { promises as fsp } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { benchBucket, childrenCpuSeconds, cleanup, cpuSeconds, daemonPid, mountBench, primeHashes, sh, type BenchBucket } from './harness.js';

/**
 * The v3 part of `npm run bench -- zarr` (issue 31): the same data written plain and sharded (shards of
 * 48 inner chunks of ~1.1 MB, as zarr-python 3 would write ERA5-like data) by
 * test/fixtures/make_v3_zarr.mjs, read by test/fixtures/read_v3_zarr.mjs as zarr reads it (shard index
 * by range, then each inner chunk by range, re-opening the shard each time) from READERS processes
 * splitting the chunks as dask threads would; cold and warm (two epochs) through gcsmount, and the local copy cold,
 * in the same run. Then a shuffled loader, READERS processes, one cold epoch. GCSMOUNT_BENCH_V3_SHARDS
 * scales it (default 8 shards: 384 inner chunks, ~420 MB per array).
 */

const FIXTURES = fileURLToPath(new URL('../../test/fixtures/', import.meta.url));
const READERS = 16;
const INNER = 1_100_000;
const PER_SHARD = 48;
const LATENCY_MS = 30;
const CORES = availableParallelism();

interface Row {
  case: string;
  seconds: number;
  media: number;
  mediaBytes: number;
  /** CPU-s of the reader processes, the daemon (0 for the local copy) and the emulator in the round. */
  cpu: { readers: number; daemon: number; emulator: number };
}

export async function zarrV3Rounds(b: BenchBucket, dropFromPageCache: (dir: string) => Promise<void>): Promise<string> {
  const shards = Number(process.env.GCSMOUNT_BENCH_V3_SHARDS ?? 8);
  const local = join(b.root, b.bucket, 'v3');
  const grid = { shape: [shards * 6, 8 * INNER], chunk: [1, INNER] };
  const spec = { arrays: [{ path: 'plain', ...grid }, { path: 'sharded', ...grid, shard: [6, 8 * INNER] }] };
  if (PER_SHARD !== 6 * 8) throw new Error('shard shape and PER_SHARD disagree');
  const made = await sh(process.execPath, [join(FIXTURES, 'make_v3_zarr.mjs'), local, JSON.stringify(spec)]);
  if (made.code !== 0) throw new Error(`make_v3_zarr.mjs: ${made.stderr}`);
  await primeHashes(b);
  await b.emulator.setKnobs({ latencyMs: LATENCY_MS });
  const rows: Row[] = [];

  // Every party's CPU is counted because on two cores they share, the sum over the cores bounds the
  // round's time from below whatever gcsmount does: the figure that says whether a goal fits the machine.
  const round = async (label: string, root: string, array: string, order: string[], mountPoint?: string): Promise<void> => {
    await b.emulator.resetStats();
    const daemon = mountPoint === undefined ? null : await daemonPid(mountPoint);
    const cpuNow = async () => ({
      readers: await childrenCpuSeconds(),
      daemon: daemon === null ? 0 : await cpuSeconds(daemon),
      emulator: await cpuSeconds(b.emulator.pid),
    });
    const cpu0 = await cpuNow();
    const t0 = performance.now();
    const runs = await Promise.all(
      Array.from({ length: READERS }, (_, k) => sh(process.execPath, [join(FIXTURES, 'read_v3_zarr.mjs'), root, '-', array, ...order, '--part', `${k}/${READERS}`])),
    );
    const seconds = (performance.now() - t0) / 1000;
    for (const r of runs) if (r.code !== 0) throw new Error(`read_v3_zarr.mjs ${root} ${array}: ${r.stderr}`);
    const cpu1 = await cpuNow();
    const s = await b.emulator.stats();
    const cpu = { readers: cpu1.readers - cpu0.readers, daemon: cpu1.daemon - cpu0.daemon, emulator: cpu1.emulator - cpu0.emulator };
    rows.push({ case: label, seconds, media: s.requests.media, mediaBytes: s.mediaBytes, cpu });
    process.stderr.write(`zarr v3 bench: ${label}: ${seconds.toFixed(1)} s\n`);
  };

  const inOrder = ['--order', 'c'];
  const shuffled = ['--order', 'shuffle', '--seed', '7'];
  for (const array of ['plain', 'sharded']) {
    await dropFromPageCache(local);
    await round(`local copy, ${array}, cold`, local, array, inOrder);
    const cacheDir = await fsp.mkdtemp(join(b.dir, 'v3-cache-'));
    const m = await mountBench(b, ['--cache-dir', cacheDir]);
    try {
      await round(`gcsmount, ${array}, cold`, join(m.path, 'v3'), array, inOrder, m.path);
      await round(`gcsmount, ${array}, warm`, join(m.path, 'v3'), array, inOrder, m.path);
      // The second warm epoch: the first still fills the kernel's page cache (a sharded array's cached
      // shards too) and loads blocks into fresh memory; later epochs of a training run cost what this does.
      await round(`gcsmount, ${array}, warm again`, join(m.path, 'v3'), array, inOrder, m.path);
    } finally {
      await m.unmount();
      await fsp.rm(cacheDir, { recursive: true, force: true });
    }
  }
  await dropFromPageCache(local);
  await round('local copy, sharded, shuffled loader', local, 'sharded', shuffled);
  const cacheDir = await fsp.mkdtemp(join(b.dir, 'v3-cache-'));
  const m = await mountBench(b, ['--cache-dir', cacheDir]);
  try {
    await round('gcsmount, sharded, shuffled loader, cold', join(m.path, 'v3'), 'sharded', shuffled, m.path);
  } finally {
    await m.unmount();
    await fsp.rm(cacheDir, { recursive: true, force: true });
  }

  const at = (label: string) => rows.find((r) => r.case === label)!.seconds;
  const ratios = [
    `sharded cold / plain cold through gcsmount: ${(at('gcsmount, sharded, cold') / at('gcsmount, plain, cold')).toFixed(2)}x (goal <= 1.2x)`,
    `sharded cold through gcsmount / local copy cold: ${(at('gcsmount, sharded, cold') / at('local copy, sharded, cold')).toFixed(2)}x (goal <= 2x)`,
    `shuffled loader, cold epoch / local copy: ${(at('gcsmount, sharded, shuffled loader, cold') / at('local copy, sharded, shuffled loader')).toFixed(2)}x (goal <= 1.5x)`,
  ];
  return [
    `Zarr v3 (issue 31): ${shards * PER_SHARD} inner chunks of ${INNER / 1e6} MB per array, plain (one file each) and sharded ` +
      `(${shards} shards of ${PER_SHARD}), raw bytes; ${READERS} reader processes as zarr reads (index, then each inner chunk by range); ` +
      `emulator at ${LATENCY_MS} ms.`,
    '',
    `| case | seconds | media requests | MB from GCS | CPU-s: readers / daemon / emulator | all CPU / ${CORES} cores |`,
    '|---|---|---|---|---|---|',
    ...rows.map(
      (r) =>
        `| ${r.case} | ${r.seconds.toFixed(1)} | ${r.media} | ${(r.mediaBytes / 1e6).toFixed(0)} | ` +
        `${r.cpu.readers.toFixed(2)} / ${r.cpu.daemon.toFixed(2)} / ${r.cpu.emulator.toFixed(2)} | ${((r.cpu.readers + r.cpu.daemon + r.cpu.emulator) / CORES).toFixed(2)} s |`,
    ),
    '',
    ...ratios,
  ].join('\n');
}

/** `npm run bench -- zarr-v3`: the v3 rounds alone (the zarr scenario runs them too, after its own). */
export async function zarrV3Scenario(dropFromPageCache: (dir: string) => Promise<void>): Promise<string> {
  const b = await benchBucket('zarr-v3-bench');
  try {
    await b.emulator.setKnobs({ bandwidthBytesPerSec: 50_000_000 });
    return await zarrV3Rounds(b, dropFromPageCache);
  } finally {
    await cleanup(b);
  }
}
