import { LRUCache } from 'lru-cache';
import type { ObjectClient } from '../gcs/object-client.js';
import type { OnceLog } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { Entry } from './entry.js';
import { FolderListings } from './folder-listing.js';
import { ListWorkers } from './list-workers.js';
import type { Listing } from './listing.js';
import type { MetadataCache } from './metadata-cache.js';
import { NameResolver } from './name-resolver.js';
import { componentProblem, type NameMapper } from './names.js';
import { baseName, childPath, parentPath } from './paths.js';
import { Walk, type WalkDeps } from './walks.js';

/** How many items a list page asks for. */
export interface ListPageSizes {
  /**
   * The one page a lookup asks for: large enough that it nearly always reaches the `name/` prefix,
   * small enough that a lookup never drags a big listing over the wire.
   */
  lookup: number;
  /** A page of a listing: GCS's largest. */
  list: number;
}

export const DEFAULT_PAGE_SIZES: ListPageSizes = { lookup: 100, list: 1000 };

/**
 * Without metadata prefetch: lookup misses in one directory after which the whole directory is listed
 * instead. A busy folder, a Zarr array's chunks read by 16 processes, would otherwise cost one round
 * trip per name (in parallel since libfuse3's parallel dirops, but a request each). One listing (a
 * request per 1,000 names) then answers every name, missing chunks included.
 */
const LIST_AFTER_MISSES = 2;

export interface MetadataPrefetchConfig {
  /** gcsfuse's --enable-metadata-prefetch: the first lookup in a folder lists it in the background. */
  enabled: boolean;
  /** Entries listed in the background per folder (--metadata-prefetch-entries-limit); Infinity = all. */
  entriesLimit: number;
  /** Background list requests at once, mount-wide (--metadata-prefetch-max-workers). */
  maxWorkers: number;
}

export const DEFAULT_METADATA_PREFETCH: MetadataPrefetchConfig = { enabled: true, entriesLimit: Number.POSITIVE_INFINITY, maxWorkers: 10 };

export interface NamespaceDeps {
  client: ObjectClient;
  names: NameMapper;
  cache: MetadataCache;
  /** How long a lookup-miss count, an "unlistable" mark or a listing in progress lasts: the metadata TTL (0: forever). */
  listTtlMs: number;
  prefetch?: MetadataPrefetchConfig;
  once: OnceLog;
  metrics: Metrics;
  /** Page sizes (tests make them small, so that few names make many pages and parts). */
  pageSizes?: ListPageSizes;
}

/** Told what the namespace learns from GCS (the FUSE layer drops what the kernel holds that changed). */
export interface NamespaceObserver {
  /** A complete listing of the folder at `path`, fresh from GCS. */
  listed(path: string, listing: Listing): void;
  /** A fresh answer for one path from GCS (null: no such path). */
  resolved(path: string, entry: Entry | null): void;
}

/** Resolves paths to objects and prefixes, the way a user coming from gcsfuse with --implicit-dirs expects. */
export class Namespace {
  private readonly lookups = new Map<string, Promise<Entry | null>>();
  private readonly listings = new Map<string, Promise<Listing>>();
  /** Lookup misses per directory, and directories whose listing is too large to keep: both short-lived. */
  private readonly misses: LRUCache<string, number>;
  private readonly unlistable: LRUCache<string, true>;
  /** Folders whose readdir was asked for lately: a readdir of one of their sub-folders is a walk. */
  private readonly readdirs: LRUCache<string, true>;
  private readonly folders: FolderListings;
  private readonly resolver: NameResolver;
  private walks: Walk[] = [];
  private readonly workers: ListWorkers;
  private readonly prefetch: MetadataPrefetchConfig;
  private readonly ttl: number;
  private observer: NamespaceObserver | null = null;
  private readonly pages: ListPageSizes;
  private readonly walkDeps: WalkDeps;

  constructor(private readonly deps: NamespaceDeps) {
    this.ttl = deps.listTtlMs > 0 ? deps.listTtlMs : 60_000;
    this.misses = new LRUCache({ max: 10_000, ttl: this.ttl });
    this.unlistable = new LRUCache({ max: 10_000, ttl: this.ttl });
    this.readdirs = new LRUCache({ max: 10_000, ttl: this.ttl });
    this.prefetch = deps.prefetch ?? DEFAULT_METADATA_PREFETCH;
    this.pages = deps.pageSizes ?? DEFAULT_PAGE_SIZES;
    this.workers = new ListWorkers(Math.max(1, this.prefetch.maxWorkers));
    const shared = {
      client: deps.client,
      names: deps.names,
      cache: deps.cache,
      metrics: deps.metrics,
      workers: this.workers,
      pages: this.pages,
      ttlMs: this.ttl,
      maxParallel: Math.max(1, this.prefetch.maxWorkers),
      visible: (objectName: string, rel: string) => this.visible(objectName, rel),
      hideConflict: (objectName: string) => this.hideConflict(objectName),
    };
    this.walkDeps = { ...shared, entriesLimit: this.prefetch.entriesLimit, listed: (path, listing) => this.observer?.listed(path, listing) };
    this.folders = new FolderListings({
      ...shared,
      listed: (path, listing) => {
        if (!deps.cache.rememberListing(path, listing)) this.unlistable.set(path, true);
        this.observer?.listed(path, listing);
      },
    });
    this.resolver = new NameResolver({
      client: deps.client,
      names: deps.names,
      lookupPageSize: this.pages.lookup,
      hideConflict: (objectName) => this.hideConflict(objectName),
    });
    deps.metrics.setGauge('meta_listings_in_progress', () => this.folders.size);
    deps.metrics.setGauge('meta_walks_in_progress', () => this.walks.length);
    deps.metrics.setGauge('meta_list_workers_busy', () => this.workers.inFlight);
  }

