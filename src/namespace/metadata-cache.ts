import { LRUCache } from 'lru-cache';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { Metrics } from '../observe/metrics.js';
import type { SizeLimit as CacheBudget, Ttl as CacheTtl } from '../units.js';
import type { Entry } from './entry.js';
import { Listing } from './listing.js';
import { baseName } from './paths.js';


export interface MetadataCacheConfig {
  /** How long a positive answer (stat, type, listing) is trusted. */
  ttl: CacheTtl;
  /** How long "no such path" is trusted. */
  negativeTtl: CacheTtl;
  /** Bytes for object metadata, negative entries and listings (gcsfuse's --stat-cache-max-size-mb). */
  statBudget: CacheBudget;
  /** Bytes for path -> file/directory (gcsfuse's --type-cache-max-size-mb). */
  typeBudget: CacheBudget;
  /** Milliseconds, monotonic; injected so TTLs can be tested without sleeping. */
  clock?: { now(): number };
}

type Kind = 'file' | 'dir';
const MISSING = Object.freeze({ missing: true as const });
/** The stat cache holds, under tagged keys: `s:PATH` metadata or MISSING, `l:PATH` a directory listing. */
type StatValue = ObjectMeta | typeof MISSING | Listing;

/**
 * What an entry costs in memory, roughly: V8 strings take up to 2 bytes a character, and every LRU node,
 * Map slot and object header adds about a hundred more. Over-counting a little keeps the budget honest.
 */
const NODE_OVERHEAD = 120;
const META_BYTES = 200;
function statBytes(v: StatValue, key: string): number {
  let n = NODE_OVERHEAD + 2 * key.length;
  if (v instanceof Listing) n += v.bytes;
  else if ('name' in v) n += META_BYTES + 2 * v.name.length;
  return n;
}
const typeBytes = (key: string): number => NODE_OVERHEAD + 2 * key.length + 8;

function lruFor<V extends {}>(
  budget: CacheBudget,
  defaultTtl: CacheTtl,
  size: (v: V, k: string) => number,
  clock?: { now(): number },
  dispose?: (v: V) => void,
): LRUCache<string, V> | null {
  if (budget.kind === 'off') return null;
  return new LRUCache<string, V>({
    ...(dispose ? { dispose: (v: V) => dispose(v) } : {}),
    maxSize: budget.kind === 'bytes' ? budget.bytes : Number.MAX_SAFE_INTEGER,
    sizeCalculation: (v, k) => Math.max(1, size(v, k)),
    ttl: ttlMs(defaultTtl) ?? 0,
    // An expired entry is a miss, never an answer: a TTL is a promise about staleness.
    allowStale: false,
    updateAgeOnGet: false,
    // Read the clock on every check: lru-cache otherwise reuses one reading for a timer tick.
    ttlResolution: 0,
    ...(clock ? { perf: clock } : {}),
  });
}

/** lru-cache's per-entry ttl: 0 means "no expiry"; null here means "do not cache at all". */
function ttlMs(ttl: CacheTtl): number | null {
  if (ttl.kind === 'off') return null;
  return ttl.kind === 'forever' ? 0 : ttl.ms;
}

/** What the caches know of a path: an answer, "known missing", or nothing. */
export type CachedAnswer = Entry | 'missing' | undefined;

/**
 * The daemon's memory of GCS metadata, by mount path: the stat cache (object metadata, "no such path"
 * entries with their own TTL, and directory listings, all in one byte budget since listings hold the same
 * metadata) and the type cache (file or directory).
 */
export class MetadataCache {
  private readonly stats: LRUCache<string, StatValue> | null;
  private readonly types: LRUCache<string, Kind> | null;
  private readonly positiveTtl: number | null;
  private readonly negativeTtl: number | null;
  private readonly clock: { now(): number };
  /** Listings held in the stat cache: folders, their entries, and their bytes. */
  private listings = { folders: 0, entries: 0, bytes: 0 };
  /** Bytes one listing may take: the whole stat budget (a larger one is never kept, so never thrashed). */
  readonly listingBudget: number;

