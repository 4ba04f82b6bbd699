import { releaseIdleMemory } from '../block-memory.js';
import { BlockBuffers } from '../blocks/block-buffers.js';
import { IndexLockedError } from '../blocks/block-index.js';
import { BlockSource } from '../blocks/block-source.js';
import { cacheFilter } from '../blocks/cache-filter.js';
import { prepareCacheHome } from '../blocks/cache-home.js';
import { DEFAULT_DISK_CACHE, DiskCache } from '../blocks/disk-cache.js';
import { DownloadScheduler } from '../blocks/download-scheduler.js';
import { ReadaheadBudget } from '../blocks/readahead-budget.js';
import type { FuseAddon } from '../fs/kernel.js';
import { NATIVE_MEMORY_BYTES, NativeReads } from '../fs/native-reads.js';
import type { ObjectClient } from '../gcs/object-client.js';
import type { MemoryBudget } from '../memory/memory-budget.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import { PrefetchStore } from '../prefetch/prefetch-store.js';
import { PrivateDirError } from '../private-dir.js';
import { EXIT, UserError } from './exit.js';
import { mountMemoryBudget } from './memory-limit.js';
import { getSizeLimit, type MountOptions } from './options.js';

const MIB = 1024 * 1024;

/** What the read path's blocks come from and live in, built by wireBlocks(). */
export interface BlockStack {
  blockSize: number;
  scheduler: DownloadScheduler;
  budget: ReadaheadBudget;
  /** The mount's one memory budget (blocks, upload chunks, native reads, listings). */
  memory: MemoryBudget;
  buffers: BlockBuffers;
  prefetchStore: PrefetchStore;
  blocks: BlockSource;
  /** Reads of blocks already on disk answered by the addon's threads; null without a disk cache. */
  native: NativeReads | null;
}

export interface BlockWiringDeps {
  client: ObjectClient;
  disk: DiskCache | null;
  fuse: FuseAddon;
  /** Download workers' count: with any, block memory is shared with them. */
  downloadWorkers: number;
  log: Logger;
  metrics: Metrics;
}

/**
 * The block cache on disk, when --cache-dir is given and --file-cache-max-size-mb is not 0. Problems a
 * user can fix (a directory that cannot be made or written, one another daemon holds) stop the mount
 * with one line; later trouble (a full disk) only turns the cache off for a while.
 */
export function openDiskCache(opts: MountOptions, log: Logger, metrics: Metrics): DiskCache | null {
  const dir = opts.values['cache-dir'];
  const limit = getSizeLimit(opts, 'file-cache-max-size-mb');
  if (!dir || limit.kind === 'off') return null;
  try {
    // Everything in DIR/gcsmount-cache (0700, ours); DIR itself may hold anything and is left as it is.
    const home = prepareCacheHome(dir, log);
    return DiskCache.open({ dir: home, limit, ...DEFAULT_DISK_CACHE, directIo: opts.values['file-cache-enable-o-direct'] }, log, metrics);
  } catch (err) {
    if (err instanceof PrivateDirError) throw new UserError(err.message, EXIT.cacheDir);
    if (err instanceof IndexLockedError) throw new UserError(`cache dir ${dir} is in use by another gcsmount; give each mount its own --cache-dir`, EXIT.cacheDir);
    const code = (err as NodeJS.ErrnoException).code;
    throw new UserError(`cache dir ${dir} cannot be used: ${code ?? (err as Error).message}`, EXIT.cacheDir);
  }
}

/**
 * The read path's block side from the flags: download limits, the memory budget and block buffers, the
 * block source over GCS and the disk cache, native reads. What must be closed if a later step fails
 * goes on `undo`.
 */
export function wireBlocks(opts: MountOptions, deps: BlockWiringDeps, undo: (() => unknown)[]): BlockStack {
  const v = opts.values;
  const { client, disk, fuse, log, metrics } = deps;
  const blockSize = v['block-size-mb'] * MIB;
  const unlimited = (n: number) => (n < 0 ? Number.POSITIVE_INFINITY : n);
  const scheduler = new DownloadScheduler({
    global: unlimited(v['file-cache-max-parallel-downloads']),
    perFile: v['file-cache-enable-parallel-downloads'] ? Math.max(1, v['file-cache-parallel-downloads-per-file']) : 1,
  });
  const budget = new ReadaheadBudget(unlimited(v['read-global-max-blocks']));
  const memory = mountMemoryBudget(opts, blockSize, disk ? NATIVE_MEMORY_BYTES : 0, log, metrics);
  const buffers = new BlockBuffers({
    blockSize,
    budget: memory,
    poison: process.env.GCSMOUNT_POISON_RELEASED_BLOCKS === '1',
    // Idle memory goes back to the system within seconds; a busy mount reuses its buffers long before.
    idleTrimMs: 2000,
    // Download workers receive bodies straight into block memory: it must be shared with them.
    shared: deps.downloadWorkers > 0,
    onIdle: releaseIdleMemory,
  });
  undo.push(() => buffers.close());
  // Without a disk cache, prefetched blocks wait in memory (within their own budget) for their open.
  const prefetchStore = new PrefetchStore(disk ? 0 : v['prefetch-max-size-mb'] * MIB, metrics, memory);
  // Patterns checked when the options were read (parseMountArgs): here they compile.
  const filter = disk ? cacheFilter(opts.bucket, v['file-cache-include-regex'], v['file-cache-exclude-regex']) : null;
  const blocks = new BlockSource({ client, disk, scheduler, buffers, wholeObjectThreshold: v['whole-object-threshold-mb'] * MIB, log, metrics, prefetched: prefetchStore, cacheFilter: filter });
  metrics.setGauge('readahead_blocks', () => budget.inUse);
  // Reads of blocks already on disk are answered by native workers, without JavaScript.
  const native = disk ? NativeReads.start({ fuse, blocks, disk, metrics, log, memory }) : null;
  return { blockSize, scheduler, budget, memory, buffers, prefetchStore, blocks, native };
}
