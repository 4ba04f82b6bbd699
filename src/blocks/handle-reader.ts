import type { ObjectMeta } from '../gcs/object-client.js';
import type { MemoryBudget, ReclaimLevel } from '../memory/memory-budget.js';
import type { BlockData } from './block-buffers.js';
import type { BlockSource } from './block-source.js';
import type { ReadaheadBudget } from './readahead-budget.js';

export interface HandleReaderConfig {
  /**
   * The most blocks one file may have fetched ahead of its reader (gcsfuse's --sequential-read-size-mb);
   * 0 for none (a shard whose reads the prefetcher follows: it fetches what the reader wants next).
   */
  maxWindowBlocks: number;
  budget: ReadaheadBudget;
  /** The mount's memory budget: a handle gives back the blocks it holds when a read waits for memory. */
  memory?: MemoryBudget;
  /**
   * Its blocks stay in memory a while after this handle lets go (BlockSource's recent blocks): a file
   * opened again for each small read, as zarr does a shard per inner chunk.
   */
  keepRecent?: boolean;
}

/** A handle that has not been read for this long gives back even its current block when memory is short. */
const IDLE_MS = 1000;

/**
 * The kernel's readahead sends a sequential reader's 128 KiB requests several at a time and in no fixed
 * order, spread over its readahead window (read_ahead_kb, which gcsfuse's docs advise raising to
 * megabytes): a read within this distance of the furthest byte read so far is still sequential, and
 * blocks within it behind that point are kept. Measured: with a 1 MiB slack, read_ahead_kb=1024 made a
 * cold 1 GiB read 4x slower (the window kept collapsing, blocks were dropped and loaded again).
 */
const SEQUENTIAL_SLACK = 8 * 1024 * 1024;

interface HeldBlock {
  data: Promise<BlockData>;
  /** This handle's reference once the bytes have arrived: most reads then copy without a promise in sight. */
  value: BlockData | null;
  /** Fetched ahead of the reader: holds one unit of the global readahead budget until dropped. */
  ahead: boolean;
  /** Let go of: a reference arriving later is released at once. */
  dropped: boolean;
}

/**
 * Reads one pinned generation of one object for one open file. Whole aligned blocks are held in memory
 * while the reader is in them. While reads are sequential, a window of blocks ahead is fetched in
 * parallel, doubling (1, 2, 4, ...) each time the reader enters a new block, up to a cap; a seek
 * collapses it, so a random reader fetches only the blocks it touches.
 */
export class HandleReader {
  private readonly held = new Map<number, HeldBlock>();
  /** The furthest byte a sequential run of reads has reached. */
  private frontier = 0;
  private window = 1;
  private closed = false;
  private lastReadAt = Date.now();
  /**
   * The blocks of the read being set up, [first, last]: the memory its own blocks ask for may make the
   * budget reclaim, which must not take the blocks this very read is about to copy from.
   */
  private pinned: [number, number] | null = null;
  private readonly unregister: () => void;

  constructor(
    private readonly source: BlockSource,
    /**
     * The generation read; HandleTable.moved() changes it for the same bytes under another name,
     * regenerate() for other bytes.
     */
    public meta: ObjectMeta,
    private readonly cfg: HandleReaderConfig,
  ) {
    this.unregister = cfg.memory?.addReclaimer((level, short) => this.reclaim(level, short)) ?? (() => undefined);
  }

  /**
   * Copies bytes [pos, pos + into.length) of the object, clamped to its size, into `into`; returns the
   * count, synchronously when the blocks are already here (a block serves 32 kernel reads of 128 KiB).
   */
  read(pos: number, into: Buffer): number | Promise<number> {
    const end = Math.min(this.meta.size, pos + into.length);
    if (pos >= end) return 0;
    const bs = this.source.blockSize;
    const first = Math.floor(pos / bs);
    const wanted = this.advance(pos, end);
    try {
      return this.copyOrWait(pos, end, first, wanted, into);
    } finally {
      this.pinned = null;
    }
  }

  private copyOrWait(pos: number, end: number, first: number, wanted: HeldBlock[], into: Buffer): number | Promise<number> {
    const bs = this.source.blockSize;
    // Block `first + i`'s part of the read, copied to where it goes in `into`.
    const copyPart = (i: number, data: BlockData): number => {
      const blockStart = (first + i) * bs;
      const from = Math.max(pos, blockStart) - blockStart;
      const to = Math.min(end, blockStart + data.bytes.length) - blockStart;
      return to > from ? data.bytes.copy(into, blockStart + from - pos, from, to) : 0;
    };
    if (wanted.every((b) => b.value !== null)) return wanted.reduce((n, b, i) => n + copyPart(i, b.value!), 0);
    // The parts here now are copied now: a read that waits holds no block memory, so reads waiting for
    // memory can never be what keeps each other waiting (each holding one block of a read across two).
    const parts = wanted.map((b, i) => {
      if (b.value) return Promise.resolve(copyPart(i, b.value));
      return this.source.get(this.meta, first + i, 'demand', undefined, this.cfg.keepRecent).then((ref) => {
        try {
          return copyPart(i, ref);
        } finally {
          ref.release();
        }
      });
    });
    // Every part settles before the answer: none may still write into `into` once the caller has it.
    return Promise.allSettled(parts).then((settled) => {
      const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (failed) throw failed.reason;
      return settled.reduce((n, r) => n + (r as PromiseFulfilledResult<number>).value, 0);
    });
  }

