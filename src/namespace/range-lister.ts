import type { ObjectMeta } from '../gcs/object-client.js';
import type { ListWorkers } from './list-workers.js';
import { compareKeys } from './listing.js';
import { splitPoints } from './split-points.js';

/** One page of a listing, keys relative to the listing's prefix. */
export interface FetchedPage {
  /** The entries to keep, in key order (hidden names already left out). */
  keys: string[];
  /** Per key: the object's metadata, or null for a directory. */
  metas: (ObjectMeta | null)[];
  /** The last key the page reached, shown or hidden; null for an empty page. */
  lastKey: string | null;
  /** GCS has more beyond lastKey (a nextPageToken). */
  more: boolean;
  /** GCS's token for the next page of the same request (same start and end), when it gave one. */
  nextPageToken?: string | null;
}

/**
 * Lists keys in [start, end) (end null: to the end), one page; with `pageToken`, the page after the one
 * that gave it, of the request with this same start and end. `small`: a short page will do (a lookup
 * waits on its first key only).
 */
export type PageFetcher = (start: string, end: string | null, pageToken?: string, small?: boolean) => Promise<FetchedPage>;

export interface RangeListerConfig {
  fetch: PageFetcher;
  /** Receives each page's new entries (in key order, within one part's range) once they count as covered. */
  onPage(keys: string[], metas: (ObjectMeta | null)[]): void;
  workers: ListWorkers;
  /** The most parts of this listing in progress at once (splits stop there). */
  maxParallel: number;
  /** Keys are single names (a listing with delimiter): split points never contain '/'. */
  delimited: boolean;
  /** Background pages wait while this says so (a walk far ahead of its reader, an entry limit). */
  paused?: () => boolean;
  /**
   * Parts nobody has asked for yet are not listed in the background: a part goes out only when a waiter
   * needs it, and goes on in the background only once it has had a page (a reader is there). A lookup's
   * listing must not pay for the names before the one looked up.
   */
  lazy?: boolean;
  /** Told as each background page starts (a page nobody waits on). */
  onBackgroundPage?: () => void;
}

/** A part [lo, hi) of the key range, listed page by page from lo; everything up to `cursor` is known. */
interface Segment {
  lo: string;
  hi: string | null;
  cursor: string | null;
  /**
   * The next page of the request the last page came from (its start, its end, GCS's token): a token goes
   * on exactly where that page ended, while a startOffset at the cursor would list the cursor's key again
   * and cost a page more for every 999 names. Only while the part still ends there: a part cut shorter
   * starts afresh at its cursor, rather than fetch pages of names that belong to the part after it.
   */
  resume: { start: string; end: string | null; token: string } | null;
  done: boolean;
  inFlight: boolean;
  queued: { promote(): void } | null;
  /**
   * Cut for a lookup: its first page is a short one. A lookup waits on one name, and a full page of
   * 1,000 costs GCS, the wire and the daemon ten times as much as that answer needs: 160 random opens
   * in a 100,000-name folder would otherwise fetch 160,000 entries, most of them again later.
   */
  forLookup: boolean;
}

/**
 * Full pages (GCS said there is more) a listing must have had before it is cut into parts: a folder of
 * up to this many pages costs exactly its pages, one after another, as a plain listing would (cut
 * parts cost a request or two each to find where they end, and guesses past the last name an empty
 * page each: 20 requests instead of 3 for 2,500 names). Larger folders lose that many round trips.
 */
const SPLIT_AFTER_FULL_PAGES = 3;

/** Someone waiting for keys [from, to) to be covered (a lookup: one key; a walk's reader: a folder). */
interface Waiter {
  from: string;
  to: string | null;
  covered: () => boolean;
  resolve: () => void;
  reject: (err: unknown) => void;
}

/**
 * Lists one key range (a folder, or a subtree without delimiter) as several parts in parallel, each
 * with startOffset/endOffset, never with page tokens, so a part can be cut short at any time: when a
 * lookup asks for a name the listing has not reached, the part holding it is split there and the new
 * part's first page, starting at that very name, answers the lookup and lists on. When a page comes back
 * with more and fewer than `maxParallel` parts are open, the rest of its part is split at points learnt
 * from the page (the characters its names use, at the positions where they vary), so a 100,000-name
 * folder is listed by ten parts at once instead of one request after another.
 */
export class RangeLister {
  private readonly segments: Segment[] = [];
  private waiters: Waiter[] = [];
  private urgent = false;
  private failure: unknown = null;
  private entries = 0;
  private fullPages = 0;
  private readonly finished: Promise<void>;
  private settle!: (err: unknown) => void;

  constructor(private readonly cfg: RangeListerConfig) {
    this.finished = new Promise<void>((resolve, reject) => {
      this.settle = (err) => (err ? reject(err) : resolve());
    });
    // A listing nobody waits on may fail unobserved; waiters see the failure their own way.
    this.finished.catch(() => undefined);
  }

  /** Entries received so far. */
  get count(): number {
    return this.entries;
  }

  get failed(): boolean {
    return this.failure !== null;
  }

