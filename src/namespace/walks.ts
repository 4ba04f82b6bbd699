import type { ObjectMeta } from '../gcs/object-client.js';
import type { Entry } from './entry.js';
import { compareKeys, Listing } from './listing.js';
import { ListingRun } from './listing-run.js';
import { componentProblem } from './names.js';
import type { ListingDeps } from './listing-deps.js';
import { RangeLister, type FetchedPage } from './range-lister.js';

/**
 * Entries a readdir walk lists beyond what its reader has read (complete folders not read yet, and
 * folders it is still in the middle of): the walk pauses there, so `ls a; ls a/b` at the top of a large
 * bucket costs a few dozen requests, not the bucket, even where one folder below holds millions of objects.
 */
const WALK_AHEAD_ENTRIES = 50_000;

/**
 * What a lookup a lookup walk answers from what it has already listed earns towards its background
 * pages: one page per ten such lookups, so listing ahead of readers never costs more than a tenth of
 * the lookups it saves (a reader that jumps about earns little, and pays one request per lookup).
 */
const CREDIT_PER_HIT = 0.1;
/** Background pages a lookup walk may save up: readers that hit for a long time do not buy a burst. */
const MAX_CREDITS = 4;

export interface WalkDeps extends ListingDeps {
  /** Background entries at most (--metadata-prefetch-entries-limit). */
  entriesLimit: number;
}

/** A folder seen by the walk but not complete yet: its entries so far, and the page's new ones. */
interface OpenFolder {
  listing: Listing;
  keys: string[];
  metas: (ObjectMeta | null)[];
}

/**
 * A subtree listed flat (no delimiter, so one page holds the objects of many folders at every depth),
 * filling every folder's listing as its key range completes. Two kinds:
 * - 'readdir': a walk (find, du, os.walk, rsync) reads a folder and then each of its sub-folders; the
 *   subtree is listed in the background in parallel parts cut at its sub-folders, and pauses
 *   WALK_AHEAD_ENTRIES ahead of its reader.
 * - 'lookup': lookups below a folder nobody listed (a Zarr reader opening chunk after chunk of
 *   `t2m/c/T/Y/X`): each lookup that the listed ranges do not answer starts a part at its own key, whose
 *   one small page answers it, and the files and folders after it, at every depth, for the lookups that
 *   follow; parts before it are never listed for it. A part goes on in the background only as far as
 *   lookups answered without a request pay for it (CREDIT_PER_HIT).
 */
export class Walk {
  readonly lister: RangeLister;
  readonly startedAt: number;
  readonly expiresAt: number;
  private readonly prefix: string;
  private readonly open = new Map<string, OpenFolder>();
  private openEntries = 0;
  /** Complete folders a readdir walk's reader has not read yet. */
  private readonly unread = new Map<string, Listing>();
  private unreadEntries = 0;
  /** Complete folders (relative to root): one not cached any more was evicted, not empty. */
  private readonly completed = new Set<string>();
  private credits = 0;
  /** Started at the folder's first name: its first page is the whole folder, or most of it. */
  private whole = false;

  private constructor(
    private readonly deps: WalkDeps,
    readonly kind: 'readdir' | 'lookup',
    readonly root: string,
  ) {
    this.startedAt = deps.cache.now();
    this.expiresAt = this.startedAt + deps.ttlMs;
    this.prefix = deps.names.dirPrefix(root);
    const lookup = kind === 'lookup';
    this.lister = new RangeLister({
      fetch: (start, end, token, small) => this.flatPage(start, end, token, small),
      onPage: (keys, metas) => this.fill(keys, metas),
      workers: deps.workers,
      // A lookup walk goes where lookups are: one part each, never cut into more.
      maxParallel: lookup ? 1 : deps.maxParallel,
      delimited: false,
      lazy: lookup,
      paused: lookup
        ? () => this.credits < 1 || this.lister.count >= deps.entriesLimit || this.openEntries > WALK_AHEAD_ENTRIES
        : () => this.unreadEntries + this.openEntries > WALK_AHEAD_ENTRIES,
      onBackgroundPage: () => {
        if (!lookup) return;
        this.credits--;
        deps.metrics.inc('meta_lookup_pages_ahead');
      },
    });
  }

