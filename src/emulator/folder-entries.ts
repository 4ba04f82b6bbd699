// Bucket folders' entries in GCS's name order, cached by each folder's stat, so a listing walks a
// folder from where its page starts rather than reading and sorting the whole folder per request.
import type { BigIntStats } from 'node:fs';
import { promises as fsp, statSync } from 'node:fs';
import path from 'node:path';
import { statOrNull } from './file-stat.js';
import { SIDE_DIR, compareNames } from './names.js';

/** One entry of a bucket folder, as a listing walks it: `key` is the name, plus '/' for a folder. */
export interface SortedEntry {
  name: string;
  key: string;
  kind: 'file' | 'dir' | 'link';
  link: boolean;
}

/** Folders whose sorted entries are kept; each costs its entries' names. */
const FOLDER_CACHE_MAX = 10_000;

export class FolderEntries {
  private readonly folderCache = new Map<string, { stamp: string; entries: readonly SortedEntry[] }>();
  private readonly folderReads = new Map<string, Promise<readonly SortedEntry[]>>();

  /**
   * One folder's files and sub-folders, sorted as GCS sorts names (a folder by its name plus '/'), so a
   * listing can binary-search to its start and stop after one page: paging through a folder of 100,000
   * files then costs a page's work per request, not the folder's. Cached by the folder's own stat (an
   * added, removed or renamed entry changes its mtime); a symlink's kind is looked up on each use.
   */
  async sorted(abs: string): Promise<readonly SortedEntry[]> {
    const st = await statOrNull(abs);
    if (!st || !st.isDirectory()) return [];
    const stamp = folderStamp(st);
    const hit = this.folderCache.get(abs);
    if (hit && hit.stamp === stamp) return hit.entries;
    // Concurrent pages of one large folder share one read of it.
    const key = `${abs}\0${stamp}`;
    let reading = this.folderReads.get(key);
    if (!reading) {
      reading = this.readSorted(abs, stamp).finally(() => this.folderReads.delete(key));
      this.folderReads.set(key, reading);
    }
    return reading;
  }

  /** The kind of a sorted entry now (a symlink is followed), with the set of link targets on its path. */
  async resolve(abs: string, e: SortedEntry, targets: ReadonlySet<string>): Promise<{ kind: 'file' | 'dir' | 'other'; targets: ReadonlySet<string> | null }> {
    if (!e.link) return { kind: e.kind === 'dir' ? 'dir' : 'file', targets };
    const p = path.join(abs, e.name);
    const st = await statOrNull(p);
    if (!st) return { kind: 'other', targets: null };
    if (st.isFile()) return { kind: 'file', targets };
    if (!st.isDirectory()) return { kind: 'other', targets: null };
    const id = `${st.dev}:${st.ino}`;
    // Symlinked folders are followed, but never into one already on the current path (a loop).
    if (targets.has(id)) return { kind: 'other', targets: null };
    return { kind: 'dir', targets: new Set([...targets, id]) };
  }

  /** True when the folder holds at least one file, at any depth. */
  async hasFile(abs: string, targets: ReadonlySet<string>): Promise<boolean> {
    const entries = await this.sorted(abs);
    const dirs: { p: string; targets: ReadonlySet<string> }[] = [];
    for (const e of entries) {
      const r = await this.resolve(abs, e, targets);
      if (r.kind === 'file') return true;
      if (r.kind === 'dir' && r.targets) dirs.push({ p: path.join(abs, e.name), targets: r.targets });
    }
    for (const d of dirs) if (await this.hasFile(d.p, d.targets)) return true;
    return false;
  }

  /**
   * A file added to or removed from folder `dir` by the emulator itself, made synchronously between two
   * stats of the folder, so its cached sorted entries are patched rather than read again: re-reading and
   * sorting a 10,000-file folder for each listing after each upload made writing a Zarr store quadratic
   * (15 -> 4 files/s as the folder grew). A folder changed behind the emulator's back (its stamp is not
   * the cached one), or whose stamp did not move, is read again on its next listing.
   */
  change(dir: string, name: string, added: boolean, change: () => void): void {
    const before = stampSync(dir);
    change();
    const hit = this.folderCache.get(dir);
    if (!hit) return;
    const after = stampSync(dir);
    if (before === null || after === null || hit.stamp !== before || after === before) {
      this.folderCache.delete(dir);
      return;
    }
    this.folderCache.set(dir, { stamp: after, entries: withFile(hit.entries, name, added) });
  }

  /** Drops `dir`'s cached entries: it was changed in a way change() could not follow. */
  forget(dir: string): void {
    this.folderCache.delete(dir);
  }

  private async readSorted(abs: string, stamp: string): Promise<readonly SortedEntry[]> {
    const entries: SortedEntry[] = [];
    for (const ent of await readdirOrEmpty(abs)) {
      if (ent.name.startsWith(SIDE_DIR)) continue;
      const kind = ent.isFile() ? 'file' : ent.isDirectory() ? 'dir' : ent.isSymbolicLink() ? 'link' : null;
      if (kind === null) continue;
      // A link's kind decides its sort key; it is read now and re-checked when the link is used.
      const linkKind = kind === 'link' ? await entryKind(ent, path.join(abs, ent.name)) : kind;
      if (linkKind === 'other') continue;
      entries.push({ name: ent.name, key: linkKind === 'dir' ? `${ent.name}/` : ent.name, kind, link: kind === 'link' });
    }
    entries.sort((a, b) => compareNames(a.key, b.key));
    this.folderCache.set(abs, { stamp, entries });
    if (this.folderCache.size > FOLDER_CACHE_MAX) this.folderCache.delete(this.folderCache.keys().next().value!);
    return entries;
  }
}

/** Index of the first sorted entry whose key is at or after `key` (entries.length if none). */
export function firstKeyAtOrAfter(entries: readonly SortedEntry[], key: string): number {
  let lo = 0;
  let hi = entries.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (compareNames(entries[mid]!.key, key) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** What says a folder's entries are the ones read: any added, removed or renamed entry changes it. */
function folderStamp(st: BigIntStats): string {
  return `${st.dev}:${st.ino}:${st.mtimeNs}:${st.ctimeNs}:${st.size}`;
}

function stampSync(dir: string): string | null {
  const st = statSync(dir, { bigint: true, throwIfNoEntry: false });
  return st?.isDirectory() ? folderStamp(st) : null;
}

/** Sorted entries with the regular file `name` present (added) or absent: a new array, as listings in progress hold the old one. */
function withFile(entries: readonly SortedEntry[], name: string, added: boolean): readonly SortedEntry[] {
  const lo = firstKeyAtOrAfter(entries, name);
  const found = lo < entries.length && entries[lo]!.key === name;
  const next = entries.slice();
  if (added) next.splice(lo, found ? 1 : 0, { name, key: name, kind: 'file', link: false });
  else if (found) next.splice(lo, 1);
  return next;
}

type Entry = { name: string; isFile(): boolean; isDirectory(): boolean; isSymbolicLink(): boolean };

async function readdirOrEmpty(dir: string): Promise<Entry[]> {
  try {
    return await fsp.readdir(dir, { withFileTypes: true });
  } catch {
    return [];
  }
}

async function entryKind(ent: Entry, p: string): Promise<'file' | 'dir' | 'other'> {
  if (ent.isFile()) return 'file';
  if (ent.isDirectory()) return 'dir';
  if (!ent.isSymbolicLink()) return 'other';
  const st = await statOrNull(p);
  return st?.isFile() ? 'file' : st?.isDirectory() ? 'dir' : 'other';
}
