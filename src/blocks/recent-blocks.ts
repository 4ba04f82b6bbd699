import type { MemoryBudget } from '../memory/memory-budget.js';
import type { BlockData } from './block-buffers.js';

/**
 * Blocks of files read again and again through fresh opens (the shards the prefetcher follows), kept in
 * memory after their readers let go, least recently used dropped first. zarr opens a shard once per inner
 * chunk (~1 MB) and closes it again, so without this each open loaded its 4 MiB block from disk and
 * checked it again: a warm epoch of a sharded array loaded 1.9 GB of blocks to serve 0.42 GB. Only
 * what nobody reads is held here, so the memory budget takes it back first ('spare') when a read waits
 * for memory, and what nobody asked for a while goes by itself.
 */
export class RecentBlocks {
  /** By block id, least recently used first (a Map keeps insertion order; a hit moves its entry to the end). */
  private readonly blocks = new Map<string, { block: BlockData; usedAt: number; counted: number }>();
  private held = 0;
  private closed = false;
  private readonly unregister: () => void;
  private readonly sweeper: NodeJS.Timeout;

  constructor(
    private readonly capacityBytes: number,
    budget: MemoryBudget | null,
    /**
     * What one kept block counts for: at least a whole block, which is what its buffer reserves from the
     * budget however short the block (a shard's last one).
     */
    private readonly unitBytes: number,
    /** A block nobody asked for this long is let go, so an idle mount gives its memory back. */
    private readonly idleMs = 10_000,
  ) {
    this.unregister = budget?.addReclaimer((_level, short) => {
      while (short() && this.dropOldest());
    }) ?? (() => undefined);
    this.sweeper = setInterval(() => this.dropIdle(), Math.max(100, idleMs / 4));
    this.sweeper.unref();
  }

  /** Bytes held now, as the memory budget counts them. */
  get bytes(): number {
    return this.held;
  }

  /** Whether the block is held (a read of it costs no download). */
  has(id: string): boolean {
    return this.blocks.has(id);
  }

  /** A reference of the caller's own to the block, or null. */
  take(id: string): BlockData | null {
    const entry = this.blocks.get(id);
    if (!entry) return null;
    this.blocks.delete(id);
    entry.usedAt = performance.now();
    this.blocks.set(id, entry);
    return entry.block.retain();
  }

  /** Keeps a reference to `block` (the caller keeps its own); nothing once closed. */
  keep(id: string, block: BlockData): void {
    const counted = Math.max(block.bytes.length, this.unitBytes);
    if (this.closed || counted > this.capacityBytes || this.blocks.has(id)) return;
    this.blocks.set(id, { block: block.retain(), usedAt: performance.now(), counted });
    this.held += counted;
    while (this.held > this.capacityBytes) this.dropOldest();
  }

  close(): void {
    this.closed = true;
    clearInterval(this.sweeper);
    this.unregister();
    while (this.dropOldest());
  }

  private dropIdle(): void {
    const before = performance.now() - this.idleMs;
    for (const entry of this.blocks.values()) {
      if (entry.usedAt > before) return;
      this.dropOldest();
    }
  }

  private dropOldest(): boolean {
    const first = this.blocks.entries().next();
    if (first.done) return false;
    const [id, entry] = first.value;
    this.blocks.delete(id);
    this.held -= entry.counted;
    entry.block.release();
    return true;
  }
}