  constructor(cfg: MetadataCacheConfig, private readonly metrics: Metrics) {
    this.positiveTtl = ttlMs(cfg.ttl);
    this.negativeTtl = ttlMs(cfg.negativeTtl);
    this.clock = cfg.clock ?? performance;
    const forget = (v: StatValue): void => {
      if (!(v instanceof Listing)) return;
      this.listings.folders--;
      this.listings.entries -= v.count;
      this.listings.bytes -= v.bytes;
    };
    this.stats = this.positiveTtl === null && this.negativeTtl === null ? null : lruFor<StatValue>(cfg.statBudget, cfg.ttl, statBytes, cfg.clock, forget);
    this.types = this.positiveTtl === null ? null : lruFor<Kind>(cfg.typeBudget, cfg.ttl, (_v, k) => typeBytes(k), cfg.clock);
    this.listingBudget = this.stats && this.positiveTtl !== null ? (cfg.statBudget.kind === 'bytes' ? cfg.statBudget.bytes : Number.POSITIVE_INFINITY) : 0;
    metrics.setGauge('meta_stat_entries', () => (this.stats?.size ?? 0) - this.listings.folders);
    metrics.setGauge('meta_stat_bytes', () => (this.stats?.calculatedSize ?? 0) - this.listings.bytes);
    metrics.setGauge('meta_listing_folders', () => this.listings.folders);
    metrics.setGauge('meta_listing_entries', () => this.listings.entries);
    metrics.setGauge('meta_listing_bytes', () => this.listings.bytes);
    metrics.setGauge('meta_type_entries', () => this.types?.size ?? 0);
    metrics.setGauge('meta_type_bytes', () => this.types?.calculatedSize ?? 0);
    metrics.setGauge('meta_stat_limit_bytes', () => (cfg.statBudget.kind === 'bytes' ? cfg.statBudget.bytes : cfg.statBudget.kind === 'off' ? 0 : -1));
  }

  /** Whether listings can be kept at all (a positive TTL and a stat budget). */
  get keepsListings(): boolean {
    return this.listingBudget > 0;
  }

  /**
   * The cached answer for `path`. The type cache says "directory" alone; a file needs its metadata too.
   * Failing both, a cached listing of the parent directory answers for every name, present or not.
   */
  lookup(path: string, parent: string): CachedAnswer {
    const kind = this.types?.get(path);
    if (kind === 'dir') {
      this.metrics.inc('meta_type_hits');
      return { kind: 'dir', mtimeMs: null };
    }
    const stat = this.stats?.get(`s:${path}`);
    if (stat && 'name' in stat) {
      this.metrics.inc('meta_stat_hits');
      return { kind: 'file', meta: stat };
    }
    if (stat && 'missing' in stat) {
      this.metrics.inc('meta_negative_hits');
      return 'missing';
    }
    const listing = this.stats?.get(`l:${parent}`);
    if (listing instanceof Listing) {
      const entry = listing.get(baseName(path));
      if (entry || this.missingTrusted(listing.listedAt)) {
        this.metrics.inc('meta_list_hits');
        return entry ?? 'missing';
      }
    }
    this.metrics.inc('meta_misses');
    return undefined;
  }

  /** The clock TTLs are measured by (milliseconds, monotonic). */
  now(): number {
    return this.clock.now();
  }

  /**
   * Whether a listing taken at `listedAt` may still say "no such name": only within the negative TTL,
   * as a single "no such path" answer may. A listing answers for the names it shows for the whole TTL,
   * but an object created since must show up as soon as --metadata-cache-negative-ttl-secs promises.
   */
  missingTrusted(listedAt: number | null): boolean {
    if (this.negativeTtl === null || listedAt === null) return false;
    return this.negativeTtl === 0 || this.clock.now() - listedAt <= this.negativeTtl;
  }

