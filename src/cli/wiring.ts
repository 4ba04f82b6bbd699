import { BlockBuffers } from '../blocks/block-buffers.js';
import { BlockSource } from '../blocks/block-source.js';
import { DownloadScheduler } from '../blocks/download-scheduler.js';
import { ReadaheadBudget } from '../blocks/readahead-budget.js';
import { mountMemoryBudget } from './memory-limit.js';
import { releaseIdleMemory } from '../block-memory.js';
import { AdaptiveConcurrency } from '../gcs/adaptive-concurrency.js';
import { IndexLockedError } from '../blocks/block-index.js';
import { DEFAULT_DISK_CACHE, DiskCache } from '../blocks/disk-cache.js';
import { NATIVE_MEMORY_BYTES, NativeReads } from '../fs/native-reads.js';
import { createOperations } from '../fs/operations.js';
import { DEFAULT_REPORTED_SIZES } from '../fs/handles.js';
import { Prefetcher } from '../prefetch/prefetcher.js';
import { PrefetchStore } from '../prefetch/prefetch-store.js';
import { warm } from '../fs/warmer.js';
import { startControlServer, type MountInfo } from '../observe/control-server.js';
import { startPrometheus } from '../observe/prometheus.js';
import { controlSocketFor, ensureRuntimeDir } from '../observe/runtime-dir.js';
import { PrivateDirError } from '../private-dir.js';
import { prepareCacheHome } from '../blocks/cache-home.js';
import { FuseMount, MountPointError, prepareMountPoint, setReadAhead } from '../fs/mount.js';
import { FuseUnavailableError, loadFuse } from '../fs/kernel.js';
import { resolveAuth, type CredentialSource } from '../gcs/auth.js';
import { checkKeyFile } from '../gcs/key-file.js';
import { resolveEndpoint } from '../gcs/endpoint.js';
import { HttpObjectClient, type HttpClientConfig } from '../gcs/http-client.js';
import { requestRateForFlags } from '../gcs/request-rate.js';
import { DEFAULT_RETRY } from '../gcs/retry.js';
import { StallTimeout } from '../gcs/stall-timeout.js';
import { OnceLog, type Logger } from '../observe/logger.js';
import { trackMainThread } from '../observe/event-loop.js';
import { Metrics } from '../observe/metrics.js';
import { NameMapper } from '../namespace/names.js';
import { Namespace } from '../namespace/namespace.js';
import { getSizeLimit, getTtl, metadataCacheTtl, type MountOptions } from './options.js';
import { MetadataCache } from '../namespace/metadata-cache.js';
import type { Ttl } from './values.js';
import { EXIT, UserError } from './exit.js';
import { readOnly, wireWrites } from './write-wiring.js';

const MIB = 1024 * 1024;
/**
 * gcsfuse's --max-conns-per-host 0 means "no limit"; requests in flight still need a ceiling for the
 * adaptive limit to halve from on a 429. gcsfuse keeps up to 100 idle connections by default.
 */
const UNLIMITED_CONNECTIONS_CEILING = 100;
/** gcsfuse's -1 (unlimited) for --metadata-prefetch-max-workers: parts of one listing still need a bound. */
const UNLIMITED_LIST_WORKERS = 64;
/** The longest sleep between two tries of the start-up bucket check: a start should follow a recovery soon. */
const STARTUP_CHECK_MAX_SLEEP_MS = 5_000;
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

function credentialSource(opts: MountOptions, customEndpoint: boolean): CredentialSource {
  const v = opts.values;
  // Checked even where it goes unused (a custom endpoint, --anonymous-access): a corrupt key given on
  // purpose is a mistake to report, never a reason to carry on without credentials.
  if (v['key-file']) checkKeyFile(v['key-file']);
  if (customEndpoint || v['anonymous-access']) return { kind: 'none' };
  if (v['key-file']) return { kind: 'key-file', path: v['key-file'] };
  return { kind: 'default' };
}

export interface RunningDaemon {
  mount: FuseMount;
  metrics: Metrics;
  stop(): Promise<void>;
}

