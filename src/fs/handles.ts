import { LRUCache } from 'lru-cache';
import type { HandleReader } from '../blocks/handle-reader.js';
import type { ObjectMeta } from '../gcs/object-client.js';

interface OpenFile {
  /** Null once the handle reads a private copy (its object went): it pins nothing. */
  path: string | null;
  reader: HandleReader;
}

interface Pin {
  meta: ObjectMeta;
  opens: number;
}

export interface ReportedSizesConfig {
  /**
   * How long the kernel may hold attributes it was given (its attribute timeout): past it, the kernel
   * asks again before it trusts a size, so the entry has no more work to do.
   */
  ttlMs: number;
  /**
   * The most paths kept. Only a path stat'd within the last `ttlMs` needs its entry, so this is the
   * most files a workload may stat within one attribute timeout before the oldest entry goes early.
   */
  max: number;
  /** The clock (tests); performance.now() otherwise. */
  now?: () => number;
}

/** 100,000 paths: about 30 MB at worst (each entry's metadata no longer shared with the metadata cache). */
export const DEFAULT_REPORTED_SIZES: ReportedSizesConfig = { ttlMs: 60_000, max: 100_000 };

/**
 * Even a kernel told "attributes time out at once" holds a size between its getattr and the open that
 * follows it; entries live at least this long.
 */
const MIN_REPORTED_TTL_MS = 1_000;

/**
 * Open files by the number handed to the kernel, and the generation each path is pinned to.
 *
 * The kernel keeps one page cache per inode, and libfuse's path API gives every open of a path the same
 * inode. If a new open read a newer generation while an older one is still open, the new bytes would land
 * in the pages the old reader reads next: a mix. So while any handle of a path is open, every open and
 * stat of that path sees the same generation; the next one is seen once the last handle closes.
 *
 * The kernel also keeps each file's size for the attribute timeout, and clamps reads to it. A file
 * opened on a newer generation than the size the kernel holds would read as a truncated (or padded) new
 * file. What the kernel holds is exactly what getattr last answered, so an open pins that generation.
 */
export class HandleTable {
  private readonly open = new Map<number, OpenFile>();
  private readonly pins = new Map<string, Pin>();
  /**
   * What getattr last told the kernel about each file, for as long as the kernel may hold it (open
   * handles are covered by `pins`, which nothing expires). Expired entries are dropped in one sweep per
   * TTL, on the next report, so an idle mount holds at most `max` and a busy one only what is current.
   */
  private readonly reported: LRUCache<string, ObjectMeta>;
  private readonly ttlMs: number;
  private readonly now: () => number;
  private lastSweep: number;
  private next = 1;

  constructor(cfg: ReportedSizesConfig = DEFAULT_REPORTED_SIZES) {
    this.ttlMs = Math.max(MIN_REPORTED_TTL_MS, Math.ceil(cfg.ttlMs));
    this.now = cfg.now ?? (() => performance.now());
    this.reported = new LRUCache<string, ObjectMeta>({ max: Math.max(1, cfg.max), ttl: this.ttlMs, ttlResolution: 0, perf: { now: this.now } });
    this.lastSweep = this.now();
  }

  /** Records the attributes handed to the kernel for a file. */
  reportedToKernel(path: string, meta: ObjectMeta): void {
    this.reported.set(path, meta);
    if (this.now() - this.lastSweep >= this.ttlMs) {
      this.lastSweep = this.now();
      this.reported.purgeStale();
    }
  }

  /**
   * The kernel holds no attributes of `path` any more (they were invalidated and nothing was told
   * since): the next open reads the object as it is now, not the generation last reported.
   */
  droppedFromKernel(path: string): void {
    this.reported.delete(path);
  }

  /** How many paths the table of reported attributes holds (expired ones included until the next sweep). */
  get reportedCount(): number {
    return this.reported.size;
  }

  /** The generation an open of `path` must read: the pinned one, else the one the kernel has the size of. */
  generationFor(path: string, fresh: ObjectMeta): ObjectMeta {
    return this.pins.get(path)?.meta ?? this.reported.get(path) ?? fresh;
  }

  /** The generation `path` is pinned to while it has open handles. */
  pinned(path: string): ObjectMeta | undefined {
    return this.pins.get(path)?.meta;
  }

  add(path: string, reader: HandleReader): number {
    // Skip numbers still in use after wrap-around; 2^31 opens is a long time, but not forever.
    while (this.open.has(this.next)) this.next = (this.next % 0x7fff_ffff) + 1;
    const fd = this.next;
    this.next = (this.next % 0x7fff_ffff) + 1;
    this.open.set(fd, { path, reader });
    const pin = this.pins.get(path);
    if (pin) pin.opens++;
    else this.pins.set(path, { meta: reader.meta, opens: 1 });
    return fd;
  }

  /** The path a handle reads (null once it reads a private copy). */
  pathOf(fd: number): string | null {
    return this.open.get(fd)?.path ?? null;
  }

  /** The handles open on `path`. */
  openOn(path: string): number[] {
    const out: number[] = [];
    for (const [fd, f] of this.open) if (f.path === path) out.push(fd);
    return out;
  }

  /**
   * Generation `source` of the object at `from` became `meta` at `to` (a rename: the same bytes; or an
   * upload here over it, from === to). The open handles of `from` read `meta` from now on, under the new
   * name, and the pin goes with them, only when `source` is the generation they are pinned to: a handle
   * never mixes two generations' bytes, so handles of another generation stay on theirs (and fail once
   * it is gone, as they would without the move). Returns the handles moved; after an upload, the caller
   * drops what they hold of the old bytes (ReadOps.regenerated).
   */
  moved(from: string, to: string, source: string, meta: ObjectMeta): number[] {
    // What the kernel was told of `from` went with its inode to `to` (a rename), and `to`'s old inode
    // left its name: the generations reported under either path no longer say what an open there
    // must read. Kept, a folder renamed away and back (each file's move calls this) made a later file
    // at the old path open the generation the first file had there: 404, EIO.
    this.reported.delete(from);
    this.reported.delete(to);
    const pin = this.pins.get(from);
    if (!pin || pin.meta.generation !== source) return [];
    this.pins.delete(from);
    this.pins.set(to, { meta, opens: pin.opens });
    const fds: number[] = [];
    for (const [fd, f] of this.open) {
      if (f.path !== from) continue;
      f.path = to;
      f.reader.meta = meta;
      fds.push(fd);
    }
    return fds;
  }

  get(fd: number): HandleReader | undefined {
    return this.open.get(fd)?.reader;
  }

  remove(fd: number): void {
    const file = this.open.get(fd);
    if (!file) return;
    this.open.delete(fd);
    this.unpin(file);
  }

  /** The handle reads a private copy from now on: its path's generation is no longer held for it (the number stays taken). */
  release(fd: number): void {
    const file = this.open.get(fd);
    if (file) this.unpin(file);
  }

  private unpin(file: OpenFile): void {
    if (file.path === null) return;
    const pin = this.pins.get(file.path);
    if (pin && --pin.opens === 0) this.pins.delete(file.path);
    file.path = null;
  }

  get size(): number {
    return this.open.size;
  }
}
