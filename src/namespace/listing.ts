import { compareNames as compareKeys } from '../name-order.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { DirEntry, Entry } from './entry.js';
import { ListingRun } from './listing-run.js';

/** GCS's name order (code-point order), which every range and binary search here must agree with. */
export { compareKeys };

/**
 * A directory's entries as sorted compact runs. A listing still being filled holds the runs of the
 * pages that have arrived, disjoint and in key order (add() keeps them so); a complete one is
 * compacted into one run. Which names a partial listing can answer for is its lister's
 * business (key-range coverage), not the listing's.
 */
export class Listing {
  private runs: ListingRun[] = [];
  private entryCount = 0;
  /**
   * When its listing began, by the metadata cache's clock: it may say "no such name" for the negative
   * TTL from then. Null until known: a listing of unknown age never says "no such name".
   */
  listedAt: number | null = null;

  /** `prefix`: the directory's object prefix ('a/b/', '' at the bucket root). */
  constructor(readonly prefix: string) {}

  get count(): number {
    return this.entryCount;
  }

  get bytes(): number {
    let n = 200;
    for (const r of this.runs) n += r.bytes;
    return n;
  }

  /**
   * Adds a run of entries in key order; runs may arrive in any order. The runs held never share a key
   * and never interleave, whatever arrives: pages of one folder meet at a key both hold (a sub-folder
   * whose names span two pages of a flat walk), and parts of a walk each name the sub-folders they pass
   * through. A key already held is dropped from the new run; a run that still interleaves with others
   * is merged with them (sorted, each key once).
   */
  add(run: ListingRun): void {
    let from = 0;
    let to = run.count;
    while (from < to && this.locate(run.key(from)) !== null) from++;
    while (to > from && this.locate(run.key(to - 1)) !== null) to--;
    if (from === to) return;
    const own = from === 0 && to === run.count ? run : run.slice(from, to);
    const first = own.firstKey;
    const last = own.lastKey;
    // Runs whose key span meets the new run's: none, when pages and parts partition the keys as they should.
    let lo = this.runAfter(first);
    if (lo > 0 && compareKeys(this.runs[lo - 1]!.lastKey, first) >= 0) lo--;
    let hi = lo;
    while (hi < this.runs.length && compareKeys(this.runs[hi]!.firstKey, last) <= 0) hi++;
    if (hi === lo) {
      this.runs.splice(lo, 0, own);
      this.entryCount += own.count;
      return;
    }
    const merged = ListingRun.merge([...this.runs.slice(lo, hi), own]);
    for (let r = lo; r < hi; r++) this.entryCount -= this.runs[r]!.count;
    this.runs.splice(lo, hi - lo, merged);
    this.entryCount += merged.count;
  }