  get done(): boolean {
    return this.segments.length > 0 && this.segments.every((s) => s.done);
  }

  /**
   * Starts listing at `from` (the first page, which a lookup of `from` waits on, goes out at once) and,
   * in the background, the part before it; `splits` are known boundaries to list in parallel from the
   * start (a walk's sub-folders). `urgent`: everything goes out at once (a readdir waits for it all).
   */
  start(from: string, urgent: boolean, splits: readonly string[] = []): void {
    this.urgent = urgent;
    const points = [...new Set(['', from, ...splits])].sort(compareKeys);
    for (let i = 0; i < points.length; i++) {
      const lo = points[i]!;
      this.segments.push({ lo, hi: points[i + 1] ?? null, cursor: null, resume: null, done: false, inFlight: false, queued: null, forLookup: !urgent && lo === from && from !== '' });
    }
    for (const s of this.segments) this.next(s, urgent || s.lo === from);
  }

  /** Whether every key up to and including `key` within its part is known (present or absent). */
  covers(key: string): boolean {
    const s = this.segmentOf(key);
    return s.done || (s.cursor !== null && compareKeys(key, s.cursor) <= 0);
  }

  /** Whether every key in [from, to) is known (to null: to the end). */
  coversRange(from: string, to: string | null): boolean {
    let i = this.indexOf(from);
    for (; i < this.segments.length; i++) {
      const s = this.segments[i]!;
      if (to !== null && compareKeys(s.lo, to) >= 0) break;
      if (s.done) continue;
      // Known up to the cursor only: the range must end at or before it (within this part).
      const end = to !== null && (s.hi === null || compareKeys(to, s.hi) < 0) ? to : s.hi;
      if (end === null || s.cursor === null || compareKeys(s.cursor, end) < 0) return false;
    }
    return true;
  }

