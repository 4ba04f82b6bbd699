import type { DiskCache } from '../blocks/disk-cache.js';
import { createOperations } from '../fs/operations.js';
import { DEFAULT_REPORTED_SIZES } from '../fs/handles.js';
import { WRITE_FH_BASE } from '../fs/ops-writes.js';
import { Prefetcher } from '../prefetch/prefetcher.js';
import type { ControlServer, MountInfo } from '../observe/control-server.js';
import { ensureRuntimeDir } from '../observe/runtime-dir.js';
import { FuseMount, holdStartLock, MountPointError, prepareMountPoint, setReadAhead } from '../fs/mount.js';
import type { FileLock } from '../file-lock.js';
import { FuseUnavailableError, loadFuse, type FuseAddon } from '../fs/kernel.js';
import type { ObjectClient } from '../gcs/object-client.js';
import type { HttpObjectClient } from '../gcs/http-client.js';
import type { RequestRate } from '../gcs/request-rate.js';
import type { MemoryBudget } from '../memory/memory-budget.js';
import { OnceLog, type Logger } from '../observe/logger.js';
import { trackMainThread } from '../observe/event-loop.js';
import { Metrics } from '../observe/metrics.js';
import { NameMapper } from '../namespace/names.js';
import { Namespace } from '../namespace/namespace.js';
import { getSizeLimit, getTtl, metadataCacheTtl, type MountOptions } from './options.js';
import { MetadataCache } from '../namespace/metadata-cache.js';
import type { Ttl } from './values.js';
import { readOnly, wireWrites } from './write-wiring.js';
import { checkBucket, gcsAccess, gcsClientConfig, openGcsClient } from './gcs-wiring.js';
import { openDiskCache, wireBlocks, type BlockStack } from './block-wiring.js';
import { listenPrometheus, startControl } from './control-wiring.js';

const MIB = 1024 * 1024;
/** gcsfuse's -1 (unlimited) for --metadata-prefetch-max-workers: parts of one listing still need a bound. */
const UNLIMITED_LIST_WORKERS = 64;
/** What the kernel is told for "never expires": a year is forever for a mount. */
const KERNEL_FOREVER_SECS = 365 * 24 * 3600;

/**
 * -o options we pass to libfuse besides ro/rw (which choose whether the write side exists); the rest are
 * logged as ignored. The restricting
 * kernel flags an fstab line may carry (noexec, nosuid, nodev, noatime) are honoured; the loosening
 * ones (suid, dev) are not.
 */
const PASSED_MOUNT_OPTIONS = new Set(['allow_root', 'default_permissions', 'noexec', 'nosuid', 'nodev', 'noatime']);

/** Kernel attribute and entry timeouts, in seconds, following a metadata TTL. */
function kernelSecs(ttl: Ttl): number {
  if (ttl.kind === 'forever') return KERNEL_FOREVER_SECS;
  return ttl.kind === 'off' ? 0 : ttl.ms / 1000;
}

export interface RunningDaemon {
  mount: FuseMount;
  metrics: Metrics;
  stop(): Promise<void>;
}

/** Everything a running daemon closes when it stops, in the order stopInOrder() closes it. */
interface Stack {
  prefetcher: Prefetcher | null;
  mount: FuseMount;
  control: ControlServer;
  prometheus: { close(): Promise<void> } | null;
  writeSide: ReturnType<typeof wireWrites> | null;
  disk: DiskCache | null;
  blockStack: BlockStack;
  client: HttpObjectClient;
  rate: RequestRate | null | undefined;
  metrics: Metrics;
}

/**
 * Builds the whole stack from options, checks the bucket, and mounts. Components never see argv.
 * Whatever fails, before or after the kernel mount, everything opened so far is closed again in reverse
 * order (the mount unmounted, listeners closed, the index closed): a failed start never leaves a dead
 * mount ("Transport endpoint is not connected") for systemd's Restart= to trip over.
 */
export async function startDaemon(opts: MountOptions, log: Logger, lostLogLines: () => number = () => 0, abort?: AbortSignal): Promise<RunningDaemon> {
  const undo: (() => unknown)[] = [];
  try {
    return await assembleDaemon(opts, log, lostLogLines, undo, abort);
  } catch (err) {
    for (const close of undo.reverse()) {
      try {
        await close();
      } catch (e) {
        log.warn({ err: (e as Error).message }, 'clean-up after a failed start-up failed');
      }
    }
    throw err;
  }
}

