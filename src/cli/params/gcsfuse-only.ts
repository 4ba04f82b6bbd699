// gcsfuse's other options: those with no counterpart in gcsmount (telemetry export, gcsfuse's own reader
// and gRPC tuning, Rapid buckets, hierarchical-namespace APIs, experiments). A gcsfuse config file or
// command line that sets them still mounts: each value is checked against its type, and each one set is
// named in a warning saying why it does nothing here. They stay out of PARAMS (and MountOptions.values):
// nothing in gcsmount reads them. Names and types follow gcsfuse's cfg/params.yaml.

import type { Param, ParamType } from './param.js';

const PROFILER = 'Cloud Profiler: gcsmount exports no profiles (use node --cpu-prof, or perf)';
const DUMMY_IO = "gcsfuse's test mode without GCS reads";
const TELEMETRY = "export to Google Cloud's telemetry: gcsmount serves Prometheus metrics (--prometheus-port), `gcsmount stats` and its log";
const FILE_CACHE = "gcsfuse's file-cache internals: gcsmount's block cache is set by --cache-dir, --file-cache-max-size-mb and --block-size-mb";
const READER = "tuning of gcsfuse's readers: gcsmount's readahead follows --sequential-read-size-mb and --read-global-max-blocks";
const KERNEL_READER = "gcsmount already answers cached blocks through the kernel's page cache and native reads, and keeps its own readahead and prefetch (turn those off with their flags)";
const KERNEL_REQUESTS = 'gcsmount negotiates the largest requests this kernel allows (1 MiB reads with --max-read-ahead-kb)';
const HNS = "hierarchical-namespace buckets' folder API: gcsmount lists and renames through objects on every bucket (a folder rename moves each object, up to --rename-dir-limit)";
const MANAGED = 'managed folders are shown only where objects are under them';
const RAPID = "Rapid (zonal) buckets' own read and write paths: gcsmount uses the JSON API's reads and uploads on every bucket";
const CONSISTENCY = "opens are checked against GCS as the metadata cache's TTL says (--metadata-cache-ttl-secs)";
const CRC = "gcsmount checks every block's CRC32C always";
const AUTH = 'gcsmount authenticates through the Google auth library always';
const SYMLINKS = "gcsmount reads both gcsfuse's links (gcsfuse_symlink_target) and standard ones, and makes gcsfuse's";
const NAMES = 'names that cannot be paths (empty, ".", "..", over 255 bytes) are hidden and logged once';
const METADATA = "gcsfuse's metadata-cache experiments: gcsmount's caches are set by the metadata-cache options";
const READDIRPLUS = 'gcsmount answers READDIRPLUS always, so that ls -l takes no lookup per name';
const AUTOCONFIG = "gcsfuse's defaults by machine type: gcsmount sizes itself from the machine's cores and memory";
const MOUNT_RETRIES = 'the bucket check at start retries within --startup-check-timeout';
const UPLOAD_RETRIES = "upload chunks are retried by gcsmount's retry options (--max-retry-sleep, --retry-multiplier, --max-retry-attempts)";
const CONNECTION = "gcsmount's connections are undici's pools (--max-conns-per-host)";
const GRPC = 'gcsmount does not use gRPC';