  /** Index of the first run whose first key sorts after `key`. */
  private runAfter(key: string): number {
    let lo = 0;
    let hi = this.runs.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (compareKeys(this.runs[mid]!.firstKey, key) <= 0) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  /**
   * Merges the runs into one, dropping duplicate keys, and hides a file whose name is also a directory
   * (`conflict` is told about each). Call once the listing is complete.
   */
  compact(conflict: (objectName: string) => void): void {
    if (this.runs.length > 1) {
      const one = ListingRun.concat(this.runs);
      this.runs = [one];
      this.entryCount = one.count;
    }
    const run = this.runs[0];
    if (!run) return;
    for (let i = 0; i < run.count; i++) {
      if (!run.isDir(i)) continue;
      const file = run.indexOf(run.key(i).slice(0, -1));
      if (file >= 0 && !run.isHidden(file)) {
        run.hide(file);
        conflict(this.prefix + run.key(file));
      }
    }
  }

  /** The entry named `name` among the runs present, or null: a directory wins over a same-named file. */
  get(name: string): Entry | null {
    const dir = this.find(`${name}/`);
    if (dir) return { kind: 'dir', mtimeMs: null };
    const file = this.find(name);
    if (!file || file.run.isHidden(file.i)) return null;
    return { kind: 'file', meta: file.run.meta(file.i, this.prefix) };
  }

  private find(key: string): { run: ListingRun; i: number } | null {
    const at = this.locate(key);
    return at && { run: this.runs[at.r]!, i: at.i };
  }

  /** Run and row of `key`, by binary search: the last run starting at or before it (runs never interleave). */
  private locate(key: string): { r: number; i: number } | null {
    const r = this.runAfter(key) - 1;
    if (r < 0) return null;
    const i = this.runs[r]!.indexOf(key);
    return i >= 0 ? { r, i } : null;
  }

  /**
   * The file `name`'s index among the visible files present, in key order (0 for the first), or -1 if
   * it is not a visible file here. By binary search: a reader opening the files of a 100,000-name folder
   * one by one is followed without building the folder's names on every open. Indices shift when runs
   * arrive, as positions in a growing list do.
   */
  fileOrdinal(name: string): number {
    const at = this.locate(name);
    if (!at || !this.runs[at.r]!.isVisibleFile(at.i)) return -1;
    let ordinal = this.runs[at.r]!.filesBefore(at.i);
    for (let r = 0; r < at.r; r++) ordinal += this.runs[r]!.filesBefore(this.runs[r]!.count);
    return ordinal;
  }

  /** Run and row of the visible file with this index (as `fileOrdinal` gives), or null past either end. */
  private fileRowAt(ordinal: number): { run: ListingRun; i: number } | null {
    if (ordinal < 0) return null;
    let rest = ordinal;
    for (const run of this.runs) {
      const own = run.filesBefore(run.count);
      if (rest < own) return { run, i: run.rowOfFile(rest) };
      rest -= own;
    }
    return null;
  }

  /**
   * Up to `n` visible files after (direction 1) or before (-1) the file with index `ordinal`, nearest
   * first, each with its object: a prefetch walk takes them from here rather than looking each up.
   */
  filesFrom(ordinal: number, direction: 1 | -1, n: number): { name: string; meta: ObjectMeta }[] {
    const out: { name: string; meta: ObjectMeta }[] = [];
    for (let k = 1; k <= n; k++) {
      const at = this.fileRowAt(ordinal + k * direction);
      if (at === null) break;
      out.push({ name: at.run.key(at.i), meta: at.run.meta(at.i, this.prefix) });
    }
    return out;
  }

  /** Visible names in key order, directories without their '/'. */
  names(): string[] {
    const out: string[] = [];
    this.forEachName((name) => out.push(name));
    return out;
  }

  /** Each visible name in key order (directories without their '/'), without building entry objects. */
  forEachName(visit: (name: string, isDir: boolean) => void): void {
    this.forEachRow((name, isDir) => visit(name, isDir));
  }

  /**
   * Each visible entry in key order with the run and row that hold it, so that a caller going through
   * all of them (READDIRPLUS) reads metadata by row rather than looking each name up again.
   */
  forEachRow(visit: (name: string, isDir: boolean, run: ListingRun, i: number) => void): void {
    this.each((run, i, key) => (run.isDir(i) ? visit(key.slice(0, -1), true, run, i) : visit(key, false, run, i)));
  }

  /** Names of the sub-directories, in key order. */
  dirNames(): string[] {
    const out: string[] = [];
    this.each((run, i, key) => {
      if (run.isDir(i)) out.push(key.slice(0, -1));
    });
    return out;
  }

  /** Every visible entry as an object: for tests and small folders; large ones use names() and get(). */
  entries(): DirEntry[] {
    const out: DirEntry[] = [];
    this.each((run, i, key) => out.push(run.isDir(i) ? { name: key.slice(0, -1), entry: { kind: 'dir', mtimeMs: null } } : { name: key, entry: { kind: 'file', meta: run.meta(i, this.prefix) } }));
    return out;
  }

  private each(visit: (run: ListingRun, i: number, key: string) => void): void {
    let last: string | null = null;
    for (const run of this.runs) {
      for (let i = 0; i < run.count; i++) {
        if (run.isHidden(i)) continue;
        const key = run.key(i);
        if (key === last) continue;
        last = key;
        visit(run, i, key);
      }
    }
  }
}

/** A complete listing of `prefix` from entry objects in any order (tests, small folders). */
export function listingOf(prefix: string, entries: readonly DirEntry[], conflict: (objectName: string) => void = () => undefined): Listing {
  const rows = entries.map((e) => ({ key: e.entry.kind === 'dir' ? `${e.name}/` : e.name, meta: e.entry.kind === 'file' ? e.entry.meta : null }));
  rows.sort((a, b) => compareKeys(a.key, b.key));
  const listing = new Listing(prefix);
  listing.add(ListingRun.of(rows.map((r) => r.key), rows.map((r) => r.meta)));
  listing.compact(conflict);
  return listing;
}
