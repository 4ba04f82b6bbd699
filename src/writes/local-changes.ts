import type { Entry } from '../namespace/entry.js';
import { baseName, parentPath } from '../namespace/paths.js';

interface Change {
  entry: Entry | null;
  until: number;
}

/**
 * What this mount changed in the bucket (created, replaced, removed, renamed), for as long as a cache
 * could still hold what was there before: lookups, stats and listings on this machine see each change at
 * once (close-to-open consistency), though a folder's listing or a walk's pages were taken before it.
 * A change outlives every cache entry older than it: the longest metadata TTL. With TTLs of "for ever",
 * the oldest changes go past `max`, and `expired` is told of each, so the caches drop what they hold of
 * its path and ask GCS again.
 */
export class LocalChanges {
  private readonly byPath = new Map<string, Change>();
  private readonly byFolder = new Map<string, Map<string, Entry | null>>();

  constructor(
    private readonly ttlMs: number,
    private readonly max: number,
    private readonly expired: (path: string) => void,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** `path` is now `entry` (null: gone). */
  set(path: string, entry: Entry | null): void {
    this.sweep();
    this.drop(path);
    this.byPath.set(path, { entry, until: this.now() + this.ttlMs });
    const folder = parentPath(path);
    let names = this.byFolder.get(folder);
    if (!names) this.byFolder.set(folder, (names = new Map()));
    names.set(baseName(path), entry);
    while (this.byPath.size > this.max) {
      const oldest = this.byPath.keys().next().value as string;
      this.drop(oldest);
      this.expired(oldest);
    }
  }

  /** What this mount made of `path`: an entry, null (removed), or undefined (nothing known). */
  get(path: string): Entry | null | undefined {
    const c = this.byPath.get(path);
    if (!c) return undefined;
    if (c.until < this.now()) {
      this.drop(path);
      return undefined;
    }
    return c.entry;
  }

  /**
   * What this mount knew of `path` is wrong (its upload met another writer's object): the record goes,
   * and so does what the caches below hold of it (`expired`), so the next lookup asks GCS.
   */
  forget(path: string): void {
    this.drop(path);
    this.expired(path);
  }

  /** Every live change at a path below `folder` (any depth), with what it made. */
  under(folder: string): Array<[string, Entry | null]> {
    this.sweep();
    const prefix = `${folder}/`;
    const out: Array<[string, Entry | null]> = [];
    for (const [path, c] of this.byPath) if (path.startsWith(prefix)) out.push([path, c.entry]);
    return out;
  }

  /** The changes made in the folder `folder`, by name (null: removed). */
  inFolder(folder: string): ReadonlyMap<string, Entry | null> | undefined {
    this.sweep();
    return this.byFolder.get(folder);
  }

  get size(): number {
    return this.byPath.size;
  }

  private drop(path: string): void {
    if (!this.byPath.delete(path)) return;
    const folder = parentPath(path);
    const names = this.byFolder.get(folder);
    if (names?.delete(baseName(path)) && names.size === 0) this.byFolder.delete(folder);
  }

  /** Changes are kept in the order made (set() re-inserts), so the expired ones are at the front. */
  private sweep(): void {
    const now = this.now();
    for (const [path, c] of this.byPath) {
      if (c.until >= now) break;
      this.drop(path);
    }
  }
}