/** The mount point made ready and the FUSE addon loaded, before anything is started. */
async function prepareKernelSide(opts: MountOptions, log: Logger, undo: (() => unknown)[]): Promise<{ mountPoint: string; fuse: FuseAddon; starting: FileLock }> {
  // Refused (exit 6) before anything is mounted, not after, when it belongs to someone else.
  await ensureRuntimeDir();
  // Held until mounted: checked and mounted by one daemon at a time.
  const starting = await holdStartLock(opts.mountPoint);
  undo.push(() => starting.release());
  const mountPoint = await prepareMountPoint(opts.mountPoint);
  // Checked before anything is started: a machine without FUSE gets one line naming what to install.
  let fuse;
  try {
    fuse = loadFuse();
  } catch (err) {
    if (err instanceof FuseUnavailableError) throw new MountPointError(`cannot mount ${opts.mountPoint}: ${err.message}`);
    throw err;
  }
  // Block files, sockets and native reads each hold a descriptor: take all the system allows.
  const [softFiles, hardFiles] = fuse.raiseFileLimit();
  log.info({ soft: softFiles, hard: hardFiles }, `open file limit (RLIMIT_NOFILE): ${softFiles < 0 ? 'unlimited' : softFiles}`);
  return { mountPoint, fuse, starting };
}

/** startDaemon's body: each resource it opens goes on `undo`, for startDaemon to close if a later step fails. */
async function assembleDaemon(opts: MountOptions, log: Logger, lostLogLines: () => number, undo: (() => unknown)[], abort?: AbortSignal): Promise<RunningDaemon> {
  const v = opts.values;
  const { mountPoint, fuse, starting } = await prepareKernelSide(opts, log, undo);
  const access = await gcsAccess(opts, abort);
  const metrics = new Metrics();
  metrics.addCounterSource('log_lines_lost', lostLogLines);
  undo.push(trackMainThread(metrics));
  // Listeners first: a port or socket that cannot be had fails the start before anything is mounted.
  const prometheus = v['prometheus-port'] > 0 ? await listenPrometheus(metrics, v['prometheus-port']) : null;
  if (prometheus) {
    undo.push(() => prometheus.close());
    log.info({ port: prometheus.port }, 'serving Prometheus metrics on /metrics');
  }
  const clientConfig = gcsClientConfig(opts, access, log, metrics);
  await checkBucket(clientConfig, v['startup-check-timeout'], abort);

  const disk = openDiskCache(opts, log, metrics);
  if (disk) undo.push(() => disk.close());
  const downloadWorkers = v['download-workers'];
  const client = openGcsClient(clientConfig, downloadWorkers, metrics);
  undo.push(() => client.close());
  const rangeWorkers = client.workers;
  if (disk && rangeWorkers) disk.writeBlockFilesWith((...args) => rangeWorkers.writeBlockFile(...args));
  const blockStack = wireBlocks(opts, { client, disk, fuse, downloadWorkers, log, metrics }, undo);
  const { scheduler, memory, blocks } = blockStack;
  const { names, namespace, ttl, negativeTtl } = wireNamespace(opts, client, memory, log, metrics);
  const prefetcher = wirePrefetcher(opts, namespace, blockStack, disk, log, metrics);
  const cacheHome = disk ? disk.info().dir : null;
  const writeSide = readOnly(opts) ? null : wireWrites(opts, { client, namespace, names, blocks, memory, sharedMemory: downloadWorkers > 0, cacheHome, ttls: [ttl, negativeTtl], log, metrics });
  if (writeSide) undo.push(() => writeSide.close());
  const { onRequest, kernelCache } = wireOperations(opts, { fuse, writeSide, blockStack, prefetcher, namespace, ttl, negativeTtl, log, metrics });

  const { allowOther, extra } = kernelMountOptions(v.o, log);
  const info: MountInfo = { mountPoint, bucket: opts.bucket, pid: process.pid, cacheDir: disk ? disk.info().dir : null };
  const workers = client.workers;
  const control = await startControl(info, { metrics, downloadWorkerLoads: () => workers?.loads() ?? [], client, names, blocks, disk, scheduler, log });
  undo.push(() => control.close());

  const mount = FuseMount.mount(mountPoint, fuse, onRequest, {
    readOnly: readOnly(opts),
    fsName: opts.bucket,
    allowOther,
    extra,
    // Enough for the kernel to keep every download slot busy with readahead and parallel readers.
    maxBackground: v['max-background'] > 0 ? v['max-background'] : Math.min(1024, Math.max(64, 2 * (Number.isFinite(scheduler.limit) ? scheduler.limit : 512))),
    congestionThreshold: v['congestion-threshold'],
    parallelDirops: !v['disable-parallel-dirops'],
    // Read handles are numbered below the write side's: their releases are answered by the addon.
    readHandlesBelow: WRITE_FH_BASE,
  });
  undo.push(() => mount.unmount());
  starting.release();
  kernelCache.attach(mount.session);
  await setReadAhead(mountPoint, v['max-read-ahead-kb'], log);
  // Only now does `gcsmount wait` get its answer.
  control.open();

  const stack: Stack = { prefetcher, mount, control, prometheus, writeSide, disk, blockStack, client, rate: clientConfig.rate, metrics };
  return {
    mount,
    metrics,
    async stop() {
      // Node ends a process whose event loop is empty even while it awaits: a stop waiting on a block
      // index batch (an unref'd timer) or a worker's end would exit silently half-way, its block cache
      // and final counters never closed or written (seen when stopped during downloads under faults).
      const alive = setInterval(() => undefined, 1000);
      try {
        await stopInOrder(stack, v['unmount-grace-period'], log);
      } finally {
        clearInterval(alive);
      }
    },
  };
}

