import type { ObjectMeta } from '../gcs/object-client.js';
import type { Entry } from './entry.js';
import type { ListingDeps } from './listing-deps.js';
import { compareKeys, Listing } from './listing.js';
import { ListingRun } from './listing-run.js';
import { RangeLister, type FetchedPage } from './range-lister.js';

/** A folder being listed: the entries so far, and which key ranges they answer for. */
export interface FolderJob {
  listing: Listing;
  lister: RangeLister;
  expiresAt: number;
  /** When it started, by the cache's clock: its "no such name" answers last the negative TTL from then. */
  startedAt: number;
}

export type FolderListingDeps = ListingDeps;

/**
 * The delimited listings of single folders in progress (a readdir's), one per folder, which lookups in
 * the folder join while they run.
 */
export class FolderListings {
  private readonly jobs = new Map<string, FolderJob>();

  constructor(private readonly deps: FolderListingDeps) {}

  /** Listings in progress. */
  get size(): number {
    return this.jobs.size;
  }

  /** Drops the folder's listing in progress (its pages named generations that are gone). */
  forget(folder: string): void {
    this.jobs.delete(folder);
  }

  /** The folder's listing in progress, unless it is older than the TTL. */
  liveJob(folder: string): FolderJob | undefined {
    const job = this.jobs.get(folder);
    if (!job) return undefined;
    if (job.lister.failed || this.deps.cache.now() > job.expiresAt) {
      this.jobs.delete(folder);
      return undefined;
    }
    return job;
  }

  /** Lists all of the folder at `path` now (a readdir waits), in parts in parallel where it is large. */
  startJob(path: string): FolderJob {
    const prefix = this.deps.names.dirPrefix(path);
    const listing = new Listing(prefix);
    const startedAt = this.deps.cache.now();
    listing.listedAt = startedAt;
    const lister: RangeLister = new RangeLister({
      fetch: (start, end, token, small) => this.folderPage(prefix, start, end, token, small),
      onPage: (keys, metas) => listing.add(ListingRun.of(keys, metas)),
      workers: this.deps.workers,
      maxParallel: this.deps.maxParallel,
      delimited: true,
    });
    const job: FolderJob = { listing, lister, expiresAt: startedAt + this.deps.ttlMs, startedAt };
    this.jobs.set(path, job);
    lister.start('', true);
    lister.completion.then(
      () => {
        listing.compact((name) => this.deps.hideConflict(name));
        if (this.jobs.get(path) === job) this.jobs.delete(path);
        this.deps.listed(path, listing);
      },
      () => {
        if (this.jobs.get(path) === job) this.jobs.delete(path);
      },
    );
    return job;
  }

  /**
   * The answer for `base` from a listing in progress: at once when the listed ranges already hold it,
   * else after the page that starts at it. Undefined when the listing failed (the caller asks GCS itself).
   */
  async fromJob(job: FolderJob, base: string): Promise<Entry | null | undefined> {
    try {
      const already = job.lister.covers(base) && job.lister.covers(`${base}/`);
      await job.lister.cover(base);
      if (!job.lister.covers(`${base}/`)) await job.lister.cover(`${base}/`);
      if (already) this.deps.metrics.inc('meta_list_hits');
      else this.deps.metrics.inc('meta_prefetch_joined');
    } catch {
      return undefined;
    }
    const entry = job.listing.get(base);
    // Too old to say "no such name" (a prefetch that stopped at its entry limit long ago): ask GCS.
    if (!entry && !this.deps.cache.missingTrusted(job.startedAt)) return undefined;
    return entry;
  }

  /** One page of a folder with delimiter '/': objects and sub-folders merged in key order. */
  private async folderPage(prefix: string, start: string, end: string | null, pageToken?: string, small = false): Promise<FetchedPage> {
    const page = await this.deps.client.list({
      prefix,
      delimiter: '/',
      maxResults: small ? this.deps.pages.lookup : this.deps.pages.list,
      ...(start ? { startOffset: prefix + start } : {}),
      ...(end !== null ? { endOffset: prefix + end } : {}),
      ...(pageToken ? { pageToken } : {}),
    });
    const keys: string[] = [];
    const metas: (ObjectMeta | null)[] = [];
    let lastKey: string | null = null;
    let i = 0;
    let j = 0;
    const objects = page.objects;
    const prefixes = page.prefixes;
    while (i < objects.length || j < prefixes.length) {
      const o = objects[i];
      const p = prefixes[j];
      const objectKey = o ? o.name.slice(prefix.length) : null;
      const prefixKey = p !== undefined ? p.slice(prefix.length) : null;
      if (objectKey !== null && (prefixKey === null || compareKeys(objectKey, prefixKey) <= 0)) {
        i++;
        lastKey = objectKey;
        // The folder's own placeholder object is the folder, not an entry of it.
        if (objectKey !== '' && this.deps.visible(o!.name, objectKey)) {
          keys.push(objectKey);
          metas.push(o!);
        }
      } else {
        j++;
        lastKey = prefixKey!;
        if (this.deps.visible(p!, prefixKey!.slice(0, -1))) {
          keys.push(prefixKey!);
          metas.push(null);
        }
      }
    }
    return { keys, metas, lastKey, more: page.nextPageToken !== null, nextPageToken: page.nextPageToken };
  }
}
