import { promises as fsp } from 'node:fs';
import type { Metrics } from '../observe/metrics.js';
import type { SizeLimit } from '../units.js';
import type { BlockIndex } from './block-index.js';
import { FreeSpaceMargin } from './free-space.js';

/** Whether a write may go ahead: see CacheSpace.makeRoom(). */
export type Room = 'now' | 'soon' | 'none';

export interface CacheSpaceConfig {
  dir: string;
  limit: SizeLimit;
  /** Once over the limit, evict down to this fraction of it, so eviction runs in batches, not per write. */
  lowWatermark: number;
}

/**
 * The disk cache's space: the bytes and blocks it holds, bytes reserved for block writes in flight, and
 * the least-recently-used eviction that keeps it under its budget or, with no budget, above the
 * free-space margin. The counts follow the index's rows; the caller changes them only through here.
 */
export class CacheSpace {
  readonly limitBytes: number;
  /** With no budget (-1): the free space kept on the cache's file system, evicting to keep it. */
  private readonly margin: FreeSpaceMargin | null;
  /** Bytes reserved for block files not yet on disk: free space statfs still shows, but spoken for. */
  private unwritten = 0;
  /** Bytes of evicted block files not yet unlinked: space statfs does not show yet, but soon free. */
  private unlinking = 0;
  private readonly unlinks = new Set<Promise<void>>();
  private heldBytes: number;
  private heldBlocks: number;
  /** Blocks a reader is between lookup and read of: eviction leaves them alone. */
  private readonly pinned = new Map<string, number>();

  constructor(
    private readonly cfg: CacheSpaceConfig,
    private readonly index: BlockIndex,
    private readonly metrics: Metrics,
    /** Where block file KEY is. */
    private readonly path: (key: string) => string,
    /** Brings access times up to date before eviction picks victims. */
    private readonly pullAccess: () => void,
    /** An evicted block's file could not be removed: no row names it now, so only a reconcile finds it. */
    private readonly strayFile: () => void = () => undefined,
  ) {
    const t = index.totals();
    this.heldBytes = t.bytes;
    this.heldBlocks = t.blocks;
    this.limitBytes = cfg.limit.kind === 'bytes' ? cfg.limit.bytes : Number.POSITIVE_INFINITY;
    this.margin = cfg.limit.kind === 'bytes' ? null : FreeSpaceMargin.of(cfg.dir);
    metrics.setGauge('block_cache_bytes', () => this.heldBytes);
    metrics.setGauge('block_cache_blocks', () => this.heldBlocks);
    metrics.setGauge('block_cache_limit_bytes', () => (Number.isFinite(this.limitBytes) ? this.limitBytes : -1));
    if (this.margin) metrics.setGauge('block_cache_free_margin_bytes', () => this.margin!.bytes);
  }

  /** Bytes of the blocks held, those being written included. */
  get bytes(): number {
    return this.heldBytes;
  }

  /** Reserves a block's bytes for its write: counted as held, and as spoken for until written(). */
  reserve(size: number): void {
    this.heldBytes += size;
    this.heldBlocks += 1;
    this.unwritten += size;
  }

  /** The reserved block's file is on disk: statfs shows its bytes now. */
  written(size: number): void {
    this.unwritten -= size;
    this.margin?.wrote(size);
  }

  /** The reserved block was not stored after all; `written`: whether its file had reached the disk. */
  unreserve(size: number, written: boolean): void {
    this.heldBytes -= size;
    this.heldBlocks -= 1;
    if (!written) this.unwritten -= size;
  }

  /** A block's row was deleted with its file already gone: only the counts follow. */
  forget(size: number): void {
    this.heldBytes -= size;
    this.heldBlocks -= 1;
  }

  /** A block's row was deleted: the counts follow and its file goes. */
  removed(key: string, size: number): void {
    this.forget(size);
    this.removeFile(key, size);
  }

  /** Every row was deleted. */
  cleared(): void {
    this.heldBytes = 0;
    this.heldBlocks = 0;
  }

  /** Resolves once no evicted file is being unlinked, those started meanwhile included. */
  async unlinked(): Promise<void> {
    while (this.unlinks.size > 0) await Promise.all([...this.unlinks]);
  }

