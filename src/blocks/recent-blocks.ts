import type { MemoryBudget } from '../memory/memory-budget.js';
import type { BlockData } from './block-buffers.js';

/**
 * Blocks of files read again and again through fresh opens (the shards the prefetcher follows), kept in
 * memory after their readers let go, least recently used dropped first. zarr opens a shard once per inner
 * chunk (~1 MB) and closes it again, so without this each open loaded its 4 MiB block from disk and
 * checked it again: a warm epoch of a sharded array loaded 1.9 GB of blocks to serve 0.42 GB. Only what nobody reads is held here, so the memory budget
 * takes it back first ('spare') when a read waits for memory.
 */
export class RecentBlocks {
  /** By block id, oldest first (a Map keeps insertion order; a hit moves its block to the end). */
  private readonly blocks = new Map<string, BlockData>();
  private held = 0;
  private readonly unregister: () => void;

  constructor(
    private readonly capacityBytes: number,
    budget: MemoryBudget | null,
  ) {
    this.unregister = budget?.addReclaimer((_level, short) => {
      while (short() && this.dropOldest());
    }) ?? (() => undefined);
  }

  /** Bytes held now. */
  get bytes(): number {
    return this.held;
  }

  /** A reference of the caller's own to the block, or null. */
  take(id: string): BlockData | null {
    const block = this.blocks.get(id);
    if (!block) return null;
    this.blocks.delete(id);
    this.blocks.set(id, block);
    return block.retain();
  }

  /** Keeps a reference to `block` (the caller keeps its own). */
  keep(id: string, block: BlockData): void {
    const length = block.bytes.length;
    if (length > this.capacityBytes || this.blocks.has(id)) return;
    this.blocks.set(id, block.retain());
    this.held += length;
    while (this.held > this.capacityBytes) this.dropOldest();
  }

  close(): void {
    this.unregister();
    while (this.dropOldest());
  }

  private dropOldest(): boolean {
    const first = this.blocks.entries().next();
    if (first.done) return false;
    const [id, block] = first.value;
    this.blocks.delete(id);
    this.held -= block.bytes.length;
    block.release();
    return true;
  }
}
