import { promises as fsp, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { BlockIndex, type BlockRow } from '../blocks/block-index.js';
import { BLOCKS_DIR, DEFAULT_DISK_CACHE, DiskCache } from '../blocks/disk-cache.js';
import { silentLogger } from '../observe/logger.js';
import { Metrics } from '../observe/metrics.js';
import { benchBucket, catToNull, cleanup, cpuSeconds, daemonPid, dropPageCache, GCSMOUNT, mountBench, mountStats, sh, timed } from './harness.js';

const N = 1_000_000;
const MIB = 1024 * 1024;

function row(i: number): BlockRow {
  const key = i.toString(16).padStart(32, '0');
  return { key, bucket: 'bench', object: `store.zarr/var/${Math.floor(i / 16)}`, generation: '1700000000000000', block: i % 16, size: 4 * MIB, crc32c: i, lastAccess: i };
}

/** SQLite index at a million blocks: the operations on the read path, eviction, and a restart. */
export async function indexScenario(): Promise<string> {
  const dir = await fsp.mkdtemp('/tmp/gcsmount-bench-index-');
  try {
    const path = join(dir, 'index.sqlite');
    let index = BlockIndex.open(path);
    const insert = await timed(async () => {
      for (let i = 0; i < N; i += 10_000) index.putMany(Array.from({ length: 10_000 }, (_, j) => row(i + j)));
    });
    const LOOKUPS = 200_000;
    const lookup = await timed(async () => {
      let found = 0;
      for (let i = 0; i < LOOKUPS; i++) if (index.get(row(Math.floor(Math.random() * N)).key)) found++;
      if (found !== LOOKUPS) throw new Error('lookups missed');
    });
    const TOUCHES = 200_000;
    const touch = await timed(async () => {
      for (let i = 0; i < TOUCHES; i++) index.touch(row(Math.floor(Math.random() * N)).key, N + i);
      index.flushAccess();
    });
    const evict = await timed(async () => {
      const victims = index.oldest(N / 10).map((r) => r.key);
      index.delete(victims);
    });
    index.close(true);
    const cleanOpen = await timed(async () => {
      index = BlockIndex.open(path);
      index.totals();
    });
    index.close(false);
    // A dirty restart with every block's file present: the reconciliation scan the daemon runs after a crash.
    const blocks = join(dir, BLOCKS_DIR);
    const reopened = BlockIndex.open(path);
    const keys = [...reopened.keys()];
    reopened.close(false);
    for (let fan = 0; fan < 256; fan++) await fsp.mkdir(join(blocks, fan.toString(16).padStart(2, '0')), { recursive: true });
    for (const k of keys) writeFileSync(join(blocks, k.slice(0, 2), k), '');
    const dirty = await timed(async () => {
      const cache = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE }, silentLogger, new Metrics());
      await cache.ready;
      cache.close();
    });
    const rate = (n: number, s: number) => `${Math.round(n / s).toLocaleString('en-US')}/s`;
    return [
      '| operation | count | time | rate |',
      '|---|---|---|---|',
      `| insert (batches of 10,000) | ${N.toLocaleString('en-US')} | ${insert.seconds.toFixed(2)} s | ${rate(N, insert.seconds)} |`,
      `| lookup by key (random) | ${LOOKUPS.toLocaleString('en-US')} | ${lookup.seconds.toFixed(2)} s | ${rate(LOOKUPS, lookup.seconds)} |`,
      `| access-time batch flush (random) | ${TOUCHES.toLocaleString('en-US')} | ${touch.seconds.toFixed(2)} s | ${rate(TOUCHES, touch.seconds)} |`,
      `| evict 10% (LRU select + delete) | ${(N / 10).toLocaleString('en-US')} | ${evict.seconds.toFixed(2)} s | ${rate(N / 10, evict.seconds)} |`,
      `| restart after a clean stop (open + totals) | ${(N * 0.9).toLocaleString('en-US')} rows | ${cleanOpen.seconds.toFixed(3)} s | |`,
      `| restart after a crash (full reconcile of files and rows) | ${keys.length.toLocaleString('en-US')} files | ${dirty.seconds.toFixed(2)} s | |`,
    ].join('\n');
  } finally {
    await fsp.rm(dir, { recursive: true, force: true });
  }
}

