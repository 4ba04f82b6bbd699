import { LRUCache } from 'lru-cache';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { Metrics } from '../observe/metrics.js';
import type { SizeLimit as CacheBudget, Ttl as CacheTtl } from '../units.js';
import type { DirEntry, Entry } from './entry.js';


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
interface Listing {
  entries: readonly DirEntry[];
}
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
  if ('name' in v) n += META_BYTES + 2 * v.name.length;
  if ('entries' in v) for (const e of v.entries) n += 64 + 2 * e.name.length + (e.entry.kind === 'file' ? META_BYTES + 2 * e.entry.meta.name.length : 16);
  return n;
}
const typeBytes = (key: string): number => NODE_OVERHEAD + 2 * key.length + 8;

function lruFor<V extends {}>(budget: CacheBudget, defaultTtl: CacheTtl, size: (v: V, k: string) => number, clock?: { now(): number }): LRUCache<string, V> | null {
  if (budget.kind === 'off') return null;
  return new LRUCache<string, V>({
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

  constructor(cfg: MetadataCacheConfig, private readonly metrics: Metrics) {
    this.positiveTtl = ttlMs(cfg.ttl);
    this.negativeTtl = ttlMs(cfg.negativeTtl);
    this.stats = this.positiveTtl === null && this.negativeTtl === null ? null : lruFor<StatValue>(cfg.statBudget, cfg.ttl, statBytes, cfg.clock);
    this.types = this.positiveTtl === null ? null : lruFor<Kind>(cfg.typeBudget, cfg.ttl, (_v, k) => typeBytes(k), cfg.clock);
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
    if (listing && 'entries' in listing) {
      this.metrics.inc('meta_list_hits');
      const base = path.slice(path.lastIndexOf('/') + 1);
      return listing.entries.find((e) => e.name === base)?.entry ?? 'missing';
    }
    this.metrics.inc('meta_misses');
    return undefined;
  }

  /** Remembers what a lookup learnt: the entry, or null for "no such path". */
  remember(path: string, entry: Entry | null): void {
    if (entry === null) {
      this.types?.delete(path);
      if (this.negativeTtl === null) this.stats?.delete(`s:${path}`);
      else this.stats?.set(`s:${path}`, MISSING, { ttl: this.negativeTtl });
      return;
    }
    if (this.positiveTtl === null) return;
    this.types?.set(path, entry.kind);
    if (entry.kind === 'file') this.stats?.set(`s:${path}`, entry.meta, { ttl: this.positiveTtl });
    else this.stats?.delete(`s:${path}`);
  }

  /** Drops everything known about `path`, including its parent's listing, which names it too. */
  forget(path: string, parent: string): void {
    this.types?.delete(path);
    this.stats?.delete(`s:${path}`);
    this.stats?.delete(`l:${parent}`);
  }

  listing(path: string): readonly DirEntry[] | undefined {
    const hit = this.stats?.get(`l:${path}`);
    if (hit && 'entries' in hit) {
      this.metrics.inc('meta_list_hits');
      return hit.entries;
    }
    this.metrics.inc('meta_list_misses');
    return undefined;
  }

  /**
   * Remembers a directory's entries, and each entry's type and metadata, so `ls -l` costs only the
   * listing. Returns false when the listing itself could not be kept (caching off, or larger than the
   * stat budget allows for one entry), so callers do not count on it answering later lookups.
   */
  rememberListing(path: string, entries: readonly DirEntry[]): boolean {
    if (this.positiveTtl === null || !this.stats) return false;
    this.stats.set(`l:${path}`, { entries }, { ttl: this.positiveTtl });
    const base = path === '/' ? '' : path;
    for (const e of entries) this.remember(`${base}/${e.name}`, e.entry);
    return this.stats.has(`l:${path}`);
  }

  /** Bytes in use by each cache, for stats and tests. */
  usage(): { statBytes: number; typeBytes: number } {
    return { statBytes: this.stats?.calculatedSize ?? 0, typeBytes: this.types?.calculatedSize ?? 0 };
  }
}
