// The one table of every mount option gcsmount accepts. gcsmount is meant as a drop-in for gcsfuse, so
// flag names, config-file keys (gcsfuse's YAML layout), types and defaults follow gcsfuse's own
// parameter table (cfg/params.yaml in GoogleCloudPlatform/gcsfuse, v3 era); our own options live under
// a `gcsmount:` section of the config file. The parser (options.ts), `--help` and the docs table are all
// generated from this list: add an option here and nowhere else.
//
// `default` is the resolved value (what MountOptions.values holds): booleans, numbers (durations in
// milliseconds, octal modes as numbers), strings, string arrays.

import { availableParallelism, totalmem } from 'node:os';

export type ParamType = 'bool' | 'int' | 'float' | 'string' | 'duration' | 'octal' | 'string-list';

export type ParamGroup =
  | 'Mounting'
  | 'Metadata cache'
  | 'Block cache'
  | 'Downloads'
  | 'Writes'
  | 'GCS connection'
  | 'Authentication'
  | 'Logging and metrics'
  | 'Permissions'
  | 'Compatibility';

export type ParamEffect = 'effective' | 'planned' | 'ignored';

export interface Param {
  /** gcsfuse's flag name without dashes, e.g. 'metadata-cache-ttl-secs'. */
  flag: string;
  /** gcsfuse YAML path, e.g. 'metadata-cache.ttl-secs'; null if the option is command-line only. */
  configKey: string | null;
  type: ParamType;
  /** gcsfuse's current default (or ours where we differ, with the reason in `help`), in resolved form. */
  default: unknown;
  /** One line. For 'ignored' options it says why. */
  help: string;
  group: ParamGroup;
  /** 'planned': accepted now, takes effect in a later release; 'ignored': accepted for gcsfuse compatibility only. */
  effect: ParamEffect;
  /** Set when gcsfuse deprecates the option: what to use instead. */
  deprecated?: string;
  /** Bounds for numeric types (inclusive). */
  min?: number;
  max?: number;
  /** For 'string' options with a fixed vocabulary (matched case-insensitively, stored lower-case). */
  choices?: readonly string[];
  /** A filesystem path: '~' is expanded and relative paths are made absolute. */
  path?: boolean;
}

/** gcsfuse's DefaultMaxParallelDownloads(): max(16, 2 x CPUs). */
const DEFAULT_MAX_PARALLEL_DOWNLOADS = Math.max(16, 2 * availableParallelism());

/**
 * Half the CPUs, at most 8 (a worker receives well over 1 GiB/s; the main thread's serial work is the cap
 * past that), and none on a 1-CPU machine, where a second thread would only take turns with the first.
 */
export const DEFAULT_DOWNLOAD_WORKERS = Math.min(8, Math.floor(availableParallelism() / 2));

/**
 * One eighth of the machine's RAM, at least 256 MiB and at most 4 GiB: room for a hundred readers' blocks
 * and the downloads in flight with the default block size, and a small share of a big machine, whose
 * memory belongs to the pipeline reading through the mount.
 */
export const DEFAULT_MEMORY_LIMIT_MB = Math.min(4096, Math.max(256, Math.floor(totalmem() / 8 / 2 ** 20)));

/** gcsfuse accepts TTLs up to MaxInt64 nanoseconds. */
const MAX_TTL_SECS = 9_223_372_036;