  /** Tells `observer` of every fresh listing and lookup from now on. */
  observe(observer: NamespaceObserver): void {
    this.observer = observer;
  }

  /**
   * What `path` is, or null when it does not exist: from the caches while their TTLs hold, otherwise from
   * GCS, with concurrent lookups of one path sharing one request.
   */
  lookup(path: string): Promise<Entry | null> {
    if (path === '/') return Promise.resolve({ kind: 'dir', mtimeMs: null });
    const parent = parentPath(path);
    const cached = this.deps.cache.lookup(path, parent);
    if (cached !== undefined) return Promise.resolve(cached === 'missing' ? null : cached);
    return shared(this.lookups, path, async () => {
      const base = baseName(path);
      if (componentProblem(base) !== null) return null;
      const walk = this.walkHolding(parent, 'readdir');
      if (walk) {
        const listing = await walk.folder(parent).catch(() => null);
        const entry = listing?.get(base);
        if (entry) return entry;
        if (listing && this.deps.cache.missingTrusted(listing.listedAt)) return null;
      }
      // A readdir listing the folder now answers from its pages; else a lookup walk of the folder (or of
      // one above it) lists from this name on, and answers the names after it at every depth.
      const job = this.folders.liveJob(parent);
      if (job) {
        const answer = await this.folders.fromJob(job, base);
        if (answer !== undefined) return answer;
      } else if (this.prefetching(parent)) {
        const answer = await this.fromLookupWalk(parent, base);
        if (answer !== undefined) return answer;
      } else if (!this.prefetch.enabled && (this.listings.has(parent) || this.worthListing(parent))) {
        const fromListing = await this.lookupByListing(path, parent);
        if (fromListing !== undefined) return fromListing;
      }
      this.deps.metrics.inc('meta_misses');
      const askedAt = this.deps.cache.now();
      const entry = await this.resolver.resolve(path);
      this.deps.cache.remember(path, entry, askedAt);
      this.observer?.resolved(path, entry);
      return entry;
    });
  }

  /**
   * Every visible entry of the directory at `path`: a cached listing, the walk that is filling it, or all
   * of it from GCS, in parallel parts (a listing already in progress finishes at once).
   */
  readdir(path: string): Promise<Listing> {
    const cached = this.deps.cache.listing(path);
    if (cached) {
      this.sawReaddir(path, cached);
      return Promise.resolve(cached);
    }
    return shared(this.listings, path, async () => {
      const walk = this.walkHolding(path, 'readdir') ?? this.maybeStartWalk(path);
      if (walk) {
        const listing = await walk.folder(path).catch(() => null);
        if (listing) {
          this.sawReaddir(path, listing);
          return listing;
        }
      }
      const job = this.folders.liveJob(path) ?? this.folders.startJob(path);
      await job.lister.finish();
      this.sawReaddir(path, job.listing);
      return job.listing;
    });
  }

  /**
   * What is held of the folder at `path` without asking GCS: its complete listing, or the part a lookup
   * walk has listed so far (names in key order, the ones after each looked-up name). Null when nothing.
   */
  heldListing(path: string): Listing | null {
    return this.deps.cache.peekListing(path) ?? this.walkHolding(path, 'lookup')?.held(path) ?? null;
  }

  /**
   * Called when GCS no longer has the generation the caches named (the object was replaced or deleted
   * within the TTL): the next lookup asks GCS, so one failed read does not become a TTL of failures.
   */
  forget(path: string): void {
    const parent = parentPath(path);
    this.deps.cache.forget(path, parent);
    this.folders.forget(parent);
    // A walk's pages named the old generation too.
    this.walks = this.walks.filter((w) => !w.holds(parent) && w.root !== parent);
  }

  // ---------------------------------------------------------------- folder listings

  private prefetching(folder: string): boolean {
    return this.prefetch.enabled && this.deps.cache.keepsListings && !this.unlistable.has(folder);
  }

  // ---------------------------------------------------------------- walks