  /** Evicted files whose unlink has not finished: their fate is not known yet. */
  get unlinkPending(): boolean {
    return this.unlinks.size > 0;
  }

  /**
   * Evicts what a write of `incoming` bytes needs: 'now' when it may be written, 'soon' once the files
   * just evicted are unlinked (writing before that is what ran parallel writes into ENOSPC), 'none'
   * when there is not that much left to evict.
   */
  makeRoom(incoming: number): Room {
    if (this.heldBytes + incoming > this.limitBytes) this.evictDownTo(Math.min(this.limitBytes * this.cfg.lowWatermark, this.limitBytes - incoming));
    return this.keepMargin(incoming);
  }

  /** Bytes free now above the free-space margin, less what writes in flight will take; null without a margin. */
  private freeAboveMargin(): number | null {
    const free = this.margin?.freeBytes() ?? null;
    return free === null ? null : free - this.unwritten - this.margin!.bytes;
  }

  /**
   * With no budget: evicts least recently used blocks until `incoming` more bytes leave the margin
   * free, and a batch beyond it, so it does not run once per block.
   */
  keepMargin(incoming: number): Room {
    let room = this.freeAboveMargin();
    if (room === null || room >= incoming) return 'now';
    // Evicting every block held would still not make room (the rest is being written): evict nothing. A
    // write that evicted and was then skipped all the same threw away cached blocks for no block at all
    // (a 16 MiB disk under 16 parallel block writes ended with 1 block kept and 12 MiB free).
    if (room + this.unlinking + (this.heldBytes - this.unwritten) < incoming) return 'none';
    if (room + this.unlinking < incoming) this.evictDownTo(this.heldBytes - (incoming - room - this.unlinking) - this.margin!.batchBytes);
    room = this.freeAboveMargin()!;
    if (room >= incoming) return 'now';
    return room + this.unlinking >= incoming ? 'soon' : 'none';
  }

  /** Evicts least recently used blocks, skipping pinned ones, until at most `target` bytes remain. */
  evictDownTo(target: number): void {
    this.pullAccess();
    let offset = 0;
    while (this.heldBytes > target) {
      const batch = this.index.oldest(256, offset);
      if (batch.length === 0) return;
      const victims: { key: string; size: number }[] = [];
      let left = this.heldBytes;
      for (const v of batch) {
        if (left <= target) break;
        if (this.pinned.has(v.key)) {
          offset++;
          continue;
        }
        victims.push(v);
        left -= v.size;
      }
      // Rows first (this may throw, SQLITE_FULL for one), then the counts that follow them.
      this.index.delete(victims.map((v) => v.key));
      for (const { size } of victims) {
        this.heldBytes -= size;
        this.heldBlocks -= 1;
        this.metrics.inc('block_cache_evictions');
        this.metrics.inc('block_cache_evicted_bytes', size);
      }
      // The file goes after the row; a reader that already opened it keeps reading (Linux unlink semantics).
      for (const { key, size } of victims) this.removeFile(key, size);
    }
  }

  /** Unlinks a block file in the background; its bytes count as soon-free space until then. */
  private removeFile(key: string, size: number): void {
    this.unlinking += size;
    const done: Promise<void> = fsp
      .rm(this.path(key), { force: true })
      .catch(() => this.strayFile())
      .finally(() => {
        this.unlinking -= size;
        this.unlinks.delete(done);
      });
    this.unlinks.add(done);
  }

  pin(key: string): void {
    this.pinned.set(key, (this.pinned.get(key) ?? 0) + 1);
  }

  unpin(key: string): void {
    const n = (this.pinned.get(key) ?? 1) - 1;
    if (n === 0) this.pinned.delete(key);
    else this.pinned.set(key, n);
  }

  /** Bytes that can still be written before eviction starts: under the budget, or above the free-space margin. */
  get spareBytes(): number {
    const room = this.freeAboveMargin();
    return Math.min(this.limitBytes - this.heldBytes, room === null ? Number.POSITIVE_INFINITY : Math.max(0, room + this.unlinking));
  }
}
