import { MemoryBudget } from '../memory/memory-budget.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { MountOptions } from './options.js';

const MIB = 1024 * 1024;

/**
 * What the daemon holds beyond its block memory while reads run: the JavaScript heap's young objects,
 * HTTP bodies on their way into blocks, FUSE request buffers. Measured with 96 readers through a 512 MiB
 * budget: 70-110 MiB above idle + blocks (npm run bench -- memory); the limit keeps this much aside.
 */
const TRANSIENT_RESERVE = 64 * MIB;

/**
 * The mount's one memory budget. --memory-limit-mb is the whole daemon's: its block memory gets what
 * remains after the daemon's own memory when it starts (Node, the addon, SQLite: about 100 MiB) and a
 * reserve for what reads hold on the way (TRANSIENT_RESERVE), and with a disk cache the native read
 * path's own block memory (`nativeBytes`), so the daemon's resident size stays near
 * the flag however many readers come. Block memory must hold the largest single request (a whole object
 * up to the threshold, or a block) with a block to spare, or a read could never be served; when the flag
 * leaves less, that much is used and the log says so. Readahead and prefetch leave demand an eighth of it.
 */
export function mountMemoryBudget(opts: MountOptions, blockSize: number, nativeBytes: number, log: Logger, metrics: Metrics): MemoryBudget {
  const v = opts.values;
  const asked = v['memory-limit-mb'] * MIB;
  const runtime = process.memoryUsage().rss;
  const least = Math.max(blockSize, v['whole-object-threshold-mb'] * MIB) + blockSize;
  // The native read path's blocks (with a cache dir) are memory of the daemon's too.
  const forBlocks = asked - runtime - TRANSIENT_RESERVE - nativeBytes;
  if (forBlocks < least) {
    log.warn(
      { asked, runtime, least },
      `--memory-limit-mb ${v['memory-limit-mb']} leaves reads no room beside the daemon itself (${Math.round(runtime / MIB)} MiB at start, ${TRANSIENT_RESERVE / MIB} MiB kept aside): block memory is ${Math.ceil(least / MIB)} MiB, and the daemon will use more than the limit`,
    );
  }
  const limitBytes = Math.max(forBlocks, least);
  const memory = new MemoryBudget({ limitBytes, demandHeadroomBytes: Math.max(blockSize, Math.floor(limitBytes / 8)), idleReclaimAfterMs: 250 });
  metrics.setGauge('memory_limit_bytes', () => asked);
  metrics.setGauge('memory_blocks_limit_bytes', () => memory.limit);
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