/**
 * Builds the whole stack from options, checks the bucket, and mounts. Components never see argv.
 * Whatever fails, before or after the kernel mount, everything opened so far is closed again in reverse
 * order (the mount unmounted, listeners closed, the index closed): a failed start never leaves a dead
 * mount ("Transport endpoint is not connected") for systemd's Restart= to trip over.
 */
export async function startDaemon(opts: MountOptions, log: Logger, lostLogLines: () => number = () => 0): Promise<RunningDaemon> {
  const undo: (() => unknown)[] = [];
  try {
    return await assembleDaemon(opts, log, lostLogLines, undo);
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

/** A --prometheus-port another process holds is the user's to fix: exit 2 with one line, like a bad flag. */
async function listenPrometheus(metrics: Metrics, port: number): Promise<Awaited<ReturnType<typeof startPrometheus>>> {
  try {
    return await startPrometheus(metrics, port);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EADDRINUSE') throw new UserError(`--prometheus-port ${port} is already in use by another process`, EXIT.usage);
    throw new UserError(`--prometheus-port ${port} cannot be used: ${code ?? (err as Error).message}`, EXIT.usage);
  }
}

/** startDaemon's body: each resource it opens goes on `undo`, for startDaemon to close if a later step fails. */
async function assembleDaemon(opts: MountOptions, log: Logger, lostLogLines: () => number, undo: (() => unknown)[]): Promise<RunningDaemon> {
  const v = opts.values;
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
  // Refused (exit 6) before anything is mounted, not after, when it belongs to someone else.
  await ensureRuntimeDir();
  let endpoint;
  try {
    endpoint = resolveEndpoint(v['custom-endpoint'] || undefined, process.env);
  } catch (err) {
    throw new UserError((err as Error).message, EXIT.usage);
  }
  const auth = await resolveAuth(credentialSource(opts, endpoint.custom));
  const metrics = new Metrics();
  metrics.addCounterSource('log_lines_lost', lostLogLines);
  undo.push(trackMainThread(metrics));
  // Listeners first: a port or socket that cannot be had fails the start before anything is mounted.
  const prometheus = v['prometheus-port'] > 0 ? await listenPrometheus(metrics, v['prometheus-port']) : null;
  if (prometheus) {
    undo.push(() => prometheus.close());
    log.info({ port: prometheus.port }, 'serving Prometheus metrics on /metrics');
  }
  const maxConnections = v['max-conns-per-host'] > 0 ? v['max-conns-per-host'] : 0;
  const concurrency = new AdaptiveConcurrency({ max: maxConnections || UNLIMITED_CONNECTIONS_CEILING, min: 1, cooldownMs: 1000 });
  metrics.setGauge('gcs_concurrency_limit', () => concurrency.current);
  const rate = requestRateForFlags(v['initial-ops-per-sec'], v['limit-ops-per-sec']);
  if (rate) {
    metrics.setGauge('gcs_rate_limit', () => Math.round(rate.rate * 10) / 10);
    metrics.setGauge('gcs_rate_ceiling', () => Math.round(rate.ceiling()));
    metrics.setGauge('gcs_rate_queued', () => rate.queued);
  }
  const stall = v['enable-read-stall-retry']
    ? new StallTimeout({
        initialMs: v['read-stall-initial-req-timeout'],
        minMs: v['read-stall-min-req-timeout'],
        maxMs: Math.max(v['read-stall-min-req-timeout'], v['read-stall-max-req-timeout']),
        percentile: v['read-stall-req-target-percentile'],
      })
    : null;
  if (stall) metrics.setGauge('gcs_stall_timeout_ms', () => Math.round(stall.currentMs));
  const clientConfig: HttpClientConfig = {
    endpoint,
    bucket: opts.bucket,
    auth,
    maxConnections,
    timeoutMs: v['http-client-timeout'],
    retry: {
      ...DEFAULT_RETRY,
      maxAttempts: v['max-retry-attempts'] > 0 ? v['max-retry-attempts'] : Number.POSITIVE_INFINITY,
      multiplier: v['retry-multiplier'],
      maxDelayMs: v['max-retry-sleep'],
    },
    concurrency,
    // Lookups and listings never wait for sockets or slots that downloads hold: their own pool, as large.
    metadata: { connections: maxConnections, concurrency: new AdaptiveConcurrency({ max: maxConnections || UNLIMITED_CONNECTIONS_CEILING, min: 1, cooldownMs: 1000 }) },
    rate,
    stall,
    maxRetryDurationMs: v['max-retry-duration'],
    log,
    metrics,
  };
  const downloadWorkers = v['download-workers'];

  // A missing bucket or refused credentials fail the mount at once (not retryable); a throttled or
  // briefly failing bucket is retried until --startup-check-timeout, so it slows a start but does not
  // fail it (under systemd, a failed start is a restart loop that adds to the load).
  const checkMs = v['startup-check-timeout'];
  const probe = new HttpObjectClient({
    ...clientConfig,
    retry: { ...clientConfig.retry, maxAttempts: checkMs > 0 ? Number.POSITIVE_INFINITY : 1, maxDelayMs: Math.min(clientConfig.retry.maxDelayMs, STARTUP_CHECK_MAX_SLEEP_MS) },
    maxRetryDurationMs: checkMs,
    retryBoundFlag: '--startup-check-timeout',
    concurrency: new AdaptiveConcurrency({ max: 1, min: 1, cooldownMs: 0 }),
    metadata: null,
    rate: null,
  });
  try {
    // objects.list, not a bucket GET: a read-only key (objectViewer) lacks storage.buckets.get (gcsfuse #982).
    await probe.probeBucket();
  } finally {
    await probe.close();
  }

  const disk = openDiskCache(opts, log, metrics);
  if (disk) undo.push(() => disk.close());
  const client = new HttpObjectClient({ ...clientConfig, downloadWorkers });
  undo.push(() => client.close());
  const workers = client.workers;
  if (workers) {
    metrics.setGauge('download_workers', () => workers.count);
    metrics.setGauge('download_workers_in_flight', () => workers.inFlight);
    metrics.setGauge('download_workers_utilization', () => Math.max(0, ...workers.loads().map((l) => l.utilization)));
  }
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
    shared: downloadWorkers > 0,
    onIdle: releaseIdleMemory,
  });
  undo.push(() => buffers.close());
  // Without a disk cache, prefetched blocks wait in memory (within their own budget) for their open.
  const prefetchStore = new PrefetchStore(disk ? 0 : v['prefetch-max-size-mb'] * MIB, metrics, memory);
  const blocks = new BlockSource({ client, disk, scheduler, buffers, wholeObjectThreshold: v['whole-object-threshold-mb'] * MIB, log, metrics, prefetched: prefetchStore });
  metrics.setGauge('readahead_blocks', () => budget.inUse);
  // Reads of blocks already on disk are answered by native workers, without JavaScript.
  const native = disk ? NativeReads.start({ fuse, blocks, disk, metrics, log }) : null;
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
  const prefetchOn = (v['prefetch-zarr'] || v['prefetch-siblings']) && v['prefetch-max-files-ahead'] > 0;
  const prefetcher = prefetchOn
    ? new Prefetcher({
        namespace,
        blocks,
        disk,
        store: prefetchStore,
        config: {
          zarr: v['prefetch-zarr'],
          siblings: v['prefetch-siblings'],
          maxFilesAhead: v['prefetch-max-files-ahead'],
          maxParallel: v['prefetch-max-parallel-downloads'],
          maxBlocksPerFile: v['prefetch-max-blocks-per-file'],
        },
        log,
        metrics,
      })
    : null;
  const listTtl = getTtl(opts, 'kernel-list-cache-ttl-secs');
  const cacheHome = disk ? disk.info().dir : null;
  const writeSide = readOnly(opts) ? null : wireWrites(opts, { client, namespace, names, blocks, memory, sharedMemory: downloadWorkers > 0, cacheHome, ttls: [ttl, negativeTtl], log, metrics });
  if (writeSide) undo.push(() => writeSide.close());
  const { onRequest, kernelCache } = createOperations({
    writes: writeSide?.writes ?? null,
    fuse,
    native,
    prefetcher,
    namespace,
    blocks,
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
    log,
    metrics,
  });

  let allowOther = false;
  const extra: string[] = [];
  for (const o of v.o) {
    if (o === 'allow_other') allowOther = true;
    else if (PASSED_MOUNT_OPTIONS.has(o)) extra.push(o);
    // rw has its own notice (options.ts), logged with the others at start.
    else if (o !== 'ro' && o !== 'rw') log.warn({ option: o }, `mount option -o ${o} is ignored: gcsmount mounts with its own kernel options`);
  }
  const info: MountInfo = { mountPoint, bucket: opts.bucket, pid: process.pid, cacheDir: disk ? disk.info().dir : null };
  const control = await startControlServer(
    await controlSocketFor(mountPoint),
    {
      info: () => info,
      stats: () => statsReport(info, metrics, workers?.loads() ?? []),
      warm: (path, progress, signal) => {
        if (!disk) throw new Error('this mount has no --cache-dir: there is nothing to warm into');
        return warm({ client, names, blocks, disk, parallel: Math.min(64, Math.max(4, scheduler.limit)) }, path, progress, signal);
      },
    },
    log,
  );
  undo.push(() => control.close());

  const mount = FuseMount.mount(mountPoint, fuse, onRequest, {
    readOnly: readOnly(opts),
    fsName: opts.bucket,
    allowOther,
    extra,
    // Enough for the kernel to keep every download slot busy with readahead and parallel readers.
    maxBackground: Math.min(1024, Math.max(64, 2 * (Number.isFinite(scheduler.limit) ? scheduler.limit : 512))),
  });
  undo.push(() => mount.unmount());
  kernelCache.attach(mount.session);
  await setReadAhead(mountPoint, v['max-read-ahead-kb'], log);
  // Only now does `gcsmount wait` get its answer.
  control.open();

  return {
    mount,
    metrics,
    async stop() {
      // Node ends a process whose event loop is empty even while it awaits: a stop waiting on a block
      // index batch (an unref'd timer) or a worker's end would exit silently half-way, its block cache
      // and final counters never closed or written (seen when stopped during downloads under faults).
      const alive = setInterval(() => undefined, 1000);
      try {
        await stopInOrder();
      } finally {
        clearInterval(alive);
      }
    },
  };

  async function stopInOrder(): Promise<void> {
    prefetcher?.close();
    // Caches close only once the kernel has ended the session: a busy mount is detached and its open
    // files served until they close (or the grace period runs out, after which requests answer EIO).
    const graceMs = v['unmount-grace-period'];
    const outcome = await mount.unmount(graceMs, () =>
      log.info({ graceMs }, 'mount busy or detached: serving the files still open until they close, for the grace period at most'),
    );
    if (outcome === 'detached-timed-out') log.warn({ graceMs }, 'files still open after --unmount-grace-period: stopping anyway; their further reads fail');
    log.debug({ outcome }, 'stopping: unmounted');
    await control.close();
    await prometheus?.close();
    // Files closed last are still uploading (and their blocks going into the cache).
    await writeSide?.writes.drain();
    writeSide?.close();
    log.debug('stopping: writes drained');
    await disk?.drain();
    disk?.close();
    log.debug('stopping: block cache closed');
    prefetchStore.close();
    blocks.close();
    buffers.close();
    memory.close();
    log.debug('stopping: memory released');
    await client.close();
    log.debug('stopping: GCS client closed');
    rate?.close();
    log.info({ metrics: metrics.snapshot() }, 'final counters');
  }
}

/** What `gcsmount stats` shows: the mount, the raw metrics, and the ratios a person asks about first. */
/** `downloadWorkers`: each download worker's load (none with --download-workers 0). */
function statsReport(info: MountInfo, metrics: Metrics, downloadWorkers: { utilization: number; inFlight: number }[]) {
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

/**
 * The block cache on disk, when --cache-dir is given and --file-cache-max-size-mb is not 0. Problems a
 * user can fix (a directory that cannot be made or written, one another daemon holds) stop the mount
 * with one line; later trouble (a full disk) only turns the cache off for a while.
 */
function openDiskCache(opts: MountOptions, log: Logger, metrics: Metrics): DiskCache | null {
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