/** Warm reads through the mount (blocks on local disk) against `cat` of the same bytes from a plain file. */
/**
 * Warm reads through the mount (blocks on local disk) against `cat` of the same bytes from a plain file,
 * with the daemon's CPU time and the size of the kernel's read requests. GCSMOUNT_BASELINE_BIN names
 * another build's bin/gcsmount (e.g. the fuse-native layer) to measure in the same run.
 */
export async function warmReadScenario(): Promise<string> {
  const b = await benchBucket('warm-bench');
  const SIZE = 1024 * MIB;
  const source = join(b.root, b.bucket, 'one-gib.bin');
  await sh('dd', ['if=/dev/urandom', `of=${source}`, 'bs=1M', `count=${SIZE / MIB}`, 'status=none']);
  const cacheDir = join(b.dir, 'cache');
  const layers: [string, string][] = [['this build', GCSMOUNT]];
  if (process.env.GCSMOUNT_BASELINE_BIN) layers.push(['baseline: ' + process.env.GCSMOUNT_BASELINE_BIN, process.env.GCSMOUNT_BASELINE_BIN]);
  try {
    const fill = await mountBench(b, ['--cache-dir', cacheDir]);
    await catToNull([join(fill.path, 'one-gib.bin')]);
    await fill.unmount();
    await new Promise((r) => setTimeout(r, 1500)); // the daemon sees its mount go and releases the cache
    const rows: string[] = [];
    for (const pageCache of ['dropped', 'kept'] as const) {
      for (const [layer, bin] of layers) {
        if (pageCache === 'dropped') await dropPageCache();
        const plain = await timed(() => catToNull([source]));
        const m = await mountBench(b, ['--cache-dir', cacheDir], bin);
        const pid = await daemonPid(m.path);
        await b.emulator.resetStats();
        if (pageCache === 'dropped') await dropPageCache();
        const before = await readStats(m.path);
        const cpu0 = pid ? await cpuSeconds(pid) : NaN;
        const viaMount = await timed(() => catToNull([join(m.path, 'one-gib.bin')]));
        const cpu1 = pid ? await cpuSeconds(pid) : NaN;
        const after = await readStats(m.path);
        const media = (await b.emulator.stats()).requests.media;
        await m.unmount();
        await new Promise((r) => setTimeout(r, 1500));
        const reads = after.reads - before.reads;
        const native = after.nativeReads - before.nativeReads;
        const perRead = reads ? (after.bytes - before.bytes) / reads / 1024 : NaN;
        const mbps = (s: number) => (SIZE / MIB / s).toFixed(0);
        rows.push(
          `| OS page cache ${pageCache} | ${layer} | ${mbps(plain.seconds)} MiB/s | ${mbps(viaMount.seconds)} MiB/s | ${(plain.seconds / viaMount.seconds).toFixed(2)} | ${(cpu1 - cpu0).toFixed(2)} | ${reads} | ${native} | ${perRead.toFixed(0)} KiB | ${media} |`,
        );
      }
    }
    return [
      '| case | FUSE layer | cat of the plain file | cat through the mount (warm block cache) | ratio (mount / plain) | daemon CPU s per GiB | FUSE reads | of them native | bytes per FUSE read | media requests |',
      '|---|---|---|---|---|---|---|---|---|---|',
      ...rows,
    ].join('\n');
  } finally {
    await cleanup(b);
  }
}

/**
 * FUSE read count and bytes, from `gcsmount stats --json` (any build's daemon answers it): reads answered
 * by JavaScript plus those answered by the native path (a build without it reports none).
 */
async function readStats(mountPoint: string): Promise<{ reads: number; nativeReads: number; bytes: number }> {
  const s = await mountStats(mountPoint);
  const nativeReads = s.counters.native_reads ?? 0;
  return { reads: (s.fuseOps.read?.count ?? 0) + nativeReads, nativeReads, bytes: s.counters.fuse_read_bytes ?? 0 };
}
