import type { ObjectClient } from '../gcs/object-client.js';
import type { Metrics } from '../observe/metrics.js';
import type { ListWorkers } from './list-workers.js';
import type { Listing } from './listing.js';
import type { MetadataCache } from './metadata-cache.js';
import type { NameMapper } from './names.js';

/** What a listing of GCS (a folder's for readdir, or a walk's) needs from the namespace that runs it. */
export interface ListingDeps {
  client: ObjectClient;
  names: NameMapper;
  cache: MetadataCache;
  metrics: Metrics;
  workers: ListWorkers;
  /** Items per page: a lookup's first page, and a listing's. */
  pages: { lookup: number; list: number };
  /** How long a listing in progress may answer lookups. */
  ttlMs: number;
  /** The most parts of one listing in progress at once. */
  maxParallel: number;
  /** Whether an object's name can be a path (logs it once when not). */
  visible(objectName: string, rel: string): boolean;
  /** A file hidden by a same-named directory (logged once). */
  hideConflict(objectName: string): void;
  /** A folder's complete listing, fresh from GCS. */
  listed(path: string, listing: Listing): void;
}
