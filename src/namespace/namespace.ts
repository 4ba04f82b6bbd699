import { LRUCache } from 'lru-cache';
import type { ListPage, ObjectClient, ObjectMeta } from '../gcs/object-client.js';
import type { OnceLog } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { DirEntry, Entry } from './entry.js';
import type { MetadataCache } from './metadata-cache.js';
import { componentProblem, type NameMapper } from './names.js';

/**
 * Items in the one list page a lookup asks for. Large enough that the page nearly always reaches the
 * `name/` prefix; small enough that a lookup never drags a big listing over the wire.
 */
const LOOKUP_PAGE = 100;

/**
 * Lookup misses in one directory after which the whole directory is listed instead. A busy folder, a
 * Zarr array's chunks read by 16 processes, would otherwise cost one round trip per name (in parallel
 * since libfuse3's parallel dirops, but a request each). One listing (a request per 1,000 names) then
 * answers every name, missing chunks included.
 */
const LIST_AFTER_MISSES = 2;

export interface NamespaceDeps {
  client: ObjectClient;
  names: NameMapper;
  cache: MetadataCache;
  /** How long a lookup-miss count or an "unlistable" mark lasts: the metadata TTL. */
  listTtlMs: number;
  once: OnceLog;
  metrics: Metrics;
}

/** Resolves paths to objects and prefixes, the way a user coming from gcsfuse with --implicit-dirs expects. */
export class Namespace {
  private readonly lookups = new Map<string, Promise<Entry | null>>();
  private readonly listings = new Map<string, Promise<readonly DirEntry[]>>();
  /** Lookup misses per directory, and directories whose listing is too large to keep: both short-lived. */
  private readonly misses: LRUCache<string, number>;
  private readonly unlistable: LRUCache<string, true>;

  constructor(private readonly deps: NamespaceDeps) {
    const ttl = deps.listTtlMs > 0 ? deps.listTtlMs : 60_000;
    this.misses = new LRUCache({ max: 10_000, ttl });
    this.unlistable = new LRUCache({ max: 10_000, ttl });
  }

  /**
   * What `path` is, or null when it does not exist: from the caches while their TTLs hold, otherwise from
   * GCS, with concurrent lookups of one path sharing one request.
   */
  lookup(path: string): Promise<Entry | null> {
    if (path === '/') return Promise.resolve({ kind: 'dir', mtimeMs: null });
    const parent = parentOf(path);
    const cached = this.deps.cache.lookup(path, parent);
    if (cached !== undefined) return Promise.resolve(cached === 'missing' ? null : cached);
    return shared(this.lookups, path, async () => {
      if (this.listings.has(parent) || this.worthListing(parent)) {
        const fromListing = await this.lookupByListing(path, parent);
        if (fromListing !== undefined) return fromListing;
      }
      const entry = await this.resolve(path);
      this.deps.cache.remember(path, entry);
      return entry;
    });
  }

  private worthListing(parent: string): boolean {
    if (this.unlistable.has(parent)) return false;
    const n = (this.misses.get(parent) ?? 0) + 1;
    this.misses.set(parent, n);
    return n >= LIST_AFTER_MISSES;
  }

  /** Answers from a (shared) listing of the parent, or undefined when the listing could not be kept. */
  private async lookupByListing(path: string, parent: string): Promise<Entry | null | undefined> {
    await this.readdir(parent);
    const answer = this.deps.cache.lookup(path, parent);
    if (answer === undefined) {
      this.unlistable.set(parent, true);
      return undefined;
    }
    this.misses.delete(parent);
    return answer === 'missing' ? null : answer;
  }