  /** A readdir walk of `root`, whose sub-folders `folders` are where its parts start. */
  static forReaddir(deps: WalkDeps, root: string, folders: string[]): Walk {
    const walk = new Walk(deps, 'readdir', root);
    // Cut at sub-folders, evenly: ten parts of ten folders each rather than a part (a request) per folder.
    const sorted = folders.map((f) => `${f}/`).sort(compareKeys);
    const splits: string[] = [];
    for (let k = 1; k < deps.maxParallel && k < sorted.length; k++) splits.push(sorted[Math.floor((k * sorted.length) / deps.maxParallel)]!);
    deps.metrics.inc('meta_walks');
    walk.lister.start('', false, splits);
    return walk;
  }

  /** A lookup walk of `root`, started by a lookup of `base` in it (its first page starts there). */
  static forLookup(deps: WalkDeps, root: string, base: string): Walk {
    const walk = new Walk(deps, 'lookup', root);
    walk.whole = base === '';
    deps.metrics.inc('meta_lookup_walks');
    walk.lister.start(base, false);
    return walk;
  }

  live(now: number): boolean {
    return !this.lister.failed && now <= this.expiresAt && !(this.kind === 'readdir' && this.lister.done);
  }

  /** Whether the walk answers for the folder at `path`: a readdir walk below its root, a lookup walk at it too. */
  holds(path: string): boolean {
    if (path === this.root) return this.kind === 'lookup';
    return this.root === '/' ? path !== '/' : path.startsWith(`${this.root}/`);
  }

  /** `path` relative to the root ('' for the root itself). */
  private rel(path: string): string {
    if (path === this.root) return '';
    return this.root === '/' ? path.slice(1) : path.slice(this.root.length + 1);
  }

  private pathOf(rel: string): string {
    if (rel === '') return this.root;
    return this.root === '/' ? `/${rel}` : `${this.root}/${rel}`;
  }

  // ---------------------------------------------------------------- readdir walks

  /**
   * Waits for the walk to have listed all of `path`, and returns its listing; null when the walk no
   * longer holds it (read once already and since gone from the cache: evicted, forgotten, or too large
   * to keep), so the caller lists the folder itself. Never an empty stand-in: that would be a folder
   * shown empty and every name in it "missing".
   */
  async folder(path: string): Promise<Listing | null> {
    const rel = this.rel(path);
    const done = this.deps.cache.listing(path) ?? this.unread.get(rel);
    if (!done) await this.lister.coverRange(`${rel}/`, `${rel}0`);
    const listing = this.unread.get(rel) ?? this.deps.cache.listing(path) ?? null;
    if (listing) this.read(rel, listing);
    return listing;
  }

  /** Tells the walk its reader has read the folder at `path` (it lists on once its reader catches up). */
  sawReaddir(path: string, listing: Listing): void {
    this.read(this.rel(path), listing);
  }

  private read(rel: string, listing: Listing): void {
    if (!this.unread.delete(rel)) return;
    this.unreadEntries -= listing.count;
    this.lister.resume();
  }

  // ---------------------------------------------------------------- lookup walks

  /**
   * What `base` in the folder at `folder` is, from the ranges listed, listing what it needs first: the
   * key itself, and whether any key lies under `key/` (the first one there, not the subtree). `entry`
   * null: no such name as of `listedAt` (the caller checks the negative TTL): the walk's start when the
   * ranges were listed already, the time of this call when it had to list them; undefined: the walk
   * cannot tell (the folder it completed is no longer cached), ask GCS.
   */
  async lookup(folder: string, base: string): Promise<{ entry: Entry | null | undefined; listedAt: number }> {
    // A walk started at its folder's first name (a small folder listed whole) answers from that page:
    // a part cut at this name meanwhile would be a second request for names the page holds.
    if (this.whole) await this.lister.cover('');
    const rel = this.rel(folder);
    const key = rel === '' ? base : `${rel}/${base}`;
    const dirKnown = () => this.entryIn(folder, rel, base)?.kind === 'dir';
    const known = () => this.lister.covers(key) && (dirKnown() || this.lister.coversRange(`${key}/`, `${key}0`));
    this.earn();
    let listedAt = this.startedAt;
    if (known()) {
      this.deps.metrics.inc('meta_list_hits');
    } else {
      // Pages listed from now on (or in flight: asked at most one round trip before) say what is there now.
      listedAt = this.deps.cache.now();
      this.deps.metrics.inc('meta_prefetch_joined');
      await this.lister.cover(key);
      await this.lister.coverUntil(`${key}/`, `${key}0`, dirKnown);
    }
    return { entry: this.entryIn(folder, rel, base), listedAt };
  }