export const PARAMS = [
  // ---------------------------------------------------------------- Mounting
  {
    flag: 'bucket',
    configKey: 'gcsmount.bucket',
    type: 'string',
    default: '',
    help: 'gcsmount: the bucket, when BUCKET is not on the command line (a config file per systemd unit)',
    group: 'Mounting',
    effect: 'effective',
  },
  {
    flag: 'mount-point',
    configKey: 'gcsmount.mount-point',
    type: 'string',
    default: '',
    help: 'gcsmount: where to mount, when MOUNTPOINT is not on the command line',
    group: 'Mounting',
    effect: 'effective',
  },
  {
    flag: 'config-file',
    configKey: null,
    type: 'string',
    default: '',
    help: 'YAML config file in gcsfuse layout; command-line flags override its values',
    group: 'Mounting',
    effect: 'effective',
    path: true,
  },
  {
    flag: 'foreground',
    configKey: 'foreground',
    type: 'bool',
    default: false,
    help: 'Stay in the foreground after mounting',
    group: 'Mounting',
    effect: 'effective',
  },
  {
    flag: 'start-timeout',
    configKey: 'gcsmount.start-timeout',
    type: 'duration',
    default: 120_000,
    help: 'gcsmount: how long `gcsmount BUCKET DIR` waits for its daemon to mount (credentials, bucket check, cache dir, kernel mount; seconds when GCS answers) before it stops the daemon and exits 1. Not used with --foreground, where the service manager\'s start timeout applies',
    group: 'Mounting',
    effect: 'effective',
    min: 1000,
  },
  {
    flag: 'unmount-grace-period',
    configKey: 'gcsmount.unmount-grace-period',
    type: 'duration',
    default: 30_000,
    help: 'gcsmount: on SIGTERM or SIGINT while files are open in the mount, it is detached at once (new opens fail, as after umount -l) and the open files are still served for up to this long; the daemon then stops (their further reads fail). Keep it below the service manager\'s stop timeout (the unit: 60 s)',
    group: 'Mounting',
    effect: 'effective',
  },
  {
    flag: 'only-dir',
    configKey: 'only-dir',
    type: 'string',
    default: '',
    help: 'Mount only this directory (object prefix) of the bucket',
    group: 'Mounting',
    effect: 'effective',
  },
  {
    flag: 'implicit-dirs',
    configKey: 'implicit-dirs',
    type: 'bool',
    default: true,
    help: 'Always on in gcsmount (gcsfuse default: false): every object prefix is a directory, placeholder object or not',
    group: 'Mounting',
    effect: 'effective',
  },
  {
    flag: 'o',
    configKey: 'file-system.fuse-options',
    type: 'string-list',
    default: [],
    help: 'FUSE mount options, comma-separated and repeatable: ro (read-only: every change is EROFS), rw, allow_other, allow_root, default_permissions, noexec, nosuid, nodev, noatime (any other is logged as ignored)',
    group: 'Mounting',
    effect: 'effective',
  },

  // ---------------------------------------------------------------- Metadata cache
  {
    flag: 'metadata-cache-ttl-secs',
    configKey: 'metadata-cache.ttl-secs',
    type: 'int',
    default: 60,
    help: 'Seconds to cache object and directory metadata; -1 = forever, 0 = no cache',
    group: 'Metadata cache',
    effect: 'effective',
    min: -1,
    max: MAX_TTL_SECS,
  },
  {
    flag: 'metadata-cache-negative-ttl-secs',
    configKey: 'metadata-cache.negative-ttl-secs',
    type: 'int',
    default: 5,
    help: 'Seconds to remember that a name does not exist; -1 = forever, 0 = no negative cache',
    group: 'Metadata cache',
    effect: 'effective',
    min: -1,
    max: MAX_TTL_SECS,
  },
  {
    flag: 'stat-cache-max-size-mb',
    configKey: 'metadata-cache.stat-cache-max-size-mb',
    type: 'int',
    default: 33,
    help: 'Memory for cached object metadata, in MiB; -1 = unlimited, 0 = no cache',
    group: 'Metadata cache',
    effect: 'effective',
    min: -1,
  },
  {
    flag: 'type-cache-max-size-mb',
    configKey: 'metadata-cache.type-cache-max-size-mb',
    type: 'int',
    default: 4,
    help: 'Memory for cached file/directory types across the mount (gcsfuse: per directory), in MiB; -1 = unlimited, 0 = no cache',
    group: 'Metadata cache',
    effect: 'effective',
    min: -1,
  },
  {
    flag: 'kernel-list-cache-ttl-secs',
    configKey: 'file-system.kernel-list-cache-ttl-secs',
    type: 'int',
    default: 0,
    help: 'Seconds the kernel serves a folder listing from its own cache without asking gcsmount; -1 = forever, 0 = off',
    group: 'Metadata cache',
    effect: 'effective',
    min: -1,
    max: MAX_TTL_SECS,
  },
  {
    flag: 'max-read-ahead-kb',
    configKey: 'file-system.max-read-ahead-kb',
    type: 'int',
    default: 4096,
    help: "The mount's kernel readahead (read_ahead_kb), so sequential reads arrive as 1 MiB requests; 0 = the kernel's default (128). Needs root; gcsfuse's default is 0",
    group: 'Mounting',
    effect: 'effective',
    min: 0,
    max: 1024 * 1024,
  },
  {
    flag: 'stat-cache-ttl',
    configKey: 'metadata-cache.deprecated-stat-cache-ttl',
    type: 'duration',
    default: 60_000,
    help: 'Old metadata TTL; used (min with --type-cache-ttl, rounded up to seconds) only if --metadata-cache-ttl-secs is unset',
    group: 'Metadata cache',
    effect: 'effective',
    deprecated: 'use --metadata-cache-ttl-secs',
  },
  {
    flag: 'type-cache-ttl',
    configKey: 'metadata-cache.deprecated-type-cache-ttl',
    type: 'duration',
    default: 60_000,
    help: 'Old type-cache TTL; used (min with --stat-cache-ttl, rounded up to seconds) only if --metadata-cache-ttl-secs is unset',
    group: 'Metadata cache',
    effect: 'effective',
    deprecated: 'use --metadata-cache-ttl-secs',
  },
  {
    flag: 'stat-cache-capacity',
    configKey: 'metadata-cache.deprecated-stat-cache-capacity',
    type: 'int',
    default: 20460,
    help: 'Old entry-count limit of the stat cache; gcsmount sizes it only by --stat-cache-max-size-mb',
    group: 'Metadata cache',
    effect: 'ignored',
    deprecated: 'use --stat-cache-max-size-mb',
    min: 0,
  },
  {
    flag: 'enable-nonexistent-type-cache',
    configKey: 'metadata-cache.enable-nonexistent-type-cache',
    type: 'bool',
    default: false,
    help: 'Negative caching is governed by --metadata-cache-negative-ttl-secs in gcsmount',
    group: 'Metadata cache',
    effect: 'ignored',
  },
  {
    flag: 'enable-metadata-prefetch',
    configKey: 'metadata-cache.enable-metadata-prefetch',
    type: 'bool',
    default: true,
    help: 'A lookup in a folder nobody has listed lists its subtree flat from the looked-up name on (one small page: the name and the files and folders after it at every depth), so the lookups that follow are answered from memory; the listing goes on ahead only as far as the lookups it answers pay for (a page per ten); a readdir of a sub-folder of a folder just read lists the whole subtree flat (a walk). gcsmount default: true (gcsfuse: false before v3.10)',
    group: 'Metadata cache',
    effect: 'effective',
  },
  {
    flag: 'metadata-prefetch-entries-limit',
    configKey: 'metadata-cache.metadata-prefetch-entries-limit',
    type: 'int',
    default: -1,
    help: 'Entries a lookup walk lists ahead of its lookups before it stops (lookups and readdirs still list what they need); -1 = no limit but the walk\'s own (a page per ten lookups answered), within --stat-cache-max-size-mb. gcsmount default: -1 (gcsfuse: 5000): a Zarr array keeps 100,000+ chunks in one folder',
    group: 'Metadata cache',
    effect: 'effective',
    min: -1,
  },
  {
    flag: 'metadata-prefetch-max-workers',
    configKey: 'metadata-cache.metadata-prefetch-max-workers',
    type: 'int',
    default: 10,
    help: 'Background list requests in flight at once across the mount, and the parts one large folder or walk is listed in; -1 = 64',
    group: 'Metadata cache',
    effect: 'effective',
    min: -1,
  },
  {
    flag: 'experimental-metadata-prefetch-on-mount',
    configKey: 'metadata-cache.experimental-metadata-prefetch-on-mount',
    type: 'string',
    default: 'disabled',
    help: 'Experimental in gcsfuse; with gcsmount use `gcsmount warm` to prefetch',
    group: 'Metadata cache',
    effect: 'ignored',
    choices: ['disabled', 'sync', 'async'],
  },

  // ---------------------------------------------------------------- Block cache
  {
    flag: 'cache-dir',
    configKey: 'cache-dir',
    type: 'string',
    default: '',
    help: 'Directory for the on-disk block cache; empty = no disk cache. gcsmount keeps everything in DIR/gcsmount-cache/ (0700) and changes nothing else in DIR; a cache of the previous layout (DIR/index.sqlite, DIR/blocks-v2/) is moved there',
    group: 'Block cache',
    effect: 'effective',
    path: true,
  },
  {
    flag: 'file-cache-max-size-mb',
    configKey: 'file-cache.max-size-mb',
    type: 'int',
    default: -1,
    help: 'Maximum size of the disk cache in MiB; 0 = no disk cache; -1 = limited by free space: gcsmount keeps 5% of the file system free (at most 4 GiB), evicting the least recently used blocks to stay above that',
    group: 'Block cache',
    effect: 'effective',
    min: -1,
  },
  {
    flag: 'file-cache-enable-o-direct',
    configKey: 'file-cache.enable-o-direct',
    type: 'bool',
    default: true,
    help: 'Write cached blocks with O_DIRECT, past the page cache, and read them back that way (the native read path); gcsmount defaults to true (gcsfuse: false): what a reader reads is in the kernel\'s cache of the mounted file already, so a second copy costs a memory copy and memory. Where the file system refuses O_DIRECT (tmpfs before Linux 6.6) blocks go through the page cache',
    group: 'Block cache',
    effect: 'effective',
  },
  {
    flag: 'file-cache-cache-file-for-range-read',
    configKey: 'file-cache.cache-file-for-range-read',
    type: 'bool',
    default: false,
    help: 'gcsmount caches the blocks a reader touches; objects up to --whole-object-threshold-mb are fetched whole',
    group: 'Block cache',
    effect: 'ignored',
  },
  {
    flag: 'file-cache-include-regex',
    configKey: 'file-cache.include-regex',
    type: 'string',
    default: '',
    help: 'Cache only paths (bucket/object) matching this regular expression',
    group: 'Block cache',
    effect: 'planned',
  },
  {
    flag: 'file-cache-exclude-regex',
    configKey: 'file-cache.exclude-regex',
    type: 'string',
    default: '',
    help: 'Never cache paths (bucket/object) matching this regular expression',
    group: 'Block cache',
    effect: 'planned',
  },
  {
    flag: 'block-size-mb',
    configKey: 'gcsmount.block-size-mb',
    type: 'int',
    // 4 MiB: at GCS's 50-100 ms to first byte and 50-100 MB/s per connection, a 4 MiB GET spends about as
    // long moving bytes as waiting, so latency is amortised without making a random reader fetch much it
    // does not want; typical Zarr chunks (1-16 MiB) are one to four blocks; 20 TB of cache is ~5 million
    // index rows, small for SQLite; and 5,000 requests/s per bucket still carry ~20 GB/s.
    default: 4,
    help: 'gcsmount: size of a cached block (and of one range GET) in MiB',
    group: 'Block cache',
    effect: 'effective',
    min: 1,
    max: 1024,
  },
  {
    flag: 'whole-object-threshold-mb',
    configKey: 'gcsmount.whole-object-threshold-mb',
    type: 'int',
    default: 8,
    help: 'gcsmount: objects up to this size in MiB are fetched whole, in one GET, on their first read (Zarr chunks)',
    group: 'Block cache',
    effect: 'effective',
    min: 0,
  },

  // ---------------------------------------------------------------- Downloads
  {
    flag: 'download-workers',
    configKey: 'gcsmount.download-workers',
    type: 'int',
    default: DEFAULT_DOWNLOAD_WORKERS,
    help: 'gcsmount: threads that receive range GETs (HTTP parsing and the copy into block memory) and send upload chunks beside the main thread, each with its own connections (default: half the CPUs, at most 8); 0: all on the main thread',
    group: 'Downloads',
    effect: 'effective',
    min: 0,
    max: 64,
  },
  {
    flag: 'file-cache-enable-parallel-downloads',
    configKey: 'file-cache.enable-parallel-downloads',
    type: 'bool',
    default: true,
    help: 'Fetch blocks of one object with several range GETs at once; gcsmount defaults to true (gcsfuse: false): it is how one sequential reader fills the network. false = one GET per object at a time',
    group: 'Downloads',
    effect: 'effective',
  },
  {
    flag: 'file-cache-max-parallel-downloads',
    configKey: 'file-cache.max-parallel-downloads',
    type: 'int',
    default: DEFAULT_MAX_PARALLEL_DOWNLOADS,
    help: 'Range GETs in flight across all objects; default max(16, 2 x CPUs); -1 = unlimited',
    group: 'Downloads',
    effect: 'effective',
    min: -1,
  },
  {
    flag: 'file-cache-parallel-downloads-per-file',
    configKey: 'file-cache.parallel-downloads-per-file',
    type: 'int',
    default: 16,
    help: 'Range GETs in flight for one object (with parallel downloads enabled)',
    group: 'Downloads',
    effect: 'effective',
    min: 1,
  },
  {
    flag: 'file-cache-download-chunk-size-mb',
    configKey: 'file-cache.download-chunk-size-mb',
    type: 'int',
    default: 200,
    help: 'Size of each parallel download; gcsmount downloads in blocks of --block-size-mb',
    group: 'Downloads',
    effect: 'ignored',
    min: 1,
  },
  {
    flag: 'enable-buffered-read',
    configKey: 'read.enable-buffered-read',
    type: 'bool',
    default: false,
    help: 'gcsfuse buffered reads; gcsmount always reads ahead of sequential readers (see --sequential-read-size-mb, --read-global-max-blocks)',
    group: 'Downloads',
    effect: 'ignored',
  },
  {
    flag: 'read-global-max-blocks',
    configKey: 'read.global-max-blocks',
    type: 'int',
    default: 40,
    help: 'Blocks held in memory ahead of readers across all open files (within --memory-limit-mb, which bounds all block memory); -1 = unlimited, 0 = no readahead',
    group: 'Downloads',
    effect: 'effective',
    min: -1,
  },
  {
    flag: 'memory-limit-mb',
    configKey: 'gcsmount.memory-limit-mb',
    type: 'int',
    default: DEFAULT_MEMORY_LIMIT_MB,
    help: 'gcsmount (gcsfuse has no such flag; its --read-global-max-blocks bounds buffered reads only): the daemon\'s memory limit, in MiB: block buffers of reads, readahead and prefetch draw on one budget, what is left of the limit after the daemon\'s own memory at start and 64 MiB kept for reads in progress; a read waits for memory rather than allocating past it, readahead and prefetch are skipped when it is short; default 1/8 of RAM within 256-4096',
    group: 'Downloads',
    effect: 'effective',
    min: 8,
  },
  {
    flag: 'sequential-read-size-mb',
    configKey: 'gcs-connection.sequential-read-size-mb',
    type: 'int',
    default: 64,
    help: 'Readahead cap per open file in MiB: the window of blocks fetched ahead of a sequential reader grows 1, 2, 4... blocks up to this; gcsmount defaults to 64 (gcsfuse: 200) because readahead is held in memory',
    group: 'Downloads',
    effect: 'effective',
    min: 1,
    max: 1024,
  },
  {
    flag: 'prefetch-zarr',
    configKey: 'gcsmount.prefetch.zarr',
    type: 'bool',
    default: true,
    help: 'gcsmount: when a chunk file of a Zarr array (v2 or v3, grid and key encoding from its metadata or the store\'s consolidated metadata) is opened, fetch the chunks a reader walking in C order opens next, before they are opened; in sharded v3 arrays, the inner chunks read next, within and across shards (each shard\'s index read once); missing (fill-value) chunks are never requested',
    group: 'Downloads',
    effect: 'effective',
  },
  {
    flag: 'prefetch-siblings',
    configKey: 'gcsmount.prefetch.siblings',
    type: 'bool',
    default: true,
    help: 'gcsmount: when files of one folder are opened in name order (file series, shard-000001.tar), fetch the next ones before they are opened',
    group: 'Downloads',
    effect: 'effective',
  },
  {
    flag: 'prefetch-max-files-ahead',
    configKey: 'gcsmount.prefetch.max-files-ahead',
    type: 'int',
    default: 32,
    help: 'gcsmount: the furthest prefetch runs ahead of a reader, in files; the distance doubles while predictions hit and drops to 0 on a miss. 0 = no prefetch',
    group: 'Downloads',
    effect: 'effective',
    min: 0,
  },
  {
    flag: 'prefetch-max-parallel-downloads',
    configKey: 'gcsmount.prefetch.max-parallel-downloads',
    type: 'int',
    // 16: a cold Zarr load (1,360 chunk files of ~0.8 MB, 30 ms, 50 MB/s per response, dask's default
    // threads) took 21.0-21.8 s with 8 and 18.3 s with 16, and the daemon less CPU (fewer chunks read on
    // demand before their prefetch arrived); the scheduler still keeps two slots free for demand reads.
    default: 16,
    help: 'gcsmount: prefetched files downloading at once across the mount; they only take download slots demand reads and readahead leave free',
    group: 'Downloads',
    effect: 'effective',
    min: 1,
  },
  {
    flag: 'prefetch-max-size-mb',
    configKey: 'gcsmount.prefetch.max-size-mb',
    type: 'int',
    default: 256,
    help: 'gcsmount: without --cache-dir, prefetched bytes held in memory until opened (oldest dropped first); with a cache dir prefetch goes to disk and stops where it would make the cache evict',
    group: 'Downloads',
    effect: 'effective',
    min: 1,
  },
  {
    flag: 'prefetch-max-blocks-per-file',
    configKey: 'gcsmount.prefetch.max-blocks-per-file',
    type: 'int',
    default: 4,
    help: 'gcsmount: blocks prefetched from the start of each file; the open file\'s own readahead takes it from there',
    group: 'Downloads',
    effect: 'effective',
    min: 1,
  },

  // ---------------------------------------------------------------- GCS connection
  {
    flag: 'custom-endpoint',
    configKey: 'gcs-connection.custom-endpoint',
    type: 'string',
    default: '',
    help: 'Alternative storage endpoint (e.g. an emulator), including the port',
    group: 'GCS connection',
    effect: 'effective',
  },
  {
    flag: 'http-client-timeout',
    configKey: 'gcs-connection.http-client-timeout',
    type: 'duration',
    default: 0,
    help: 'How long GCS may stay silent (headers or body) before the attempt is retried; 0 = undici default of 300 s',
    group: 'GCS connection',
    effect: 'effective',
  },
  {
    flag: 'max-conns-per-host',
    configKey: 'gcs-connection.max-conns-per-host',
    type: 'int',
    default: 0,
    help: 'Maximum TCP connections to the storage host; 0 = no fixed cap (requests in flight still stop at 100 each for data and for metadata)',
    group: 'GCS connection',
    effect: 'effective',
    min: 0,
  },
  {
    flag: 'max-idle-conns-per-host',
    configKey: 'gcs-connection.max-idle-conns-per-host',
    type: 'int',
    default: 100,
    help: 'undici keeps idle sockets for a keep-alive timeout instead; the pool size is --max-conns-per-host',
    group: 'GCS connection',
    effect: 'ignored',
    min: 0,
  },
  {
    flag: 'max-retry-sleep',
    configKey: 'gcs-retries.max-retry-sleep',
    type: 'duration',
    default: 30_000,
    help: 'Upper bound of the exponential backoff between retries of a failed GCS request',
    group: 'GCS connection',
    effect: 'effective',
  },
  {
    flag: 'max-retry-attempts',
    configKey: 'gcs-retries.max-retry-attempts',
    type: 'int',
    default: 0,
    help: 'Attempts in all for one GCS request before the read fails with EIO; 0 = no limit (429 and 5xx are retried until they pass)',
    group: 'GCS connection',
    effect: 'effective',
    min: 0,
  },
  {
    flag: 'retry-multiplier',
    configKey: 'gcs-retries.multiplier',
    type: 'float',
    default: 2,
    help: 'Factor by which the backoff between retries grows',
    group: 'GCS connection',
    effect: 'effective',
    min: 1,
  },
  {
    flag: 'client-protocol',
    configKey: 'gcs-connection.client-protocol',
    type: 'string',
    default: 'http1',
    help: 'gcsmount chooses its own transport to GCS',
    group: 'GCS connection',
    effect: 'ignored',
    choices: ['http1', 'http2', 'grpc'],
  },
  {
    flag: 'billing-project',
    configKey: 'gcs-connection.billing-project',
    type: 'string',
    default: '',
    help: 'Requester-pays billing is not supported by gcsmount',
    group: 'GCS connection',
    effect: 'ignored',
  },
  {
    flag: 'limit-ops-per-sec',
    configKey: 'gcs-connection.limit-ops-per-sec',
    type: 'float',
    default: -1,
    help: 'Hard cap on GCS requests per second from this daemon (also with --initial-ops-per-sec 0, where the rate then starts at this cap); -1 = none. Below it the rate adapts: cut to 0.9 of itself on a 429, +2/s per saturated second below the rate of the last 429 and doubling steps beyond it (0.95 and +1/s once its last six cuts came at about the same rate), so daemons sharing a bucket converge to equal shares',
    group: 'GCS connection',
    effect: 'effective',
  },
  {
    flag: 'initial-ops-per-sec',
    configKey: 'gcsmount.initial-ops-per-sec',
    type: 'float',
    // GCS's guidance: a bucket starts at about 5,000 object reads/s and its request rate should be ramped
    // by doubling no faster than every 20 minutes. One daemon cannot know how many others share the
    // bucket, so it starts at the whole bucket's initial capacity (alone, it never exceeds what GCS
    // promises a new bucket) and lets 429s find its share.
    default: 5000,
    help: 'gcsmount: the request-rate ceiling at start, in requests/s; it doubles every 20 minutes (GCS\'s ramp-up guideline), within --limit-ops-per-sec; 0 = no request-rate limit unless --limit-ops-per-sec sets one',
    group: 'GCS connection',
    effect: 'effective',
    min: 0,
  },
  {
    flag: 'limit-bytes-per-sec',
    configKey: 'gcs-connection.limit-bytes-per-sec',
    type: 'float',
    default: -1,
    help: 'gcsmount does not throttle GCS bandwidth',
    group: 'GCS connection',
    effect: 'ignored',
  },
  {
    flag: 'experimental-enable-json-read',
    configKey: 'gcs-connection.experimental-enable-json-read',
    type: 'bool',
    default: false,
    help: 'gcsmount chooses its own GCS API for reads',
    group: 'GCS connection',
    effect: 'ignored',
    deprecated: 'experimental in gcsfuse',
  },
  {
    flag: 'experimental-grpc-conn-pool-size',
    configKey: 'gcs-connection.grpc-conn-pool-size',
    type: 'int',
    default: 1,
    help: 'gcsmount does not use gRPC',
    group: 'GCS connection',
    effect: 'ignored',
    deprecated: 'experimental in gcsfuse',
    min: 1,
  },
  {
    flag: 'startup-check-timeout',
    configKey: 'gcsmount.startup-check-timeout',
    type: 'duration',
    default: 60_000,
    help: 'How long the bucket check at start keeps retrying 429s, 5xx, resets and timeouts (with backoff) before the mount fails with exit 4, so a throttled bucket slows a start but does not fail it; a missing bucket (404) or refused credentials (401 after a fresh token, 403) fail at once; 0 = one attempt. gcsmount: 60s (gcsfuse has no such flag)',
    group: 'GCS connection',
    effect: 'effective',
  },
  {
    flag: 'max-retry-duration',
    configKey: 'gcsmount.max-retry-duration',
    type: 'duration',
    default: 300_000,
    help: 'The longest one read or lookup keeps retrying (attempts, stalls, backoff) before it fails with EIO, logged as an error with the object and the last status; 0 = no bound. gcsmount: 5m (unused in gcsfuse)',
    group: 'GCS connection',
    effect: 'effective',
  },
  {
    flag: 'enable-read-stall-retry',
    configKey: 'gcs-retries.read-stall.enable',
    type: 'bool',
    default: true,
    help: 'Cut a GCS response whose headers or body stay silent longer than the adaptive stall timeout, and resume it by Range from the last byte received',
    group: 'GCS connection',
    effect: 'effective',
  },
  {
    flag: 'read-stall-initial-req-timeout',
    configKey: 'gcs-retries.read-stall.initial-req-timeout',
    type: 'duration',
    default: 5_000,
    help: 'Stall timeout until a few responses have been timed; gcsmount defaults to 5s (gcsfuse: 20s): its timeout is the percentile of the last 1,000 silences, known after 5, not a slow step estimator',
    group: 'GCS connection',
    effect: 'effective',
  },
  {
    flag: 'read-stall-min-req-timeout',
    configKey: 'gcs-retries.read-stall.min-req-timeout',
    type: 'duration',
    default: 1_500,
    help: 'Floor of the adaptive stall timeout',
    group: 'GCS connection',
    effect: 'effective',
  },
  {
    flag: 'read-stall-max-req-timeout',
    configKey: 'gcs-retries.read-stall.max-req-timeout',
    type: 'duration',
    default: 1_200_000,
    help: 'Cap of the adaptive stall timeout',
    group: 'GCS connection',
    effect: 'effective',
  },
  {
    flag: 'read-stall-req-target-percentile',
    configKey: 'gcs-retries.read-stall.req-target-percentile',
    type: 'float',
    default: 0.99,
    help: 'The stall timeout is this percentile of recent silences (time to headers, longest gap in a body)',
    group: 'GCS connection',
    effect: 'effective',
    min: 0.5,
    max: 1,
  },
  {
    flag: 'read-stall-req-increase-rate',
    configKey: 'gcs-retries.read-stall.req-increase-rate',
    type: 'float',
    default: 15,
    help: 'Step size of gcsfuse\'s percentile estimator; gcsmount takes the percentile of the last 1,000 silences directly (a cut silence counts as the timeout it reached)',
    group: 'GCS connection',
    effect: 'ignored',
    min: 0,
  },

  // ---------------------------------------------------------------- Authentication
  {
    flag: 'key-file',
    configKey: 'gcs-auth.key-file',
    type: 'string',
    default: '',
    help: 'Service-account (or authorized-user) JSON key file, checked at start (unusable: exit 5); unset = application default credentials',
    group: 'Authentication',
    effect: 'effective',
    path: true,
  },
  {
    flag: 'anonymous-access',
    configKey: 'gcs-auth.anonymous-access',
    type: 'bool',
    default: false,
    help: 'Send no credentials (public buckets, emulators)',
    group: 'Authentication',
    effect: 'effective',
  },
  {
    flag: 'token-url',
    configKey: 'gcs-auth.token-url',
    type: 'string',
    default: '',
    help: 'Token URLs are not supported: gcsmount uses --key-file or application default credentials',
    group: 'Authentication',
    effect: 'ignored',
  },
  {
    flag: 'reuse-token-from-url',
    configKey: 'gcs-auth.reuse-token-from-url',
    type: 'bool',
    default: true,
    help: 'Only meaningful with --token-url, which gcsmount does not support',
    group: 'Authentication',
    effect: 'ignored',
  },

  // ---------------------------------------------------------------- Logging and metrics
  {
    flag: 'log-file',
    configKey: 'logging.file-path',
    type: 'string',
    default: '',
    help: 'Write logs to this file (reopened on SIGHUP); unset = stderr with --foreground (the journal under systemd), nowhere for a mount that daemonises',
    group: 'Logging and metrics',
    effect: 'effective',
    path: true,
  },
  {
    flag: 'log-severity',
    configKey: 'logging.severity',
    type: 'string',
    default: 'info',
    help: 'Least severity logged: trace, debug, info, warning, error or off',
    group: 'Logging and metrics',
    effect: 'effective',
    choices: ['trace', 'debug', 'info', 'warning', 'error', 'off'],
  },
  {
    flag: 'log-format',
    configKey: 'logging.format',
    type: 'string',
    default: 'json',
    help: 'Log line format: json (one JSON object a line) or text (time="..." severity=INFO message="..." key=value ...)',
    group: 'Logging and metrics',
    effect: 'effective',
    choices: ['text', 'json'],
  },
  {
    flag: 'log-rotate-max-file-size-mb',
    configKey: 'logging.log-rotate.max-file-size-mb',
    type: 'int',
    default: 512,
    help: 'Rotate the log file when it reaches this size in MiB',
    group: 'Logging and metrics',
    effect: 'planned',
    min: 1,
  },
  {
    flag: 'log-rotate-backup-file-count',
    configKey: 'logging.log-rotate.backup-file-count',
    type: 'int',
    default: 10,
    help: 'Rotated log files to keep; 0 = keep all',
    group: 'Logging and metrics',
    effect: 'planned',
    min: 0,
  },
  {
    flag: 'log-rotate-compress',
    configKey: 'logging.log-rotate.compress',
    type: 'bool',
    default: true,
    help: 'Gzip rotated log files',
    group: 'Logging and metrics',
    effect: 'planned',
  },
  {
    flag: 'prometheus-port',
    configKey: 'metrics.prometheus-port',
    type: 'int',
    default: 0,
    help: 'Serve Prometheus metrics on this port at /metrics; 0 = off',
    group: 'Logging and metrics',
    effect: 'effective',
    min: 0,
    max: 65535,
  },
  {
    flag: 'cloud-metrics-export-interval-secs',
    configKey: 'metrics.cloud-metrics-export-interval-secs',
    type: 'int',
    default: 0,
    help: 'gcsmount does not export to Cloud Monitoring (see `gcsmount stats`, --prometheus-port)',
    group: 'Logging and metrics',
    effect: 'ignored',
    min: 0,
  },
  {
    flag: 'stackdriver-export-interval',
    configKey: 'metrics.stackdriver-export-interval',
    type: 'duration',
    default: 0,
    help: 'gcsmount does not export to Cloud Monitoring',
    group: 'Logging and metrics',
    effect: 'ignored',
    deprecated: 'use --cloud-metrics-export-interval-secs',
  },
  {
    flag: 'enable-grpc-metrics',
    configKey: 'metrics.enable-grpc-metrics',
    type: 'bool',
    default: false,
    help: 'gcsmount does not use gRPC',
    group: 'Logging and metrics',
    effect: 'ignored',
  },
  {
    flag: 'debug_fuse',
    configKey: 'debug.fuse',
    type: 'bool',
    default: false,
    help: 'Old gcsfuse debug switch',
    group: 'Logging and metrics',
    effect: 'ignored',
    deprecated: 'use --log-severity trace',
  },
  {
    flag: 'debug_gcs',
    configKey: 'debug.gcs',
    type: 'bool',
    default: false,
    help: 'Old gcsfuse debug switch',
    group: 'Logging and metrics',
    effect: 'ignored',
    deprecated: 'use --log-severity trace',
  },
  {
    flag: 'debug_fs',
    configKey: null,
    type: 'bool',
    default: false,
    help: 'Unused in gcsfuse too',
    group: 'Logging and metrics',
    effect: 'ignored',
    deprecated: 'use --log-severity trace',
  },
  {
    flag: 'debug_fuse_errors',
    configKey: null,
    type: 'bool',
    default: true,
    help: 'Unused in gcsfuse too',
    group: 'Logging and metrics',
    effect: 'ignored',
    deprecated: 'unused',
  },
  {
    flag: 'debug_http',
    configKey: null,
    type: 'bool',
    default: false,
    help: 'Unused in gcsfuse too',
    group: 'Logging and metrics',
    effect: 'ignored',
    deprecated: 'use --log-severity trace',
  },
  {
    flag: 'debug_invariants',
    configKey: 'debug.exit-on-invariant-violation',
    type: 'bool',
    default: false,
    help: 'gcsfuse-internal debugging switch with no gcsmount counterpart',
    group: 'Logging and metrics',
    effect: 'ignored',
  },
  {
    flag: 'debug_mutex',
    configKey: 'debug.log-mutex',
    type: 'bool',
    default: false,
    help: 'gcsfuse-internal debugging switch with no gcsmount counterpart',
    group: 'Logging and metrics',
    effect: 'ignored',
  },

  // ---------------------------------------------------------------- Permissions
  {
    flag: 'uid',
    configKey: 'file-system.uid',
    type: 'int',
    default: -1,
    help: 'Owner UID of every file and directory; -1 = the mounting user',
    group: 'Permissions',
    effect: 'effective',
    min: -1,
    max: 4_294_967_295,
  },
  {
    flag: 'gid',
    configKey: 'file-system.gid',
    type: 'int',
    default: -1,
    help: 'Owner GID of every file and directory; -1 = the mounting user\'s group',
    group: 'Permissions',
    effect: 'effective',
    min: -1,
    max: 4_294_967_295,
  },
  {
    flag: 'file-mode',
    configKey: 'file-system.file-mode',
    type: 'octal',
    default: 0o644,
    help: 'Permission bits of files, in octal',
    group: 'Permissions',
    effect: 'effective',
  },
  {
    flag: 'dir-mode',
    configKey: 'file-system.dir-mode',
    type: 'octal',
    default: 0o755,
    help: 'Permission bits of directories, in octal',
    group: 'Permissions',
    effect: 'effective',
  },

  // ---------------------------------------------------------------- Compatibility
  {
    flag: 'rename-dir-limit',
    configKey: 'file-system.rename-dir-limit',
    type: 'int',
    default: 0,
    help: 'Rename a folder only if it holds at most this many objects (each is moved on its own: not atomic); above it, EMFILE, as gcsfuse',
    group: 'Writes',
    effect: 'effective',
    min: 0,
  },
  {
    flag: 'temp-dir',
    configKey: 'file-system.temp-dir',
    type: 'string',
    default: '',
    help: 'Where files open for writing are staged (in DIR/gcsmount-staging; default: the cache dir\'s gcsmount-cache/staging, else the system temp dir); a write that would leave less than 5% of its disk free (at most 4 GiB) gets ENOSPC',
    group: 'Writes',
    effect: 'effective',
    path: true,
  },
  {
    flag: 'enable-streaming-writes',
    configKey: 'write.enable-streaming-writes',
    type: 'bool',
    default: true,
    help: 'New files written in order go to GCS chunk by chunk as they are written (a resumable upload finalized at close), not all at close',
    group: 'Writes',
    effect: 'effective',
  },
  {
    flag: 'write-block-size-mb',
    configKey: 'write.block-size-mb',
    type: 'int',
    default: 32,
    help: 'Upload chunk size in MiB: files up to this size are uploaded in one request at close; larger ones in chunks of this size',
    group: 'Writes',
    effect: 'effective',
    min: 1,
    max: 1024,
  },
  {
    flag: 'write-global-max-blocks',
    configKey: 'write.global-max-blocks',
    type: 'int',
    default: 4,
    help: 'Chunks of resumable uploads in flight mount-wide (-1: no limit), each holding a chunk of memory from the --memory-limit-mb budget; files of one chunk or less are not limited by it',
    group: 'Writes',
    effect: 'effective',
    min: -1,
  },
  {
    flag: 'write-max-blocks-per-file',
    configKey: 'write.max-blocks-per-file',
    type: 'int',
    default: 1,
    help: 'Whole chunks a streaming writer may have waiting behind the one being uploaded before its writes wait (each file holds at most this + 1 chunks of memory)',
    group: 'Writes',
    effect: 'effective',
    min: 1,
  },
  {
    flag: 'enable-rapid-appends',
    configKey: 'write.enable-rapid-appends',
    type: 'bool',
    default: true,
    help: 'Appends to Rapid (zonal) buckets\' appendable objects: gcsmount uploads each file whole (staged) or streamed at close',
    group: 'Compatibility',
    effect: 'ignored',
  },
  {
    flag: 'ignore-interrupts',
    configKey: 'file-system.ignore-interrupts',
    type: 'bool',
    default: true,
    help: 'Protects in-flight writes from signals in gcsfuse: gcsmount never abandons a request for a signal (it does not act on FUSE interrupts)',
    group: 'Compatibility',
    effect: 'ignored',
  },
  {
    flag: 'app-name',
    configKey: 'app-name',
    type: 'string',
    default: '',
    help: 'gcsmount identifies itself to GCS with its own user agent',
    group: 'Compatibility',
    effect: 'ignored',
  },
  {
    flag: 'profile',
    configKey: 'profile',
    type: 'string',
    default: '',
    help: 'gcsfuse tuning profiles (aiml-*) do not apply: gcsmount\'s defaults target read-heavy ML',
    group: 'Compatibility',
    effect: 'ignored',
  },
] as const satisfies readonly Param[];

