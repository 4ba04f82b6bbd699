import type { ObjectMeta } from '../gcs/object-client.js';
import type { BlockSource } from './block-source.js';

export interface HandleReaderConfig {
  /** Blocks kept in memory per open file: the one being read, the one prefetched, and a little slack. */
  keepBlocks: number;
}

/**
 * Reads one pinned generation of one object for one open file. The kernel asks for at most 128 KiB at a
 * time; whole aligned blocks (from the disk cache or one range GET each) are kept in memory while the
 * reader is in them, and the next block is prefetched while the reader is sequential.
 */
export class HandleReader {
  private readonly blocks = new Map<number, Promise<Buffer>>();
  private lastEnd = -1;

  constructor(
    private readonly source: BlockSource,
    readonly meta: ObjectMeta,
    private readonly cfg: HandleReaderConfig,
  ) {}

  /** Copies bytes [pos, pos + into.length) of the object, clamped to its size, into `into`; returns the count. */
  async read(pos: number, into: Buffer): Promise<number> {
    const end = Math.min(this.meta.size, pos + into.length);
    if (pos >= end) return 0;
    const bs = this.source.blockSize;
    const first = Math.floor(pos / bs);
    const last = Math.floor((end - 1) / bs);
    const sequential = pos === this.lastEnd;
    this.lastEnd = end;

    const wanted: number[] = [];
    for (let b = first; b <= last; b++) wanted.push(b);
    const fetches = wanted.map((b) => this.block(b));
    if (sequential && (last + 1) * bs < this.meta.size) void this.block(last + 1).catch(() => undefined);
    this.trim(new Set([...wanted, last + 1]));

    let copied = 0;
    for (let i = 0; i < wanted.length; i++) {
      const data = await fetches[i]!;
      const blockStart = wanted[i]! * bs;
      const from = Math.max(pos, blockStart) - blockStart;
      const to = Math.min(end, blockStart + data.length) - blockStart;
      copied += data.copy(into, copied, from, to);
    }
    return copied;
  }

  private block(index: number): Promise<Buffer> {
    let p = this.blocks.get(index);
    if (!p) {
      p = this.source.get(this.meta, index);
      // A failed fetch must not be remembered: the next read tries again.
      p.catch(() => this.blocks.delete(index));
      this.blocks.set(index, p);
    }
    return p;
  }

  /** Drops the oldest blocks beyond the budget, never one that a read in progress needs. */
  private trim(keep: Set<number>): void {
    for (const index of this.blocks.keys()) {
      if (this.blocks.size <= this.cfg.keepBlocks) return;
      if (!keep.has(index)) this.blocks.delete(index);
    }
  }
}