/** The metadata side: the caches of stats, types and listings, path <-> name mapping, the namespace over them. */
function wireNamespace(opts: MountOptions, client: ObjectClient, memory: MemoryBudget, log: Logger, metrics: Metrics) {
  const v = opts.values;
  const once = new OnceLog(log);
  const ttl = metadataCacheTtl(opts);
  const negativeTtl = getTtl(opts, 'metadata-cache-negative-ttl-secs');
  const cache = new MetadataCache(
    { ttl, negativeTtl, statBudget: getSizeLimit(opts, 'stat-cache-max-size-mb'), typeBudget: getSizeLimit(opts, 'type-cache-max-size-mb') },
    metrics,
  );
  // Accounted, not limited: the stat budget bounds listings; they are shown beside the memory budget.
  memory.account('listings', () => cache.usage().listingBytes);
  const listTtlMs = ttl.kind === 'ms' ? ttl.ms : ttl.kind === 'forever' ? 0 : 1;
  const names = new NameMapper(v['only-dir'] || null);
  const namespace = new Namespace({
    client,
    names,
    cache,
    listTtlMs,
    prefetch: {
      enabled: v['enable-metadata-prefetch'],
      entriesLimit: v['metadata-prefetch-entries-limit'] < 0 ? Number.POSITIVE_INFINITY : v['metadata-prefetch-entries-limit'],
      maxWorkers: v['metadata-prefetch-max-workers'] < 0 ? UNLIMITED_LIST_WORKERS : Math.max(1, v['metadata-prefetch-max-workers']),
    },
    once,
    metrics,
  });
  return { names, namespace, ttl, negativeTtl };
}

/** The prefetcher of files not yet opened (Zarr chunks, siblings), or null when the flags turn it off. */
function wirePrefetcher(opts: MountOptions, namespace: Namespace, blockStack: BlockStack, disk: DiskCache | null, log: Logger, metrics: Metrics): Prefetcher | null {
  const v = opts.values;
  const prefetchOn = (v['prefetch-zarr'] || v['prefetch-siblings']) && v['prefetch-max-files-ahead'] > 0;
  if (!prefetchOn) return null;
  return new Prefetcher({
    namespace,
    blocks: blockStack.blocks,
    disk,
    store: blockStack.prefetchStore,
    config: {
      zarr: v['prefetch-zarr'],
      siblings: v['prefetch-siblings'],
      maxFilesAhead: v['prefetch-max-files-ahead'],
      maxParallel: v['prefetch-max-parallel-downloads'],
      maxBlocksPerFile: v['prefetch-max-blocks-per-file'],
    },
    log,
    metrics,
  });
}