  /**
   * The bytes [pos, pos + length) as a view into a block this handle already holds, with a reference to
   * release once done with them (a reply the kernel copies from, maybe on another thread); null when they
   * span blocks or have not arrived (then `read` copies them).
   */
  view(pos: number, length: number): { bytes: Buffer; release(): void } | null {
    const end = Math.min(this.meta.size, pos + length);
    if (pos >= end) return { bytes: Buffer.alloc(0), release: () => undefined };
    const bs = this.source.blockSize;
    const first = Math.floor(pos / bs);
    const data = this.held.get(first)?.value;
    if (!data || Math.floor((end - 1) / bs) !== first) return null;
    this.advance(pos, end);
    this.pinned = null;
    if (this.held.get(first)?.value !== data) return null;
    const from = pos - first * bs;
    if (from + (end - pos) > data.bytes.length) return null;
    const ref = data.retain();
    return { bytes: ref.bytes.subarray(from, from + (end - pos)), release: () => ref.release() };
  }

  /**
   * For a read inside one block that view() could not lend yet (the block is on its way): resolves with
   * a view of the bytes once the block is here, and a reference to release after using it (for a reply
   * the kernel copies out at once: the copy into a read buffer is saved). Null when the read spans
   * blocks or is past the end (then `read` copies).
   */
  viewLater(pos: number, length: number): Promise<{ bytes: Buffer; release(): void }> | null {
    const end = Math.min(this.meta.size, pos + length);
    if (pos >= end) return null;
    const bs = this.source.blockSize;
    const first = Math.floor(pos / bs);
    if (Math.floor((end - 1) / bs) !== first) return null;
    const held = this.advance(pos, end)[0]!;
    let ref: Promise<BlockData>;
    try {
      ref = held.value ? Promise.resolve(held.value.retain()) : this.source.get(this.meta, first, 'demand', undefined, this.cfg.keepRecent);
    } finally {
      this.pinned = null;
    }
    return ref.then((block) => {
      const from = pos - first * bs;
      return { bytes: block.bytes.subarray(from, Math.min(block.bytes.length, from + (end - pos))), release: () => block.release() };
    });
  }

  /**
   * True when this handle already holds (or is fetching) every block of [pos, pos + length): a sequential
   * reader's blocks, fetched ahead of it.
   */
  holds(pos: number, length: number): boolean {
    const end = Math.min(this.meta.size, pos + length);
    if (pos >= end) return false;
    const bs = this.source.blockSize;
    for (let b = Math.floor(pos / bs); b <= Math.floor((end - 1) / bs); b++) if (!this.held.has(b)) return false;
    return true;
  }

  /**
   * Block `index`'s bytes when this handle holds them (fetched, not yet let go of), else null: the
   * native path is lent them rather than reading the block's file back. The caller retains its own
   * reference before this handle may drop its own.
   */
  heldBlock(index: number): BlockData | null {
    return this.held.get(index)?.value ?? null;
  }

  /**
   * Reads up to `end` were answered without this reader (the native path, from blocks on disk or on their
   * way there): the next read there continues the sequential run rather than counting as a seek. `from`:
   * the read handed off was of blocks this handle fetches; it moves the readahead window as a read of its
   * own would, so the blocks after the handed-off run are on their way before the reader gets there.
   */
  servedElsewhere(end: number, from?: number): void {
    if (from !== undefined) {
      this.advance(from, Math.min(this.meta.size, from + 1));
      this.pinned = null;
    }
    this.frontier = Math.max(this.frontier, Math.min(end, this.meta.size));
  }

  /**
   * How many of this handle's blocks a read may hand to the native path at once: half the readahead
   * window, so the reader comes back to this handle (which then fetches further ahead) while the other
   * half is still ahead of it; handing the whole window would let the reader catch up with the fetches.
   */
  nativeRunBlocks(): number {
    return Math.max(1, Math.floor(this.window / 2));
  }

