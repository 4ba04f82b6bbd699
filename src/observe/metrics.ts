/**
 * The catalogue of metrics, in one place. Every layer counts through this; `gcsmount stats` and
 * Prometheus read snapshots of it. Counting is an object-property increment: cheap when nobody looks.
 */
export const COUNTERS = {
  gcs_requests_bucket: 'GCS bucket checks at start-up (objects.list of one item)',
  gcs_requests_list: 'GCS objects.list requests',
  gcs_requests_metadata: 'GCS object metadata requests',
  gcs_requests_media: 'GCS media (data) requests',
  gcs_media_bytes: 'bytes received in media responses',
  gcs_retries: 'GCS requests retried',
  gcs_throttled: 'GCS responses with status 429',
  gcs_errors: 'GCS requests that failed for good',
  gcs_rate_waits: 'GCS requests that waited for a token of the request-rate limit',
  gcs_rate_wait_ms: 'milliseconds GCS requests spent waiting for request-rate tokens, in all',
  gcs_bandwidth_waits: 'GCS range reads that waited for --limit-bytes-per-sec',
  gcs_bandwidth_wait_ms: 'milliseconds GCS range reads spent waiting for --limit-bytes-per-sec, in all',
  gcs_rate_cuts: 'cuts of the request rate on a 429 (one per overload)',
  gcs_stalls: 'GCS responses cut for staying silent longer than the stall timeout',
  gcs_raw_fallbacks: 'range responses a download worker could not read into block memory itself (a body not framed by Content-Length), read through undici instead',
  gcs_resumed_reads: 'range GETs resumed by Range from the last byte received after a cut',
  gcs_retry_deadline_exceeded: 'reads and lookups that failed on reaching --max-retry-duration',
  gcs_requests_upload: 'GCS upload requests (session starts, chunk PUTs, status queries, one-shot uploads)',
  gcs_requests_write: 'GCS object writes other than uploads (delete, copy/rewrite, compose, move, patch)',
  gcs_uploads_started: 'resumable upload sessions started',
  gcs_upload_chunks: 'chunks (or chunk tails) sent to resumable sessions',
  gcs_upload_requests_on_workers: 'upload requests sent by a download worker from shared chunk memory (not on the main thread)',
  block_files_written_on_workers: 'block files written by a download worker from shared block memory (their completion not waking the main thread)',
  gcs_download_workers_started: 'download worker threads started (the first, more as they are put to use, and replacements of workers that died)',
  gcs_upload_bytes: 'bytes sent in upload bodies (chunk PUTs and one-shot uploads)',
  gcs_uploads_finalized: 'objects created by uploads (resumable finalized, or one-shot)',
  gcs_upload_resumes: 'chunk PUTs resumed from the committed offset after a cut, 429 or 5xx (a status query each)',
  gcs_upload_sessions_expired: 'resumable sessions GCS no longer knew (404/410): the upload restarts',
  fuse_write_bytes: 'bytes written through the mount (FUSE writes)',
  write_uploads: 'files uploaded at close or fsync (streamed, staged or one-shot)',
  write_compose_appends: 'of them, appends to an object of 2 MiB or more sent as a tail composed onto it (gcsfuse\'s append optimization)',
  write_temp_tails_swept: 'temporary tails of appends by compose a crash left, deleted after 30 minutes',
  write_upload_ms: 'milliseconds from a close or fsync to its upload finished, summed (their mean is this over write_uploads)',
  write_streamed_files: 'new files whose bytes went to GCS as they were written (a resumable session fed while writing)',
  write_chunks_from_memory: 'upload chunks of streamed files sent from memory (their staged copy written with O_DIRECT, not read back)',
  write_stream_stops: 'streamed files that stopped streaming (an out-of-order write or a truncate into sent bytes): uploaded whole at close',
  write_estale: 'closes and fsyncs that failed with ESTALE: the object changed behind the mount (the other writer kept)',
  write_failures: 'uploads that failed otherwise (EIO to the close or fsync; the staged file kept for a retry)',
  write_cached_blocks: 'blocks of uploaded files put into the block cache (reading one\'s output back costs no download)',
  gcs_precondition_failures: 'writes refused with 412 (another writer changed the object: ESTALE or EEXIST)',
  fuse_read_bytes: 'bytes returned by FUSE reads (the native path\'s included)',
  fuse_invalidated_inodes: 'inodes whose attributes and pages the kernel was told to drop (the object changed)',
  fuse_invalidated_entries: 'names gone from GCS (or no longer a file or folder) whose inode or entry the kernel was told to drop',
  native_reads: 'FUSE reads answered by the native path: blocks already on disk, read and checked without JavaScript',
  native_read_bytes: 'bytes returned by those reads',
  native_read_ms: 'milliseconds from the kernel\'s request to the answer, summed over those reads (their mean latency is this over native_reads)',
  native_fallbacks: 'reads the native path gave back to JavaScript (a damaged block file, no block memory free, or a block it waited for did not land)',
  native_blocks_lent: 'blocks on their way to disk whose waiting reads the native path answered from the download\'s memory, lent to it until the block file landed',
  native_landed_lent: 'blocks on disk already whose downloaded bytes a handle\'s readahead still held, lent to the native path as the reads reached them (not read back from their file)',
  native_reads_waited: 'reads the native path held until their block, on its way to disk, landed (a file opened while its prefetch downloads)',
  native_block_loads: 'block files the native path read and checked (those a read was answered from also count in block_cache_hits)',
  native_preloads: 'prefetched blocks the native path was asked to load into memory once on disk, before their file is read',
  fuse_errors: 'FUSE operations answered with an error',
  meta_stat_hits: 'lookups answered by the stat cache',
  meta_type_hits: 'lookups answered by the type cache (directories)',
  meta_negative_hits: 'lookups answered by the negative cache',
  meta_list_hits: 'lookups and readdirs answered by a cached listing',
  meta_list_misses: 'readdirs that had to list GCS',
  meta_misses: 'lookups that had to ask GCS',
  meta_lookup_walks: 'lookup walks: subtrees listed flat from a looked-up name on, for the lookups below it (--enable-metadata-prefetch)',
  meta_lookup_pages_ahead: 'background pages of lookup walks (paid for by the lookups they answered without a request)',
  meta_prefetch_joined: 'lookups answered by a listing in progress (by a part started at the name, or a page under way)',
  meta_walks: 'walks detected: subtrees listed flat, every folder filled from it',
  meta_walk_folders: 'folder listings filled by walks',
  names_skipped: 'object names that cannot be paths and were hidden',
  block_cache_hits: 'blocks served from the disk cache (by JavaScript or the native path)',
  block_cache_hit_bytes: 'bytes of blocks served from the disk cache (by JavaScript or the native path)',
  block_cache_misses: 'blocks not in the disk cache (fetched from GCS)',
  block_fetches: 'blocks downloaded from GCS',
  block_range_fetches: 'byte ranges downloaded alone (small inner chunks of shards a reader jumps between), not whole blocks',
  block_fetch_bytes: 'bytes of blocks downloaded from GCS',
  block_shared_waits: 'block reads that joined a download already in flight',
  block_memory_hits: 'blocks read again from memory after their readers let go (a shard reopened per inner chunk), neither disk nor GCS asked',
  block_cache_evictions: 'blocks evicted from the disk cache',
  block_cache_evicted_bytes: 'bytes evicted from the disk cache',
  block_cache_corrupt: 'cached blocks dropped for failing their CRC32C',
  block_cache_short: 'cached blocks dropped for being shorter than indexed',
  block_cache_missing: 'cached blocks dropped because their file was gone',
  block_cache_unavailable: 'cached blocks whose file could not be read just now (no descriptor or memory to spare): read from GCS, kept',
  block_cache_write_errors: 'blocks that could not be written to the disk cache',
  block_cache_skipped_no_room: 'blocks not written to the disk cache because, with no budget (-1), nothing was left to evict above the free-space margin',
  log_lines_lost: 'log lines dropped because the log could not be written (its disk full) for longer than a 1 MiB backlog',
  object_crc_mismatches: 'whole-object downloads that failed the object CRC32C',
  prefetch_files: 'files fetched ahead of any open (Zarr chunks, next files of a folder)',
  prefetch_bytes: 'bytes fetched ahead of any open',
  prefetch_used_files: 'prefetched files opened afterwards (same generation)',
  prefetch_used_bytes: 'bytes of prefetched files opened afterwards',
  prefetch_wasted_bytes: 'bytes of prefetched files dropped before anyone opened them',
  prefetch_evicted_bytes: 'prefetched bytes pushed out of the in-memory prefetch budget',
  prefetch_fill_skipped: 'predicted files the listing does not have (Zarr fill-value chunks): never requested',
  prefetch_budget_stops: 'prefetch rounds stopped by the memory budget or to spare the disk cache an eviction',
  memory_waits: 'reads that waited for memory (the mount-wide --memory-limit-mb budget)',
  memory_wait_ms: 'milliseconds reads spent waiting for memory, in all',
  memory_readahead_skipped: 'times readahead was held back because the memory budget was short or a read waited for memory (checked at each read of a sequential reader)',
  memory_prefetch_skipped: 'prefetch downloads (a file, or a block) not started because the memory budget was short or a read waited for memory',
  memory_reclaims: 'holders asked to give memory back for a waiting read (prefetched blocks, blocks behind or ahead of readers)',
  prefetch_consolidated_layouts: "Zarr arrays whose layout came from the store's consolidated metadata (.zmetadata, or v3's root zarr.json): no GET of their own",
} as const;

