import type { BlockSource } from '../blocks/block-source.js';
import type { DiskCache } from '../blocks/disk-cache.js';
import type { DownloadScheduler } from '../blocks/download-scheduler.js';
import { warm } from '../fs/warmer.js';
import type { ObjectClient } from '../gcs/object-client.js';
import type { WorkerLoad } from '../gcs/range-workers.js';
import type { NameMapper } from '../namespace/names.js';
import { startControlServer, type ControlServer, type MountInfo } from '../observe/control-server.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { startPrometheus } from '../observe/prometheus.js';
import { controlSocketFor } from '../observe/runtime-dir.js';
import { EXIT, UserError } from './exit.js';

/** What the control socket's answers draw on. */
export interface ControlWiringDeps {
  metrics: Metrics;
  /** Each download worker's load (none with --download-workers 0). */
  downloadWorkerLoads: () => WorkerLoad[];
  client: ObjectClient;
  names: NameMapper;
  blocks: BlockSource;
  disk: DiskCache | null;
  /** A warm-up's parallelism follows the downloads it allows at once. */
  scheduler: DownloadScheduler;
  log: Logger;
}

/** A --prometheus-port another process holds is the user's to fix: exit 2 with one line, like a bad flag. */
export async function listenPrometheus(metrics: Metrics, port: number): Promise<Awaited<ReturnType<typeof startPrometheus>>> {
  try {
    // prom-client loads only for a mount that serves it.
    return await (await import('../observe/prometheus.js')).startPrometheus(metrics, port);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EADDRINUSE') throw new UserError(`--prometheus-port ${port} is already in use by another process`, EXIT.usage);
    throw new UserError(`--prometheus-port ${port} cannot be used: ${code ?? (err as Error).message}`, EXIT.usage);
  }
}

/** The mount's control socket (`gcsmount stats`, `warm`, `wait`), listening but not answering until open(). */
export async function startControl(info: MountInfo, deps: ControlWiringDeps): Promise<ControlServer> {
  const { metrics, client, names, blocks, disk } = deps;
  return startControlServer(
    await controlSocketFor(info.mountPoint),
    {
      info: () => info,
      stats: () => statsReport(info, metrics, deps.downloadWorkerLoads()),
      warm: (path, progress, signal) => {
        if (!disk) throw new Error('this mount has no --cache-dir: there is nothing to warm into');
        return warm({ client, names, blocks, disk, parallel: Math.min(64, Math.max(4, deps.scheduler.limit)) }, path, progress, signal);
      },
    },
    deps.log,
  );
}

/**
 * What `gcsmount stats` shows: the mount, the raw metrics, and the ratios a person asks about first.
 * `downloadWorkers`: each download worker's load (none with --download-workers 0).
 */
function statsReport(info: MountInfo, metrics: Metrics, downloadWorkers: WorkerLoad[]) {
  const snap = metrics.snapshot();
  const c = snap.counters;
  const blocksRead = c.block_cache_hits + c.block_cache_misses;
  return {
    ...info,
    uptimeSeconds: snap.uptimeSeconds,
    summary: {
      blockCacheHitRatio: blocksRead ? c.block_cache_hits / blocksRead : null,
      bytesFromCache: c.block_cache_hit_bytes,
      bytesFetched: c.block_fetch_bytes,
      gcsRequests: c.gcs_requests_bucket + c.gcs_requests_list + c.gcs_requests_metadata + c.gcs_requests_media,
      prefetchedFiles: c.prefetch_files,
      prefetchedBytes: c.prefetch_bytes,
      prefetchUsedFiles: c.prefetch_used_files,
      prefetchHitRatio: c.prefetch_files ? c.prefetch_used_files / c.prefetch_files : null,
      prefetchWastedBytes: c.prefetch_wasted_bytes,
    },
    counters: c,
    gauges: snap.gauges,
    fuseOps: snap.ops,
    // Which thread limits the mount: the main thread near 1 (what only it does: scheduling, metadata,
    // FUSE requests), or the download workers (HTTP bodies, their copies and checks).
    threads: { mainUtilization: snap.gauges.main_thread_utilization ?? null, downloadWorkers },
  };
}