  /** Moves the sequential frontier and readahead window for a read of [pos, end); the blocks it needs. */
  private advance(pos: number, end: number): HeldBlock[] {
    this.lastReadAt = Date.now();
    const bs = this.source.blockSize;
    const first = Math.floor(pos / bs);
    const last = Math.floor((end - 1) / bs);
    this.pinned = [first, last];
    // A read of a block this handle still holds is inside the stream however far behind it lands.
    const sequential = Math.abs(pos - this.frontier) <= SEQUENTIAL_SLACK || this.held.has(first);
    // The block the frontier was in before this read (-1 before the first).
    const reached = Math.floor((this.frontier - 1) / bs);
    this.frontier = sequential ? Math.max(this.frontier, end) : end;
    if (!sequential) this.window = 1;
    else if (last > reached && reached >= 0) this.window = Math.min(this.cfg.maxWindowBlocks, this.window * 2);

    const wanted: HeldBlock[] = [];
    for (let b = first; b <= last; b++) wanted.push(this.hold(b, false));
    if (sequential) {
      const frontierBlock = Math.floor((this.frontier - 1) / bs);
      const lastBlockOfObject = Math.floor((this.meta.size - 1) / bs);
      for (let b = frontierBlock + 1; b <= Math.min(lastBlockOfObject, frontierBlock + Math.min(this.window, this.cfg.maxWindowBlocks)); b++) {
        if (this.held.has(b)) continue;
        // Readahead is a guess: skipped when memory is short or a read waits for it.
        if (this.cfg.memory && !this.cfg.memory.admits(bs, 'readahead')) break;
        if (!this.cfg.budget.tryTake()) break;
        this.hold(b, true);
      }
      // Behind the frontier, what reads still in flight within the slack may want is kept.
      this.dropOutside(Math.min(first, Math.floor(Math.max(0, this.frontier - SEQUENTIAL_SLACK) / bs)), Number.POSITIVE_INFINITY);
    } else {
      this.dropOutside(first, last);
    }

    return wanted;
  }

  /**
   * The handle reads `meta` from now on, whose bytes differ from the generation it read (a writer here
   * uploaded it): the blocks it holds, and those on their way (they are dropped, so a fetch of the old
   * generation that lands later is let go, never held), would answer reads of the new one with old
   * bytes. The sequential run starts over.
   */
  regenerate(meta: ObjectMeta): void {
    this.meta = meta;
    for (const index of [...this.held.keys()]) this.drop(index);
    this.frontier = 0;
    this.window = 1;
  }

  /** Gives back this file's share of the readahead budget; the handle is done. */
  close(): void {
    this.closed = true;
    this.unregister();
    for (const index of [...this.held.keys()]) this.drop(index);
  }

  /**
   * A read somewhere waits for memory: gives back blocks that have arrived and that no read of this
   * handle is using, those behind the reader first (read already), then those ahead, furthest first; all but the block the reader is in
   * ('spare'), and that one too once the handle has been idle a while ('idle'). Blocks still on their
   * way are kept: their memory is taken already, and dropping them would only waste the download.
   */
  private reclaim(level: ReclaimLevel, short: () => boolean): void {
    const current = Math.floor((this.frontier - 1) / this.source.blockSize);
    const keepCurrent = level === 'spare' || Date.now() - this.lastReadAt < IDLE_MS;
    const pinned = this.pinned ?? [0, -1];
    const arrived = [...this.held]
      .filter(([index, b]) => b.value !== null && !(keepCurrent && index === current) && !(index >= pinned[0] && index <= pinned[1]))
      .map(([index]) => index);
    // Behind the reader, then ahead of it; furthest from it first within each.
    arrived.sort((a, b) => ((a > current) !== (b > current) ? (a > current ? 1 : -1) : Math.abs(b - current) - Math.abs(a - current)));
    for (const index of arrived) {
      if (!short()) return;
      this.drop(index);
    }
  }

  private hold(index: number, ahead: boolean): HeldBlock {
    const existing = this.held.get(index);
    if (existing) return existing;
    const data = this.source.get(this.meta, index, ahead ? 'readahead' : 'demand', undefined, this.cfg.keepRecent);
    const block: HeldBlock = { data, value: null, ahead, dropped: false };
    data.then(
      (value) => {
        if (block.dropped) value.release();
        else block.value = value;
      },
      // A failed fetch must not be remembered: the next read tries again.
      () => {
        if (this.held.get(index) === block) this.drop(index);
      },
    );
    this.held.set(index, block);
    if (this.closed) this.drop(index);
    return block;
  }

  /**
   * Blocks before `first` (but one, for a reader that steps back a little) and after `last` are done
   * with: behind a sequential reader, or, after a seek, what was fetched ahead of the old position.
   */
  private dropOutside(first: number, last: number): void {
    for (const index of [...this.held.keys()]) if (index < first - 1 || index > last) this.drop(index);
  }

  private drop(index: number): void {
    const block = this.held.get(index);
    if (!block) return;
    this.held.delete(index);
    block.dropped = true;
    block.value?.release();
    block.value = null;
    if (block.ahead) this.cfg.budget.give();
  }
}
