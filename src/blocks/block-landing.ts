import type { ReadPriority } from '../gcs/object-client.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { BlockData } from './block-buffers.js';
import type { BlockRow } from './block-index.js';
import { blockFileKey, type BlockKey } from './block-key.js';
import type { DiskCache } from './disk-cache.js';

/**
 * Blocks on their way to the disk cache: written in the background once downloaded, served from their
 * memory meanwhile (so a read right after a fetch never misses), lent to the native read path while they
 * are written, and their landing told to whoever waits to see them on disk (the native read path's
 * expected blocks). Blocks are named by `id` in memory (blockId, rangeId) and by `key` on disk.
 */
export class BlockLanding {
  /**
   * Told of each prefetched block once it is on disk, unless a reader waited for it meanwhile (set by
   * the native read path, which loads it into memory: the open that follows then reads no disk).
   */
  preloadAhead: ((row: BlockRow) => void) | null = null;
  /**
   * Set by the native read path: each block going to disk is lent to it while it is written (named by
   * its block file key), so reads waiting for it in the addon are answered from the download's memory
   * rather than waiting for the file. It keeps a reference of its own while it uses the block.
   */
  lendAhead: ((fileKey: string, block: BlockData) => void) | null = null;
  /** Blocks being written, by id, with a reference of their own. */
  private readonly writing = new Map<string, BlockData>();
  /** Blocks someone waits to see on disk (landing()), by id: settled with the row, or null. */
  private readonly landings = new Map<string, { promise: Promise<BlockRow | null>; settle: (row: BlockRow | null) => void }>();

  constructor(private readonly deps: { disk: DiskCache | null; metrics: Metrics; log: Logger }) {}

  /** Whether block `id` is being written now. */
  has(id: string): boolean {
    return this.writing.has(id);
  }

  /** Block `id` while it is being written, for a moment's use (no reference of the caller's), or null. */
  peek(id: string): BlockData | null {
    return this.writing.get(id) ?? null;
  }

  /** Block `id` while it is being written: the caller's own reference, or null. */
  take(id: string): BlockData | null {
    return this.writing.get(id)?.retain() ?? null;
  }

  /**
   * Counts a downloaded block and writes it to disk in the background: the reader has its bytes now.
   * `crc32c`: the block's CRC32C when already known (a whole object checked against GCS's, or a range
   * hashed by the download worker it landed on).
   * `prefetch`: a prefetch's place in the queue: if no reader has waited on it by the time the block is
   * on disk, the block is handed to `preloadAhead` (the native read path loads it into memory then).
   */
  keep(id: string, key: BlockKey, block: BlockData, crc32c: number | null, prefetch: ReadPriority | null): void {
    this.deps.metrics.inc('block_fetches');
    this.deps.metrics.inc('block_fetch_bytes', block.bytes.length);
    if (!this.deps.disk || this.writing.has(id)) return;
    const ref = block.retain();
    this.writing.set(id, ref);
    // Checked already (a whole object against GCS's CRC32C), and the reads a lender serves are answered
    // from these bytes until the block lands: they never change while `ref` holds them.
    this.lendAhead?.(blockFileKey(key), ref);
    const disk = this.deps.disk;
    // Nobody awaits this chain: a failure in it is logged here, never left to end the process.
    void disk.write(key, ref.bytes, ref.directCapacity, crc32c, () => this.land(id, key)).finally(() => {
      this.writing.delete(id);
      this.land(id, key);
      ref.release();
      if (prefetch?.priority !== 'background' || !this.preloadAhead) return;
      const row = disk.lookup(key);
      if (row) this.preloadAhead(row);
    }).catch((err: Error) => this.deps.log.warn({ err: err.message, key }, 'after a block was written to the cache'));
  }

  /**
   * A promise of block `id`'s index row once it is on disk, or null if it does not get there. `loading`:
   * the load that will bring it, if it is not being written yet; a load that ends without a disk write
   * (failed, skipped, or a block found in memory) lands nothing, one that starts a write has it in
   * `writing` by then, and that write settles the landing.
   */
  landing(id: string, key: BlockKey, loading: Promise<unknown> | null): Promise<BlockRow | null> {
    let landing = this.landings.get(id);
    if (!landing) {
      let settle!: (row: BlockRow | null) => void;
      const promise = new Promise<BlockRow | null>((resolve) => (settle = resolve));
      landing = { promise, settle };
      this.landings.set(id, landing);
      const ended = (): void => {
        if (!this.writing.has(id)) this.land(id, key);
      };
      loading?.then(ended, ended);
    }
    return landing.promise;
  }

  /** Settles the landing of block `id`, if anybody waits for it, with its row as the index has it now. */
  private land(id: string, key: BlockKey): void {
    const landing = this.landings.get(id);
    if (!landing) return;
    this.landings.delete(id);
    landing.settle(this.deps.disk?.lookup(key) ?? null);
  }
}
