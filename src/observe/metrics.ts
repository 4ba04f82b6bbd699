/**
 * The catalogue of counters, in one place. Every layer counts through this; `gcsmount stats` and (later)
 * Prometheus read snapshots of it. Counting is an object-property increment: cheap when nobody looks.
 */
export const COUNTERS = {
  gcs_requests_bucket: 'GCS bucket metadata requests',
  gcs_requests_list: 'GCS objects.list requests',
  gcs_requests_metadata: 'GCS object metadata requests',
  gcs_requests_media: 'GCS media (data) requests',
  gcs_media_bytes: 'bytes received in media responses',
  gcs_retries: 'GCS requests retried',
  gcs_throttled: 'GCS responses with status 429',
  gcs_errors: 'GCS requests that failed for good',
  fuse_getattr: 'FUSE getattr operations',
  fuse_readdir: 'FUSE readdir operations',
  fuse_open: 'FUSE open operations',
  fuse_read: 'FUSE read operations',
  fuse_read_bytes: 'bytes returned by FUSE reads',
  fuse_errors: 'FUSE operations answered with an error',
  meta_stat_hits: 'lookups answered by the stat cache',
  meta_type_hits: 'lookups answered by the type cache (directories)',
  meta_negative_hits: 'lookups answered by the negative cache',
  meta_list_hits: 'lookups and readdirs answered by a cached listing',
  meta_list_misses: 'readdirs that had to list GCS',
  meta_misses: 'lookups that had to ask GCS',
  names_skipped: 'object names that cannot be paths and were hidden',
} as const;

export type CounterName = keyof typeof COUNTERS;

export class Metrics {
  private readonly values: Record<CounterName, number>;
  private readonly startedAt = Date.now();

  constructor() {
    this.values = Object.fromEntries(Object.keys(COUNTERS).map((k) => [k, 0])) as Record<CounterName, number>;
  }

  inc(name: CounterName, by = 1): void {
    this.values[name] += by;
  }

  get(name: CounterName): number {
    return this.values[name];
  }

  snapshot(): { uptimeSeconds: number; counters: Record<CounterName, number> } {
    return { uptimeSeconds: (Date.now() - this.startedAt) / 1000, counters: { ...this.values } };
  }
}