/** [flag, config key, type, why it does nothing here]. */
const ROWS: readonly (readonly [string, string, ParamType, string])[] = [
  ['cloud-profiler-allocated-heap', 'cloud-profiler.allocated-heap', 'bool', PROFILER],
  ['cloud-profiler-cpu', 'cloud-profiler.cpu', 'bool', PROFILER],
  ['enable-cloud-profiler', 'cloud-profiler.enabled', 'bool', PROFILER],
  ['cloud-profiler-goroutines', 'cloud-profiler.goroutines', 'bool', PROFILER],
  ['cloud-profiler-heap', 'cloud-profiler.heap', 'bool', PROFILER],
  ['cloud-profiler-label', 'cloud-profiler.label', 'string', PROFILER],
  ['cloud-profiler-mutex', 'cloud-profiler.mutex', 'bool', PROFILER],
  ['cloud-profiler-service-name', 'cloud-profiler.service-name', 'string', PROFILER],
  ['disable-autoconfig', 'disable-autoconfig', 'bool', AUTOCONFIG],
  ['enable-dummy-io', 'dummy-io.enable', 'bool', DUMMY_IO],
  ['dummy-io-per-mb-latency', 'dummy-io.per-mb-latency', 'duration', DUMMY_IO],
  ['dummy-io-reader-latency', 'dummy-io.reader-latency', 'duration', DUMMY_IO],
  ['enable-atomic-rename-object', 'enable-atomic-rename-object', 'bool', HNS],
  ['enable-google-lib-auth', 'enable-google-lib-auth', 'bool', AUTH],
  ['enable-hns', 'enable-hns', 'bool', HNS],
  ['enable-new-reader', 'enable-new-reader', 'bool', READER],
  ['enable-standard-symlinks', 'enable-standard-symlinks', 'bool', SYMLINKS],
  ['enable-type-cache-deprecation', 'enable-type-cache-deprecation', 'bool', METADATA],
  ['enable-unsupported-path-support', 'enable-unsupported-path-support', 'bool', NAMES],
  ['file-cache-enable-crc', 'file-cache.enable-crc', 'bool', CRC],
  ['enable-experimental-shared-chunk-cache', 'file-cache.enable-experimental-shared-chunk-cache', 'bool', FILE_CACHE],
  ['file-cache-experimental-disable-size-calculation-fix', 'file-cache.experimental-disable-size-calculation-fix', 'bool', FILE_CACHE],
  ['file-cache-experimental-enable-chunk-cache', 'file-cache.experimental-enable-chunk-cache', 'bool', FILE_CACHE],
  ['file-cache-experimental-parallel-downloads-default-on', 'file-cache.experimental-parallel-downloads-default-on', 'bool', FILE_CACHE],
  ['file-cache-shared-cache-chunk-size-mb', 'file-cache.shared-cache-chunk-size-mb', 'int', FILE_CACHE],
  ['file-cache-write-buffer-size', 'file-cache.write-buffer-size', 'int', FILE_CACHE],
  ['enable-kernel-reader', 'file-system.enable-kernel-reader', 'bool', KERNEL_READER],
  ['experimental-enable-dentry-cache', 'file-system.experimental-enable-dentry-cache', 'bool', METADATA],
  ['experimental-enable-pirlo', 'file-system.experimental-enable-pirlo', 'bool', RAPID],
  ['experimental-enable-readdirplus', 'file-system.experimental-enable-readdirplus', 'bool', READDIRPLUS],
  ['experimental-o-direct', 'file-system.experimental-o-direct', 'bool', KERNEL_READER],
  ['fuse-max-request-size-kb', 'file-system.fuse-max-request-size-kb', 'int', KERNEL_REQUESTS],
  ['fuse-max-write-size-kb', 'file-system.fuse-max-write-size-kb', 'int', KERNEL_REQUESTS],
  ['inactive-mrd-cache-size', 'file-system.inactive-mrd-cache-size', 'int', READER],
  ['kernel-params-file', 'file-system.kernel-params-file', 'string', KERNEL_REQUESTS],
  ['strong-consistency-on-open', 'file-system.strong-consistency-on-open', 'bool', CONSISTENCY],
  ['enable-http-dns-cache', 'gcs-connection.enable-http-dns-cache', 'bool', CONNECTION],
  ['experimental-local-socket-address', 'gcs-connection.experimental-local-socket-address', 'string', CONNECTION],
  ['grpc-path-strategy', 'gcs-connection.grpc-path-strategy', 'string', GRPC],
  ['chunk-retry-deadline-secs', 'gcs-retries.chunk-retry-deadline-secs', 'int', UPLOAD_RETRIES],
  ['chunk-transfer-timeout-secs', 'gcs-retries.chunk-transfer-timeout-secs', 'int', UPLOAD_RETRIES],
  ['enable-mount-retries', 'gcs-retries.enable-mount-retries', 'bool', MOUNT_RETRIES],
  ['enable-empty-managed-folders', 'list.enable-empty-managed-folders', 'bool', MANAGED],
  ['experimental-enable-otel-logging', 'logging.experimental-enable-otel-logging', 'bool', TELEMETRY],
  ['experimental-otel-logging-endpoint', 'logging.experimental-otel-logging-endpoint', 'string', TELEMETRY],
  ['experimental-otel-logging-project-id', 'logging.experimental-otel-logging-project-id', 'string', TELEMETRY],
  ['wire-log', 'logging.wire-log', 'string', TELEMETRY],
  ['machine-type', 'machine-type', 'string', AUTOCONFIG],
  ['experimental-enable-optimized-metadata-cache', 'metadata-cache.experimental-enable-optimized-metadata-cache', 'bool', METADATA],
  ['metrics-buffer-size', 'metrics.buffer-size', 'int', TELEMETRY],
  ['experimental-enable-grpc-metrics', 'metrics.experimental-enable-grpc-metrics', 'bool', GRPC],
  ['experimental-enable-otel-metrics', 'metrics.experimental-enable-otel-metrics', 'bool', TELEMETRY],
  ['experimental-otel-metrics-endpoint', 'metrics.experimental-otel-metrics-endpoint', 'string', TELEMETRY],
  ['experimental-otel-metrics-project-id', 'metrics.experimental-otel-metrics-project-id', 'string', TELEMETRY],
  ['metrics-use-new-names', 'metrics.use-new-names', 'bool', TELEMETRY],
  ['metrics-workers', 'metrics.workers', 'int', TELEMETRY],
  ['mount-id', 'mount-id', 'string', TELEMETRY],
  ['mrd-pool-size', 'mrd.pool-size', 'int', READER],
  ['read-block-size-mb', 'read.block-size-mb', 'int', READER],
  ['enable-grpc-read-checksums', 'read.enable-grpc-read-checksums', 'bool', GRPC],
  ['read-inactive-stream-timeout', 'read.inactive-stream-timeout', 'duration', READER],
  ['read-max-blocks-per-handle', 'read.max-blocks-per-handle', 'int', READER],
  ['read-min-blocks-per-handle', 'read.min-blocks-per-handle', 'int', READER],
  ['read-random-seek-threshold', 'read.random-seek-threshold', 'int', READER],
  ['read-start-blocks-per-handle', 'read.start-blocks-per-handle', 'int', READER],
  ['trace-exporters', 'trace.exporters', 'string-list', TELEMETRY],
  ['trace-project-id', 'trace.project-id', 'string', TELEMETRY],
  ['trace-sampling-ratio', 'trace.sampling-ratio', 'float', TELEMETRY],
  ['workload-insight-forward-merge-threshold-mb', 'workload-insight.forward-merge-threshold-mb', 'int', TELEMETRY],
  ['workload-insight-output-file', 'workload-insight.output-file', 'string', TELEMETRY],
  ['visualize-workload-insight', 'workload-insight.visualize', 'bool', TELEMETRY],
  ['enable-rapid-writes', 'write.enable-rapid-writes', 'bool', RAPID],
  ['finalize-file-for-rapid', 'write.finalize-file-for-rapid', 'bool', RAPID],
];

const DEFAULT_OF: Record<ParamType, unknown> = { bool: false, int: 0, float: 0, string: '', duration: 0, octal: 0, 'string-list': [] };

export const GCSFUSE_ONLY_PARAMS: readonly Param[] = ROWS.map(([flag, configKey, type, help]) => ({
  flag,
  configKey,
  type,
  default: DEFAULT_OF[type],
  help,
  group: 'Compatibility',
  effect: 'ignored',
}));