  /**
   * A walk (find, du, os.walk, rsync) reads a folder and then each of its sub-folders. The rule: a
   * readdir of a sub-folder of a folder that was itself read (readdir) within the TTL and has at least
   * two sub-folders lists that parent's whole subtree flat (no delimiter, 1,000 objects a request, in
   * parallel parts cut at its sub-folders), and fills every folder's listing from it.
   */
  private maybeStartWalk(path: string): Walk | null {
    if (!this.prefetch.enabled || !this.deps.cache.keepsListings || path === '/') return null;
    const parent = parentPath(path);
    if (!this.readdirs.has(parent)) return null;
    const parentListing = this.deps.cache.listing(parent);
    if (!parentListing) return null;
    const base = baseName(path);
    const folders = parentListing.dirNames();
    if (folders.length < 2 || !folders.includes(base)) return null;
    return this.addWalk(Walk.forReaddir(this.walkDeps, parent, folders));
  }

  private addWalk(walk: Walk): Walk {
    const now = this.deps.cache.now();
    this.walks = this.walks.filter((w) => w.live(now));
    this.walks.push(walk);
    return walk;
  }

  /** The live walk of this kind that answers for the folder at `path`. */
  private walkHolding(path: string, kind: Walk['kind']): Walk | null {
    const now = this.deps.cache.now();
    for (const w of this.walks) if (w.kind === kind && w.live(now) && w.holds(path)) return w;
    return null;
  }

  /**
   * The answer for `base` in `folder` from a lookup walk: the one that holds the folder, or a new one
   * rooted at it. A "no such name" from ranges listed too long ago (older than the negative TTL) gives
   * way to a new walk starting at this name (one request, whose page also answers the names after it);
   * one from a page listed for this lookup is trusted, and remembered as a lookup's would be (the kernel
   * asks again at once for a file being created: its LOOKUP, then its CREATE). Undefined: ask GCS.
   */
  private async fromLookupWalk(folder: string, base: string): Promise<Entry | null | undefined> {
    let walk = this.walkHolding(folder, 'lookup');
    for (let attempt = 0; attempt < 2; attempt++) {
      walk ??= this.addWalk(Walk.forLookup(this.walkDeps, folder, attempt === 0 ? base : this.relistFrom(folder, base)));
      const answer = await walk.lookup(folder, base).catch(() => undefined);
      if (answer === undefined) return undefined;
      if (answer.entry !== null) return answer.entry;
      if (this.deps.cache.missingTrusted(answer.listedAt)) {
        this.deps.cache.remember(childPath(folder, base), null, answer.listedAt);
        return null;
      }
      this.walks = this.walks.filter((w) => w !== walk);
      walk = null;
    }
    return undefined;
  }

  /**
   * Where a walk that replaces one too old to say "no such name" starts: at the name, unless the folder
   * is known to fit one page, which then lists it whole for the same one request (the kernel is told of
   * every object that changed in it since, not only that this name is still missing).
   */
  private relistFrom(folder: string, base: string): string {
    const held = this.deps.cache.heldListingCount(folder);
    return held !== null && held < this.pages.list ? '' : base;
  }

  /** Remembers a readdir (for the walk rule) and tells the walk its reader has read the folder. */
  private sawReaddir(path: string, listing: Listing): void {
    this.readdirs.set(path, true);
    this.walkHolding(path, 'readdir')?.sawReaddir(path, listing);
  }

  // ---------------------------------------------------------------- single names

  private worthListing(parent: string): boolean {
    if (this.unlistable.has(parent)) return false;
    const n = (this.misses.get(parent) ?? 0) + 1;
    this.misses.set(parent, n);
    return n >= LIST_AFTER_MISSES;
  }

  /** Answers from a (shared) listing of the parent, or undefined when it is too old to say "no such name". */
  private async lookupByListing(path: string, parent: string): Promise<Entry | null | undefined> {
    const listing = await this.readdir(parent);
    // Too large for the budget: later misses here go one name at a time.
    if (!this.deps.cache.hasListing(parent)) this.unlistable.set(parent, true);
    const entry = listing.get(baseName(path));
    if (!entry && !this.deps.cache.missingTrusted(listing.listedAt)) return undefined;
    this.misses.delete(parent);
    return entry;
  }

  private visible(objectName: string, rel: string): boolean {
    const problem = componentProblem(rel);
    if (problem === null) return true;
    this.deps.metrics.inc('names_skipped');
    this.deps.once.warn(`name:${objectName}`, { object: objectName, problem }, 'object name cannot be a path; hidden from the mount');
    return false;
  }

  private hideConflict(objectName: string): void {
    this.deps.metrics.inc('names_skipped');
    this.deps.once.warn(`conflict:${objectName}`, { object: objectName }, 'object name is also a directory prefix; the directory is shown and the object hidden');
  }
}

/** Runs `work` once per key at a time: callers that arrive while it runs get the same promise. */
function shared<T>(inflight: Map<string, Promise<T>>, key: string, work: () => Promise<T>): Promise<T> {
  const pending = inflight.get(key);
  if (pending) return pending;
  const p = work().finally(() => inflight.delete(key));
  inflight.set(key, p);
  return p;
}