/** One entry of the table, with its literal types. */
export type ParamEntry = (typeof PARAMS)[number];

/** Every flag name in the table. */
export type ParamFlag = ParamEntry['flag'];

/** The flags of a given type, e.g. FlagOfType<'bool'> = 'foreground' | 'implicit-dirs' | ... */
export type FlagOfType<T extends ParamType> = Extract<ParamEntry, { type: T }>['flag'];

/** The resolved value of each type. */
export type ValueOfType<T extends ParamType> = T extends 'bool'
  ? boolean
  : T extends 'string'
    ? string
    : T extends 'string-list'
      ? readonly string[]
      : number; // int, float, octal, duration (milliseconds)

/** Every option's resolved value, keyed by flag name. */
export type ResolvedValues = { [P in ParamEntry as P['flag']]: ValueOfType<P['type']> };

/** Table lookup by flag name. */
export const PARAM_BY_FLAG: ReadonlyMap<string, Param> = new Map(PARAMS.map((p) => [p.flag, p as Param]));

/** Table lookup by config-file key ('metadata-cache.ttl-secs'). */
export const PARAM_BY_CONFIG_KEY: ReadonlyMap<string, Param> = new Map(
  PARAMS.filter((p) => p.configKey !== null).map((p) => [p.configKey as string, p as Param]),
);

/** Groups in the order `--help` shows them. */
export const GROUPS: readonly ParamGroup[] = [
  'Mounting',
  'Metadata cache',
  'Block cache',
  'Downloads',
  'Writes',
  'GCS connection',
  'Authentication',
  'Logging and metrics',
  'Permissions',
  'Compatibility',
];