/** Values read when a snapshot is taken, not counted. */
export const GAUGES = {
  block_cache_bytes: 'bytes held in the disk cache',
  block_cache_blocks: 'blocks held in the disk cache',
  block_cache_limit_bytes: 'the disk cache budget (-1: unlimited)',
  block_cache_free_margin_bytes: 'with no disk cache budget (-1): the free space kept on the cache\'s file system',
  downloads_in_flight: 'range GETs in progress',
  download_workers: 'download worker threads started (up to --download-workers; each is started when first put to use)',
  download_workers_in_flight: 'range GET attempts on the download workers now',
  download_workers_utilization: 'the busiest download worker\'s event-loop utilization (0-1) over the last 2 s',
  main_thread_utilization: 'the main (JavaScript) thread\'s event-loop utilization (0-1) over the last 2 s: near 1, it is what limits the mount',
  downloads_queued: 'range GETs waiting for a download slot',
  gcs_concurrency_limit: 'requests GCS may have in flight now (a cap; halved on 429 only without a rate limit)',
  gcs_rate_limit: 'GCS requests per second allowed now (AIMD: cut on 429, grown while saturated)',
  gcs_rate_ceiling: 'the request-rate ceiling now (ramped from --initial-ops-per-sec, within --limit-ops-per-sec)',
  gcs_rate_queued: 'GCS requests waiting for a request-rate token',
  gcs_bandwidth_limit_bytes: 'bytes per second range reads may take (--limit-bytes-per-sec)',
  gcs_bandwidth_queued: 'GCS range reads waiting for --limit-bytes-per-sec',
  gcs_stall_timeout_ms: 'the current stall timeout in ms (target percentile of recent silences, within the floor and cap)',
  readahead_blocks: 'blocks held in memory ahead of sequential readers',
  block_buffers_in_use: 'block-sized buffers lent out to downloads, readers and disk writes (memory in use for block data)',
  memory_limit_bytes: 'the daemon\'s memory limit (--memory-limit-mb)',
  memory_blocks_limit_bytes: 'what block memory may take of it: the limit less the daemon\'s own memory at start and a reserve for reads in progress',
  memory_in_use_bytes: 'bytes of the memory budget in use (block buffers of reads, readahead, prefetch, disk writes)',
  memory_peak_bytes: 'the most bytes of the memory budget in use at once since the start',
  memory_waiting: 'reads waiting for memory now',
  memory_waiting_bytes: 'bytes those reads wait for',
  memory_block_buffers_resident_bytes: 'bytes of block buffers in memory: in use, and kept for reuse (given back after 2 s unused)',
  memory_recent_blocks_bytes: 'bytes of blocks of followed Zarr shards kept in memory after their readers let go (at most a quarter of the block memory budget, 1 GiB; given back first when a read waits for memory, and after 10 s unused)',
  memory_listing_bytes: 'bytes of directory listings held (accounted with the memory budget, limited by --stat-cache-max-size-mb)',
  native_block_buffers: 'block-sized buffers the native read path holds (blocks read from disk and checked; freed after 30 s unused)',
  open_files: 'files open through the mount',
  write_files_open: 'files open for writing (each with a staged copy)',
  write_staged_bytes: 'bytes of staged copies of files open for writing',
  write_uploads_in_flight: 'chunks of resumable uploads in flight (one-shot uploads of small files are not counted)',
  open_dirs: 'folders open through the mount (opendir without releasedir)',
  kernel_inodes: 'inodes the kernel holds a lookup of (lookups and readdirplus entries, until FORGET)',
  prefetch_held_bytes: 'prefetched bytes held in memory (no --cache-dir)',
  prefetch_in_flight: 'prefetched files downloading',
  meta_stat_entries: 'object metadata and "no such path" entries in the stat cache',
  meta_stat_bytes: 'bytes of those entries (the stat budget is shared with listings)',
  meta_stat_limit_bytes: 'the stat cache budget, listings included (--stat-cache-max-size-mb; -1: unlimited)',
  meta_listing_folders: 'directory listings in the stat cache (compact, whole folders)',
  meta_listing_entries: 'entries of those listings',
  meta_listing_bytes: 'bytes of those listings',
  meta_type_entries: 'paths in the type cache',
  meta_type_bytes: 'bytes of the type cache',
  meta_listings_in_progress: 'folders being listed (a lookup started it in the background, or a readdir waits)',
  meta_walks_in_progress: 'subtrees being listed flat for a walk (find, du, os.walk)',
  meta_list_workers_busy: 'background list requests in flight (--metadata-prefetch-max-workers)',
} as const;