  /** What the walk holds of the folder at `folder`, complete or not (names in key order); null if nothing. */
  held(folder: string): Listing | null {
    const rel = this.rel(folder);
    return this.open.get(rel)?.listing ?? (this.completed.has(rel) ? (this.deps.cache.peekListing(folder) ?? null) : null);
  }

  /** The entry for `base` among what the walk has of folder `rel`: open, complete and cached, or never seen. */
  private entryIn(folder: string, rel: string, base: string): Entry | null | undefined {
    const open = this.open.get(rel);
    if (open) return open.listing.get(base);
    if (this.completed.has(rel)) {
      const listing = this.deps.cache.peekListing(folder);
      return listing ? listing.get(base) : undefined;
    }
    // No key under `rel/` in the ranges listed, and those hold `base`'s: nothing there.
    return null;
  }

  private earn(): void {
    this.credits = Math.min(MAX_CREDITS, this.credits + CREDIT_PER_HIT);
    if (this.credits >= 1) this.lister.resume();
  }

  // ---------------------------------------------------------------- listing

  /** One flat page of the subtree: every object, keys relative to the root folder. */
  private async flatPage(start: string, end: string | null, pageToken?: string, small = false): Promise<FetchedPage> {
    const page = await this.deps.client.list({
      prefix: this.prefix,
      maxResults: small ? this.deps.pages.lookup : this.deps.pages.list,
      ...(start ? { startOffset: this.prefix + start } : {}),
      ...(end !== null ? { endOffset: this.prefix + end } : {}),
      ...(pageToken ? { pageToken } : {}),
    });
    const keys = page.objects.map((o) => o.name.slice(this.prefix.length));
    return { keys, metas: page.objects, lastKey: keys.at(-1) ?? null, more: page.nextPageToken !== null, nextPageToken: page.nextPageToken };
  }

  /**
   * Sorts a flat page into the folders it passes through: `a/b/c` is the file `c` of folder `a/b` and
   * the directory `b` of folder `a`. In name order each folder's entries arrive in its own key order.
   * Then every open folder whose key range the walk has now covered is complete, and cached.
   */
  private fill(keys: readonly string[], metas: readonly (ObjectMeta | null)[]): void {
    const touched = new Set<string>();
    const folderOf = (rel: string): OpenFolder => {
      let f = this.open.get(rel);
      if (!f) {
        f = { listing: new Listing(rel === '' ? this.prefix : `${this.prefix}${rel}/`), keys: [], metas: [] };
        f.listing.listedAt = this.startedAt;
        this.open.set(rel, f);
      }
      touched.add(rel);
      return f;
    };
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i]!;
      const parts = key.split('/');
      let folder = '';
      folderOf('');
      for (let j = 0; j < parts.length; j++) {
        const c = parts[j]!;
        const last = j === parts.length - 1;
        if (last && c === '') break; // a placeholder object: the folder itself
        if (componentProblem(c) !== null) {
          this.deps.visible(this.prefix + key, c);
          break;
        }
        const f = folderOf(folder);
        const entryKey = last ? c : `${c}/`;
        if (f.keys.at(-1) !== entryKey) {
          f.keys.push(entryKey);
          f.metas.push(last ? metas[i]! : null);
        }
        folder = folder === '' ? c : `${folder}/${c}`;
        if (!last) folderOf(folder);
      }
    }
    for (const rel of touched) {
      const f = this.open.get(rel)!;
      if (f.keys.length > 0) {
        const before = f.listing.count;
        f.listing.add(ListingRun.of(f.keys, f.metas));
        this.openEntries += f.listing.count - before;
      }
      f.keys = [];
      f.metas = [];
    }
    for (const [rel, f] of this.open) {
      if (!(rel === '' ? this.lister.coversRange('', null) || this.lister.done : this.lister.coversRange(`${rel}/`, `${rel}0`))) continue;
      this.complete(rel, f.listing);
    }
  }

  private complete(rel: string, listing: Listing): void {
    this.open.delete(rel);
    this.openEntries -= listing.count;
    listing.compact((name) => this.deps.hideConflict(name));
    const path = this.pathOf(rel);
    this.deps.cache.rememberListing(path, listing);
    this.deps.listed(path, listing);
    this.deps.metrics.inc('meta_walk_folders');
    if (this.kind === 'lookup') {
      this.completed.add(rel);
    } else if (rel !== '') {
      this.unread.set(rel, listing);
      this.unreadEntries += listing.count;
    }
  }
}