  /**
   * What is left of `ttl` (the positive TTL unless given) for an answer asked for at `since` (0: for
   * ever), or null when nothing is: a TTL runs from the question, not the answer. Counted from the
   * answer, a listing whose page named a file before this mount removed it outlived the removal's own
   * record (kept a TTL from the change) by as long as the listing took, and the name came back.
   */
  private remaining(since: number, ttl = this.positiveTtl): number | null {
    if (ttl === null) return null;
    if (ttl === 0) return 0;
    const left = ttl - (this.clock.now() - since);
    return left > 0 ? left : null;
  }

  /**
   * Remembers what a lookup asked at `askedAt` learnt: the entry, or null for "no such path". Both TTLs
   * run from the question: a "no such path" asked before this mount created the path, and answered after,
   * would otherwise outlive the create's record (LocalChanges, kept a TTL from the change) by as long as
   * the request took, and hide the new file.
   */
  remember(path: string, entry: Entry | null, askedAt = this.clock.now()): void {
    if (entry === null) {
      this.types?.delete(path);
      const ttl = this.remaining(askedAt, this.negativeTtl);
      if (ttl === null) this.stats?.delete(`s:${path}`);
      else this.stats?.set(`s:${path}`, MISSING, { ttl });
      return;
    }
    const ttl = this.remaining(askedAt);
    if (ttl === null) return;
    this.types?.set(path, entry.kind, { ttl });
    if (entry.kind === 'file') this.stats?.set(`s:${path}`, entry.meta, { ttl });
    else this.stats?.delete(`s:${path}`);
  }

  /** Drops everything known about `path`, including its parent's listing, which names it too. */
  forget(path: string, parent: string): void {
    this.types?.delete(path);
    this.stats?.delete(`s:${path}`);
    this.stats?.delete(`l:${parent}`);
  }

  /** Whether a complete listing of `path` is held (no hit or miss counted). */
  hasListing(path: string): boolean {
    return this.stats?.peek(`l:${path}`) instanceof Listing;
  }

  /** Entries of the folder's listing held, or null when none is held (no hit counted, no LRU bump). */
  heldListingCount(path: string): number | null {
    const held = this.stats?.peek(`l:${path}`);
    return held instanceof Listing ? held.count : null;
  }

  /** The folder's complete listing if held (an LRU use, no hit or miss counted). */
  peekListing(path: string): Listing | undefined {
    const held = this.stats?.get(`l:${path}`);
    return held instanceof Listing ? held : undefined;
  }

  listing(path: string): Listing | undefined {
    const hit = this.stats?.get(`l:${path}`);
    if (hit instanceof Listing) {
      this.metrics.inc('meta_list_hits');
      return hit;
    }
    this.metrics.inc('meta_list_misses');
    return undefined;
  }

  /**
   * Keeps a complete directory listing; it answers every lookup in that folder (a binary search), so
   * entries are not copied into the per-path caches. Returns false when it could not be kept (caching
   * off, or larger than the whole stat budget): callers must not count on it answering later lookups.
   * Over the budget the least recently used entries go, whole folders at a time.
   */
  rememberListing(path: string, listing: Listing): boolean {
    if (this.positiveTtl === null || !this.stats) return false;
    // Not kept, and not allowed to push everything else out on its way through.
    if (statBytes(listing, `l:${path}`) > this.listingBudget) {
      this.stats.delete(`l:${path}`);
      return false;
    }
    listing.listedAt ??= this.clock.now();
    const ttl = this.remaining(listing.listedAt);
    if (ttl === null) {
      this.stats.delete(`l:${path}`);
      return false;
    }
    this.stats.set(`l:${path}`, listing, { ttl });
    if (!this.stats.has(`l:${path}`)) return false;
    this.listings.folders++;
    this.listings.entries += listing.count;
    this.listings.bytes += listing.bytes;
    return true;
  }

  /** Bytes in use by each cache, for stats and tests. */
  usage(): { statBytes: number; typeBytes: number; listingFolders: number; listingEntries: number; listingBytes: number } {
    return {
      statBytes: this.stats?.calculatedSize ?? 0,
      typeBytes: this.types?.calculatedSize ?? 0,
      listingFolders: this.listings.folders,
      listingEntries: this.listings.entries,
      listingBytes: this.listings.bytes,
    };
  }
}