export type CounterName = keyof typeof COUNTERS;
export type GaugeName = keyof typeof GAUGES;

/** Upper bounds (ms) of the latency buckets kept per FUSE operation. */
export const LATENCY_BUCKETS_MS = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, Number.POSITIVE_INFINITY];

export interface OpStats {
  count: number;
  errors: number;
  totalMs: number;
  maxMs: number;
  /** Observations per LATENCY_BUCKETS_MS bucket, for the quantiles `gcsmount stats` shows. */
  buckets: number[];
}

export interface OpSummary {
  count: number;
  errors: number;
  avgMs: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
}

export interface MetricsSnapshot {
  uptimeSeconds: number;
  counters: Record<CounterName, number>;
  gauges: Partial<Record<GaugeName, number>>;
  /** FUSE operations by name. */
  ops: Record<string, OpSummary>;
}

/** The bucket bound below which a fraction q of the observations fall: coarse, honest about it. */
function quantile(op: OpStats, q: number): number {
  const rank = q * op.count;
  let seen = 0;
  for (let i = 0; i < op.buckets.length; i++) {
    seen += op.buckets[i]!;
    if (seen >= rank) return Math.min(LATENCY_BUCKETS_MS[i]!, op.maxMs);
  }
  return op.maxMs;
}

export class Metrics {
  private readonly values: Record<CounterName, number>;
  private readonly gauges = new Map<GaugeName, () => number>();
  /** Counts kept outside JavaScript (the native read path), added to a counter when it is read. */
  private readonly sources = new Map<CounterName, (() => number)[]>();
  private readonly ops = new Map<string, OpStats>();
  private readonly startedAt = Date.now();

