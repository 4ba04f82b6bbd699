import { MemoryBudget } from '../memory/memory-budget.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { MountOptions } from './options.js';

const MIB = 1024 * 1024;

/**
 * The mount's one memory budget (--memory-limit-mb). It must hold the largest single request (a whole
 * object up to the threshold, or a block) with a block to spare, or a read could never be served; a
 * smaller flag is raised to that, and the log says so. Readahead and prefetch leave demand an eighth of it.
 */
export function mountMemoryBudget(opts: MountOptions, blockSize: number, log: Logger, metrics: Metrics): MemoryBudget {
  const v = opts.values;
  const asked = v['memory-limit-mb'] * MIB;
  const least = Math.max(blockSize, v['whole-object-threshold-mb'] * MIB) + blockSize;
  if (asked < least) log.warn({ asked, least }, `--memory-limit-mb ${v['memory-limit-mb']} cannot hold a read's blocks: using ${Math.ceil(least / MIB)}`);
  const limitBytes = Math.max(asked, least);
  const memory = new MemoryBudget({ limitBytes, demandHeadroomBytes: Math.max(blockSize, Math.floor(limitBytes / 8)), idleReclaimAfterMs: 250 });
  metrics.setGauge('memory_limit_bytes', () => memory.limit);
  metrics.setGauge('memory_in_use_bytes', () => memory.inUse);
  metrics.setGauge('memory_peak_bytes', () => memory.peakInUse);
  metrics.setGauge('memory_waiting', () => memory.waiting);
  metrics.setGauge('memory_waiting_bytes', () => memory.waitingBytes);
  metrics.setGauge('memory_listing_bytes', () => memory.accountedBytes().listings ?? 0);
  metrics.addCounterSource('memory_waits', () => memory.counts.waits);
  metrics.addCounterSource('memory_wait_ms', () => memory.counts.waitMs);
  metrics.addCounterSource('memory_reclaims', () => memory.counts.reclaims);
  metrics.addCounterSource('memory_readahead_skipped', () => memory.counts.readaheadRefused);
  metrics.addCounterSource('memory_prefetch_skipped', () => memory.counts.prefetchRefused);
  return memory;
}

