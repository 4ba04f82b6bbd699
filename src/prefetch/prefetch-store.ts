import type { BlockData } from '../blocks/block-buffers.js';
import { blockId, fileId, type PrefetchedBlocks } from '../blocks/block-source.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { MemoryBudget } from '../memory/memory-budget.js';
import type { Metrics } from '../observe/metrics.js';

/** Files remembered as prefetched, for the used/wasted counts; the oldest are forgotten (as wasted). */
const TRACKED_FILES = 100_000;

interface Tracked {
  bytes: number;
  blocks: Set<string>;
  /** Opened since: not to be fetched again (a slower prefetch round may still name it). */
  opened: boolean;
  /** Fetched by the prefetcher (not only opened). */
  prefetched: boolean;
  /** Blocks a reader's own get() joined while their prefetch was in flight: the reader has them, the store keeps none. */
  joined: Set<number>;
}

/**
 * How long a block of a file just opened is kept from fits(): the open's reads come right after it, and
 * the walk that open starts asks fits() first (it evicted the very blocks the reader was about to take,
 * so each was downloaded twice).
 */
const OPENED_GRACE_MS = 1000;

/**
 * What was prefetched, keyed by object AND generation: an open that sees another generation finds
 * nothing here (and no disk block either, whose key holds the generation too). Without a disk cache it
 * also holds the blocks themselves, within a byte budget, oldest dropped first.
 */
export class PrefetchStore implements PrefetchedBlocks {
  private readonly files = new Map<string, Tracked>();
  /** `file`: '' once its file was opened (no longer a guess), `since` then. */
  private readonly held = new Map<string, { data: BlockData; file: string; since: number }>();
  private heldBytes = 0;

  constructor(
    /** Bytes of blocks held in memory; 0 when a disk cache keeps them instead. */
    private readonly memoryBudget: number,
    private readonly metrics: Metrics,
    /** The mount's memory budget: held blocks, the oldest first, are the first given back when a read waits for memory. */
    memory?: MemoryBudget,
    private readonly now: () => number = () => performance.now(),
  ) {
    metrics.setGauge('prefetch_held_bytes', () => this.heldBytes);
    memory?.addReclaimer((_level, short) => {
      while (short() && this.held.size > 0) this.drop(this.held.keys().next().value!, true);
    });
  }

  get holdsInMemory(): boolean {
    return this.memoryBudget > 0;
  }

  /** Prefetched already, or opened: either way not worth fetching ahead again. */
  has(meta: ObjectMeta): boolean {
    return this.files.has(fileId(meta));
  }

  /**
   * Room for `bytes` more in memory (always true when a disk cache holds the blocks). Blocks of files
   * opened at least OPENED_GRACE_MS ago make room, the oldest first, and only when that makes enough:
   * their reader read what it wanted (or never will), and with the store full of them no fetch would
   * start again (prefetch stopped for good once readers had caught up with it for the store's size).
   */
  fits(bytes: number): boolean {
    if (!this.holdsInMemory) return true;
    if (this.heldBytes + bytes <= this.memoryBudget) return true;
    const before = this.now() - OPENED_GRACE_MS;
    const spent = (h: { file: string; since: number }) => h.file === '' && h.since <= before;
    let spare = 0;
    for (const h of this.held.values()) if (spent(h)) spare += h.data.bytes.length;
    if (this.heldBytes - spare + bytes > this.memoryBudget) return false;
    for (const [id, h] of this.held) {
      if (this.heldBytes + bytes <= this.memoryBudget) break;
      if (!spent(h)) continue;
      this.drop(id, false);
      this.metrics.inc('prefetch_evicted_bytes', h.data.bytes.length);
      h.data.release();
    }
    return true;
  }

  /** A reader's get() of block `index` joined its prefetch in flight: it gets the block from there, so the store holds none. */
  joined(meta: ObjectMeta, index: number): void {
    const t = this.files.get(fileId(meta));
    if (t?.prefetched && this.holdsInMemory) t.joined.add(index);
  }

  /** A file is on its way. */
  started(meta: ObjectMeta): void {
    const id = fileId(meta);
    if (this.files.has(id)) return;
    this.track(id, { bytes: 0, blocks: new Set(), opened: false, prefetched: true, joined: new Set() });
    this.metrics.inc('prefetch_files');
  }

  private track(id: string, t: Tracked): void {
    this.files.set(id, t);
    if (this.files.size > TRACKED_FILES) this.forget(this.files.keys().next().value!);
  }

  /** A prefetched block arrived; the store takes over the caller's reference. */
  arrived(meta: ObjectMeta, index: number, data: BlockData): void {
    const file = fileId(meta);
    const t = this.files.get(file);
    this.metrics.inc('prefetch_bytes', data.bytes.length);
    if (!t) return data.release();
    t.bytes += data.bytes.length;
    if (!this.holdsInMemory) return data.release();
    const id = blockId(meta, index);
    if (t.joined.delete(index) || this.held.has(id)) return data.release();
    // A file opened before its block arrived: no longer a guess (see opened()).
    this.held.set(id, { data, file: t.opened ? '' : file, since: this.now() });
    t.blocks.add(id);
    this.heldBytes += data.bytes.length;
    while (this.heldBytes > this.memoryBudget && this.held.size > 0) this.drop(this.held.keys().next().value!, true);
  }

  take(meta: ObjectMeta, index: number): BlockData | null {
    const id = blockId(meta, index);
    const h = this.held.get(id);
    if (!h) return null;
    this.drop(id, false);
    // The store's reference becomes the caller's.
    return h.data;
  }

  /** An open of this generation: if it was prefetched, the prefetch was used. */
  opened(meta: ObjectMeta): void {
    const id = fileId(meta);
    const t = this.files.get(id);
    if (!t) return this.track(id, { bytes: 0, blocks: new Set(), opened: true, prefetched: false, joined: new Set() });
    if (t.opened) return;
    t.opened = true;
    this.metrics.inc('prefetch_used_files');
    this.metrics.inc('prefetch_used_bytes', t.bytes);
    // Blocks still held stay until read (take) or pushed out; they no longer count as waste.
    const now = this.now();
    for (const b of t.blocks) {
      const h = this.held.get(b);
      if (h) {
        h.file = '';
        h.since = now;
      }
    }
  }

  private forget(id: string): void {
    const t = this.files.get(id);
    if (!t) return;
    this.files.delete(id);
    if (t.prefetched && !t.opened) this.metrics.inc('prefetch_wasted_bytes', t.bytes);
    for (const b of t.blocks) {
      const h = this.held.get(b);
      if (!h) continue;
      this.drop(b, false);
      h.data.release();
    }
  }

  private drop(id: string, evicted: boolean): void {
    const h = this.held.get(id);
    if (!h) return; // dropped already, with the rest of its file
    this.held.delete(id);
    this.heldBytes -= h.data.bytes.length;
    if (evicted) {
      this.metrics.inc('prefetch_evicted_bytes', h.data.bytes.length);
      // An evicted block of a file nobody opened: the whole file is wasted.
      if (h.file) this.forget(h.file);
      h.data.release();
    }
  }

  close(): void {
    for (const id of [...this.held.keys()]) this.drop(id, true);
  }
}