  /**
   * Resolves once `key` is covered: at once, after the page in flight that starts at it, or after a new
   * part started at `key` (cut from the part that holds it) has its first page. Rejects if listing fails.
   */
  cover(key: string): Promise<void> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.covers(key)) return Promise.resolve();
    // The smallest key after `key`: the waiter's range is that one key.
    const p = this.wait(key, `${key}\u0000`, () => this.covers(key));
    this.startAt(key);
    return p;
  }

  /** Resolves once every key in [from, to) is covered, listing that range now (a walk's reader waits). */
  coverRange(from: string, to: string | null): Promise<void> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.coversRange(from, to)) return Promise.resolve();
    const p = this.wait(from, to, () => this.coversRange(from, to));
    if (!this.covers(from)) this.startAt(from);
    for (const s of this.segments) if (this.needed(s)) this.next(s, true);
    return p;
  }

  /**
   * Resolves once `done()` holds or every key in [from, to) is covered, listing that range now until
   * then: a lookup that needs to know whether anything lies under `name/` waits for the first key there,
   * not for the whole subtree.
   */
  coverUntil(from: string, to: string | null, done: () => boolean): Promise<void> {
    if (this.failure) return Promise.reject(this.failure);
    const covered = () => done() || this.coversRange(from, to);
    if (covered()) return Promise.resolve();
    const p = this.wait(from, to, covered);
    if (!this.covers(from)) this.startAt(from);
    for (const s of this.segments) if (this.needed(s)) this.next(s, true);
    return p;
  }

  /** Resolves when the whole range is covered, without hurrying anything. */
  get completion(): Promise<void> {
    return this.finished;
  }

  /** Lists everything left at once (a readdir waits); resolves when all of the range is known. */
  finish(): Promise<void> {
    if (!this.urgent) {
      this.urgent = true;
      for (const s of this.segments) if (!s.done && !s.inFlight) this.next(s, true);
    }
    return this.finished;
  }

  private wait(from: string, to: string | null, covered: () => boolean): Promise<void> {
    return new Promise<void>((resolve, reject) => this.waiters.push({ from, to, covered, resolve, reject }));
  }

  /** Makes a part start at `key` now: the part that already does, or one cut from the part holding it. */
  private startAt(key: string): void {
    const s = this.segmentOf(key);
    if (s.done || (s.cursor !== null && compareKeys(key, s.cursor) <= 0)) return;
    if (compareKeys(s.lo, key) === 0 && s.cursor === null) {
      if (!s.inFlight) this.next(s, true);
      return;
    }
    const part: Segment = { lo: key, hi: s.hi, cursor: null, resume: null, done: false, inFlight: false, queued: null, forLookup: true };
    s.hi = key;
    this.insert(part);
    this.next(part, true);
  }

  /** Whether someone waits on keys of part `s`: its pages then go at once, past pauses and the worker limit. */
  private needed(s: Segment): boolean {
    if (s.done) return false;
    return this.waiters.some((w) => (w.to === null || compareKeys(s.lo, w.to) < 0) && (s.hi === null || compareKeys(w.from, s.hi) < 0));
  }

  /** Lets paused background pages go again (the reader of a walk caught up). */
  resume(): void {
    for (const s of this.segments) if (!s.done && !s.inFlight && !s.queued) this.next(s, false);
  }

  private next(s: Segment, now: boolean): void {
    if (s.done || s.inFlight || this.failure) return;
    if (now || this.urgent) {
      if (s.queued) {
        s.queued.promote();
        return;
      }
      void this.page(s);
      return;
    }
    if (s.queued) return;
    if (this.cfg.lazy && s.cursor === null) return; // a waiter asks for it
    if (this.cfg.paused?.()) return; // resume() picks it up
    let started = false;
    const ticket = this.cfg.workers.run(() => {
      started = true;
      s.queued = null;
      // A page a reader waits for goes whatever the pause says: skipped, it was never asked for again
      // (its ticket gone), and the readdir or lookup waiting on it hung for good.
      if (!this.urgent && !this.needed(s) && this.cfg.paused?.()) return Promise.resolve();
      if (!this.urgent && !this.needed(s)) this.cfg.onBackgroundPage?.();
      return this.page(s);
    });
    // A free worker starts it before run() returns: then there is no queued ticket to keep.
    if (!started) s.queued = ticket;
  }

  private async page(s: Segment): Promise<void> {
    if (s.done || s.inFlight || this.failure) return;
    s.inFlight = true;
    const resume = s.resume !== null && s.resume.end === s.hi ? s.resume : null;
    const from = resume?.start ?? s.cursor ?? s.lo;
    const end = resume ? resume.end : s.hi;
    let page: FetchedPage;
    try {
      page = resume ? await this.cfg.fetch(from, end, resume.token) : await this.cfg.fetch(from, end, undefined, s.forLookup && s.cursor === null);
    } catch (err) {
      s.inFlight = false;
      this.fail(err);
      return;
    }
    s.inFlight = false;
    if (this.failure) return;
    // Keep what is new (a page starts with the cursor's key again) and inside the part (it may have
    // been cut shorter while the page was on its way).
    const keys: string[] = [];
    const metas: (ObjectMeta | null)[] = [];
    for (let i = 0; i < page.keys.length; i++) {
      const k = page.keys[i]!;
      if (s.cursor !== null && compareKeys(k, s.cursor) <= 0) continue;
      if (compareKeys(k, s.lo) < 0) continue;
      if (s.hi !== null && compareKeys(k, s.hi) >= 0) break;
      keys.push(k);
      metas.push(page.metas[i]!);
    }
    const last = page.lastKey;
    // Only GCS's "no more" or a key at the part's end finishes a part. A page may hold fewer items than
    // asked, even none, and still have more to come (GCS says so of pages that skip many names): such a
    // page moves the cursor as far as it reached, and its token goes on from there.
    if (!page.more || (last !== null && s.hi !== null && compareKeys(last, s.hi) >= 0)) {
      s.done = true;
    } else {
      const moved = last !== null && (s.cursor === null || compareKeys(last, s.cursor) > 0);
      if (moved) s.cursor = last;
      s.resume = page.nextPageToken ? { start: from, end, token: page.nextPageToken } : null;
      if (moved && ++this.fullPages >= SPLIT_AFTER_FULL_PAGES) this.split(s, page.keys);
    }
    // The entries and the coverage they prove change together: onPage may ask what is covered now.
    this.entries += keys.length;
    this.cfg.onPage(keys, metas);
    this.wake();
    if (this.segments.every((x) => x.done)) {
      this.settle(null);
      return;
    }
    if (!s.done) this.next(s, this.needed(s));
  }

  /** Cuts the rest of `s` into parts while fewer than maxParallel are open. */
  private split(s: Segment, sample: readonly string[]): void {
    const open = this.segments.filter((x) => !x.done).length;
    const want = this.cfg.maxParallel - open;
    if (want <= 0 || s.cursor === null) return;
    const points = splitPoints(s.cursor, s.hi, sample, want, this.cfg.delimited);
    if (points.length === 0) return;
    const hi = s.hi;
    s.hi = points[0]!;
    for (let i = 0; i < points.length; i++) {
      const part: Segment = { lo: points[i]!, hi: points[i + 1] ?? hi, cursor: null, resume: null, done: false, inFlight: false, queued: null, forLookup: false };
      this.insert(part);
      this.next(part, this.needed(part));
    }
  }

  private wake(): void {
    const still: Waiter[] = [];
    for (const w of this.waiters) {
      if (w.covered()) w.resolve();
      else still.push(w);
    }
    this.waiters = still;
  }

  private fail(err: unknown): void {
    if (this.failure) return;
    this.failure = err;
    for (const w of this.waiters) w.reject(err);
    this.waiters = [];
    this.settle(err);
  }

  private insert(part: Segment): void {
    this.segments.splice(this.indexOf(part.lo) + 1, 0, part);
  }

  /** Index of the part holding `key`: the last one starting at or before it. */
  private indexOf(key: string): number {
    let lo = 0;
    let hi = this.segments.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (compareKeys(this.segments[mid]!.lo, key) <= 0) lo = mid + 1;
      else hi = mid;
    }
    return Math.max(0, lo - 1);
  }

  private segmentOf(key: string): Segment {
    return this.segments[this.indexOf(key)]!;
  }
}