/** What the FUSE operations are built over. */
interface OperationParts {
  fuse: FuseAddon;
  writeSide: ReturnType<typeof wireWrites> | null;
  blockStack: BlockStack;
  prefetcher: Prefetcher | null;
  namespace: Namespace;
  /** The metadata TTLs, which the kernel's timeouts follow. */
  ttl: Ttl;
  negativeTtl: Ttl;
  log: Logger;
  metrics: Metrics;
}

/** The FUSE operations over the stack: file attributes, the reader's window, the kernel's timeouts. */
function wireOperations(opts: MountOptions, p: OperationParts): ReturnType<typeof createOperations> {
  const v = opts.values;
  const { ttl, negativeTtl } = p;
  const { blockSize, budget, memory } = p.blockStack;
  const listTtl = getTtl(opts, 'kernel-list-cache-ttl-secs');
  return createOperations({
    writes: p.writeSide?.writes ?? null,
    fuse: p.fuse,
    native: p.blockStack.native,
    prefetcher: p.prefetcher,
    namespace: p.namespace,
    blocks: p.blockStack.blocks,
    attributes: {
      uid: v.uid >= 0 ? v.uid : process.getuid!(),
      gid: v.gid >= 0 ? v.gid : process.getgid!(),
      fileMode: v['file-mode'],
      dirMode: v['dir-mode'],
      mountTimeMs: Date.now(),
    },
    reader: { maxWindowBlocks: Math.max(1, Math.floor((v['sequential-read-size-mb'] * MIB) / blockSize)), budget, memory },
    // As long as the kernel may hold a size: its attribute timeout.
    reportedSizes: { ...DEFAULT_REPORTED_SIZES, ttlMs: kernelSecs(ttl) * 1000 },
    timeouts: {
      entrySec: kernelSecs(ttl),
      attrSec: kernelSecs(ttl),
      negativeSec: kernelSecs(negativeTtl),
      listCacheMs: listTtl.kind === 'forever' ? Number.POSITIVE_INFINITY : listTtl.kind === 'ms' ? listTtl.ms : 0,
    },
    log: p.log,
    metrics: p.metrics,
  });
}

/** -o options: allow_other, the ones passed to libfuse (PASSED_MOUNT_OPTIONS), the rest logged as ignored. */
function kernelMountOptions(o: readonly string[], log: Logger): { allowOther: boolean; extra: string[] } {
  let allowOther = false;
  const extra: string[] = [];
  for (const opt of o) {
    if (opt === 'allow_other') allowOther = true;
    else if (PASSED_MOUNT_OPTIONS.has(opt)) extra.push(opt);
    // rw has its own notice (options.ts), logged with the others at start.
    else if (opt !== 'ro' && opt !== 'rw') log.warn({ option: opt }, `mount option -o ${opt} is ignored: gcsmount mounts with its own kernel options`);
  }
  return { allowOther, extra };
}

/** The daemon's stop: the mount first, then each part once nothing still running uses it. */
async function stopInOrder(s: Stack, graceMs: number, log: Logger): Promise<void> {
  s.prefetcher?.close();
  // Caches close only once the kernel has ended the session: a busy mount is detached and its open
  // files served until they close (or the grace period runs out, after which requests answer EIO).
  const outcome = await s.mount.unmount(graceMs, () =>
    log.info({ graceMs }, 'mount busy or detached: serving the files still open until they close, for the grace period at most'),
  );
  if (outcome === 'detached-timed-out') log.warn({ graceMs }, 'files still open after --unmount-grace-period: stopping anyway; their further reads fail');
  log.debug({ outcome }, 'stopping: unmounted');
  await s.control.close();
  await s.prometheus?.close();
  // Files closed last are still uploading (and their blocks going into the cache).
  await s.writeSide?.writes.drain();
  s.writeSide?.close();
  log.debug('stopping: writes drained');
  await s.disk?.drain();
  s.disk?.close();
  log.debug('stopping: block cache closed');
  s.blockStack.prefetchStore.close();
  s.blockStack.blocks.close();
  s.blockStack.buffers.close();
  s.blockStack.memory.close();
  log.debug('stopping: memory released');
  await s.client.close();
  log.debug('stopping: GCS client closed');
  s.rate?.close();
  log.info({ metrics: s.metrics.snapshot() }, 'final counters');
}