  constructor() {
    this.values = Object.fromEntries(Object.keys(COUNTERS).map((k) => [k, 0])) as Record<CounterName, number>;
  }

  inc(name: CounterName, by = 1): void {
    this.values[name] += by;
  }

  get(name: CounterName): number {
    let v = this.values[name];
    for (const read of this.sources.get(name) ?? []) v += read();
    return v;
  }

  /** Adds a count kept elsewhere (monotonic, like every counter) to counter `name`. */
  addCounterSource(name: CounterName, read: () => number): void {
    const list = this.sources.get(name);
    if (list) list.push(read);
    else this.sources.set(name, [read]);
  }

  /** Records one FUSE operation's latency. */
  observeOp(op: string, ms: number, failed: boolean): void {
    let s = this.ops.get(op);
    if (!s) {
      s = { count: 0, errors: 0, totalMs: 0, maxMs: 0, buckets: LATENCY_BUCKETS_MS.map(() => 0) };
      this.ops.set(op, s);
    }
    s.count++;
    if (failed) s.errors++;
    s.totalMs += ms;
    if (ms > s.maxMs) s.maxMs = ms;
    let i = 0;
    while (ms > LATENCY_BUCKETS_MS[i]!) i++;
    s.buckets[i]!++;
  }

  /** Raw per-operation figures, for Prometheus. */
  opStats(): ReadonlyMap<string, OpStats> {
    return this.ops;
  }

  /** Registers how to read a gauge; the component that owns the value owns the reading. */
  setGauge(name: GaugeName, read: () => number): void {
    this.gauges.set(name, read);
  }

  snapshot(): MetricsSnapshot {
    const gauges: Partial<Record<GaugeName, number>> = {};
    for (const [name, read] of this.gauges) gauges[name] = read();
    const ops: Record<string, OpSummary> = {};
    for (const [name, o] of this.ops) {
      ops[name] = { count: o.count, errors: o.errors, avgMs: o.count ? o.totalMs / o.count : 0, p50Ms: quantile(o, 0.5), p99Ms: quantile(o, 0.99), maxMs: o.maxMs };
    }
    const counters = { ...this.values };
    for (const name of this.sources.keys()) counters[name] = this.get(name);
    return { uptimeSeconds: (Date.now() - this.startedAt) / 1000, counters, gauges, ops };
  }
}