  /**
   * One objects.list with prefix=NAME and delimiter='/' answers both questions at once: the object NAME,
   * if it exists, is the very first item (no other name with that prefix sorts before it), and the
   * directory NAME/ shows up among `prefixes` (placeholder or implicit alike). A stat plus a list would
   * cost two requests for the same answer. Only when the page ends before the point where NAME/ would
   * sort (many siblings like NAME.0, NAME-1 in between) does a second, one-item list settle it.
   */
  private async resolve(path: string): Promise<Entry | null> {
    const base = path.slice(path.lastIndexOf('/') + 1);
    if (componentProblem(base) !== null) return null;
    const name = this.deps.names.objectName(path);
    const dirPrefix = `${name}/`;
    const page = await this.deps.client.list({ prefix: name, delimiter: '/', maxResults: LOOKUP_PAGE });
    const file = page.objects.find((o) => o.name === name) ?? null;
    let isDir = page.prefixes.includes(dirPrefix);
    if (!isDir && !pageReaches(page, dirPrefix)) {
      const more = await this.deps.client.list({ prefix: dirPrefix, delimiter: '/', maxResults: 1 });
      isDir = more.objects.length > 0 || more.prefixes.length > 0;
    }
    if (isDir) {
      if (file) this.hideConflict(file);
      return { kind: 'dir', mtimeMs: null };
    }
    return file ? { kind: 'file', meta: file } : null;
  }

  /**
   * Called when GCS no longer has the generation the caches named (the object was replaced or deleted
   * within the TTL): the next lookup asks GCS, so one failed read does not become a TTL of failures.
   */
  forget(path: string): void {
    this.deps.cache.forget(path, parentOf(path));
  }

  /** Every visible entry of the directory at `path`: one cached listing, or all pages of it from GCS. */
  readdir(path: string): Promise<readonly DirEntry[]> {
    const cached = this.deps.cache.listing(path);
    if (cached) return Promise.resolve(cached);
    return shared(this.listings, path, async () => {
      const entries = await this.list(path);
      if (!this.deps.cache.rememberListing(path, entries)) this.unlistable.set(path, true);
      return entries;
    });
  }

  private async list(path: string): Promise<DirEntry[]> {
    const prefix = this.deps.names.dirPrefix(path);
    const files = new Map<string, ObjectMeta>();
    const dirs = new Set<string>();
    let pageToken: string | undefined;
    do {
      const page = await this.deps.client.list({ prefix, delimiter: '/', ...(pageToken ? { pageToken } : {}) });
      for (const meta of page.objects) {
        const rel = meta.name.slice(prefix.length);
        if (rel === '') continue; // the directory's own placeholder object
        if (this.visible(meta.name, rel)) files.set(rel, meta);
      }
      for (const p of page.prefixes) {
        const rel = p.slice(prefix.length, -1);
        if (this.visible(p, rel)) dirs.add(rel);
      }
      pageToken = page.nextPageToken ?? undefined;
    } while (pageToken);

    const out: DirEntry[] = [];
    for (const rel of dirs) out.push({ name: rel, entry: { kind: 'dir', mtimeMs: null } });
    for (const [rel, meta] of files) {
      if (dirs.has(rel)) this.hideConflict(meta);
      else out.push({ name: rel, entry: { kind: 'file', meta } });
    }
    return out;
  }

  private visible(objectName: string, rel: string): boolean {
    const problem = componentProblem(rel);
    if (problem === null) return true;
    this.deps.metrics.inc('names_skipped');
    this.deps.once.warn(`name:${objectName}`, { object: objectName, problem }, 'object name cannot be a path; hidden from the mount');
    return false;
  }

  private hideConflict(meta: ObjectMeta): void {
    this.deps.metrics.inc('names_skipped');
    this.deps.once.warn(`conflict:${meta.name}`, { object: meta.name }, 'object name is also a directory prefix; the directory is shown and the object hidden');
  }
}

function parentOf(path: string): string {
  const i = path.lastIndexOf('/');
  return i <= 0 ? '/' : path.slice(0, i);
}

/** Runs `work` once per key at a time: callers that arrive while it runs get the same promise. */
function shared<T>(inflight: Map<string, Promise<T>>, key: string, work: () => Promise<T>): Promise<T> {
  const pending = inflight.get(key);
  if (pending) return pending;
  const p = work().finally(() => inflight.delete(key));
  inflight.set(key, p);
  return p;
}

/** True when the page shows everything that sorts before `bound` (so its absence from the page is proof). */
function pageReaches(page: ListPage, bound: string): boolean {
  if (page.nextPageToken === null) return true;
  const lastItem = page.objects.at(-1)?.name ?? '';
  const lastPrefix = page.prefixes.at(-1) ?? '';
  const last = lastItem > lastPrefix ? lastItem : lastPrefix;
  return last >= bound;
}
