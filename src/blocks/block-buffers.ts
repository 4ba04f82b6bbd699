import { alignedMemory, discardMemory, WASM_PAGE } from '../block-memory.js';
import { MemoryBudget, type MemoryUse, type Reservation } from '../memory/memory-budget.js';

/**
 * A block's bytes, shared by every reader of the block and by its write to disk. Each holder takes its
 * own reference and gives it back exactly once; the bytes must not be touched after that.
 */
export interface BlockData {
  readonly bytes: Buffer;
  /**
   * Bytes from the start of `bytes` that may be written with O_DIRECT: page-aligned memory of this many
   * bytes (so a length rounded up to the device's block stays inside it); 0 when not aligned.
   */
  readonly directCapacity: number;
  /** Another reference to the same bytes, for another holder. */
  retain(): BlockData;
  release(): void;
}

/**
 * Memory of its own for one lease at a time: page-aligned (WebAssembly.Memory is the one Node allocation
 * that is, which O_DIRECT needs), backed by RAM only once touched, in huge pages where the system allows
 * (src/block-memory.ts). One per buffer rather than slabs of many: an idle one goes back to the system
 * by itself, so memory follows use within seconds instead of waiting for a whole slab to empty.
 */
interface Chunk {
  memory: ArrayBufferLike | null;
  buffer: Buffer;
  idleSince: number;
}

/** A buffer of the pool, lent out until its last holder releases it. */
class Lease implements BlockData {
  private refs = 1;

  constructor(
    private readonly pool: BlockBuffers,
    private readonly chunk: Chunk,
    private readonly reservation: Reservation,
    private readonly length: number,
  ) {}

  get bytes(): Buffer {
    // Cheap enough to keep on: a read of released bytes would be a read of some other block's bytes.
    if (this.refs <= 0) throw new Error('block buffer used after release');
    return this.chunk.buffer.subarray(0, this.length);
  }

  get directCapacity(): number {
    return this.chunk.memory ? this.chunk.buffer.length : 0;
  }

  retain(): BlockData {
    if (this.refs <= 0) throw new Error('block buffer retained after release');
    this.refs++;
    return this;
  }

  release(): void {
    if (this.refs <= 0) throw new Error('block buffer released twice');
    if (--this.refs === 0) this.pool.giveBack(this.chunk, this.reservation);
  }
}

/** Bytes that belong to no pool (a test's, say): the garbage collector frees them. */
class Unpooled implements BlockData {
  constructor(readonly bytes: Buffer) {}
  readonly directCapacity = 0;
  retain(): BlockData {
    return this;
  }
  release(): void {}
}

export function unpooled(bytes: Buffer): BlockData {
  return new Unpooled(bytes);
}

/** Bytes [start, end) of another block's bytes (one block of a whole object), holding one reference to it. */
class Slice implements BlockData {
  private released = false;

  constructor(
    private readonly parent: BlockData,
    private readonly start: number,
    private readonly end: number,
  ) {}

  get bytes(): Buffer {
    if (this.released) throw new Error('block buffer used after release');
    return this.parent.bytes.subarray(this.start, this.end);
  }

  readonly directCapacity = 0;

  retain(): BlockData {
    if (this.released) throw new Error('block buffer retained after release');
    return new Slice(this.parent.retain(), this.start, this.end);
  }

  release(): void {
    if (this.released) throw new Error('block buffer released twice');
    this.released = true;
    this.parent.release();
  }
}

/** A view of bytes [start, end) of `parent` that takes over the caller's reference to `parent`. */
export function slice(parent: BlockData, start: number, end: number): BlockData {
  return new Slice(parent, start, end);
}

export interface BlockBuffersConfig {
  blockSize: number;
  /** Where every buffer's memory is reserved: nothing is allocated past its limit. */
  budget?: MemoryBudget;
  /** Without `budget`: the limit of a budget of the pool's own (a tool's, a test's). */
  maxBytes?: number;
  /**
   * Fill released buffers with a pattern: a holder that reads bytes after releasing them then returns
   * wrong bytes that the torture test's checksums catch (set by GCSMOUNT_POISON_RELEASED_BLOCKS=1).
   */
  poison: boolean;
  /** A free buffer unused for this long is given back to the system. */
  idleTrimMs: number;
  /** Buffers in shared memory (a SharedArrayBuffer each), which download workers can write into. */
  shared?: boolean;
  /** Called once the last buffer has gone back, with none lent out: the mount's reads are over for now. */
  onIdle?: () => void;
}

const POISON = 0xdb;

/**
 * Buffers for block data, reserved from the mount's memory budget and reused. A cold sequential read
 * otherwise allocates a fresh 4 MiB buffer per block: measured on the 2-core bench machine, page faults
 * on the new memory and the garbage collections that V8 runs for the external memory churn were the
 * largest single share of the daemon's CPU time. Block-sized buffers are kept for reuse while in use
 * recently; resident memory (lent out and kept) never exceeds the budget's limit, so a new buffer first
 * gives back kept ones when the two together would. Larger buffers (whole objects) are not kept.
 */
export class BlockBuffers {
  private readonly free: Chunk[] = [];
  private leased = 0;
  /** Set once the runtime refuses a WebAssembly.Memory: buffers are then plain ones (not aligned). */
  private alignedRefused = false;
  /** Buffers were lent since the pool was last found idle. */
  private busy = false;
  private readonly trimTimer: NodeJS.Timeout;
  private readonly cfg: BlockBuffersConfig & { budget: MemoryBudget };

  constructor(cfg: BlockBuffersConfig) {
    if (cfg.blockSize % WASM_PAGE !== 0) throw new Error('block size must be a multiple of 64 KiB');
    const budget = cfg.budget ?? new MemoryBudget({ limitBytes: cfg.maxBytes ?? cfg.blockSize, demandHeadroomBytes: 0, idleReclaimAfterMs: 250 });
    this.cfg = { ...cfg, budget };
    this.trimTimer = setInterval(() => this.trim(), Math.max(10, cfg.idleTrimMs / 2));
    this.trimTimer.unref();
  }

  get blockSize(): number {
    return this.cfg.blockSize;
  }

  get budget(): MemoryBudget {
    return this.cfg.budget;
  }

  /** Buffers lent out now. */
  get inUse(): number {
    return this.leased;
  }

  /** Free buffers kept for reuse (resident until trimmed). */
  get pooled(): number {
    return this.free.length;
  }

  /** Bytes of buffers lent out or kept: what the block buffers hold of the process's memory. */
  get residentBytes(): number {
    return this.cfg.budget.inUse + this.free.length * this.cfg.blockSize;
  }

  /**
   * A buffer for `length` bytes now, or null when the budget refuses (readahead and prefetch: the guess
   * is skipped; demand: it would have to wait, see leaseWhenFree). The caller holds one reference.
   */
  tryLease(length: number, use: MemoryUse): BlockData | null {
    const reservation = this.cfg.budget.tryReserve(this.capacityFor(length), use);
    return reservation ? this.lend(length, reservation) : null;
  }

  /** A buffer that must be had now (a tool's or a test's few): throws when the budget is spent. */
  lease(length: number): BlockData {
    const lease = this.tryLease(length, 'demand');
    if (!lease) throw new Error(`memory budget spent: no buffer for ${length} bytes`);
    return lease;
  }

  /** A buffer for a read that waits on it: at once if the budget allows, else in turn (FIFO). */
  leaseWhenFree(length: number): BlockData | Promise<BlockData> {
    const reservation = this.cfg.budget.reserve(this.capacityFor(length));
    return reservation instanceof Promise ? reservation.then((r) => this.lend(length, r)) : this.lend(length, reservation);
  }

  private capacityFor(length: number): number {
    return length <= this.cfg.blockSize ? this.cfg.blockSize : Math.ceil(length / WASM_PAGE) * WASM_PAGE;
  }

  private lend(length: number, reservation: Reservation): BlockData {
    const chunk = reservation.bytes === this.cfg.blockSize && this.free.length > 0 ? this.free.pop()! : this.newChunk(reservation.bytes);
    this.leased++;
    this.busy = true;
    return new Lease(this, chunk, reservation, length);
  }

  private newChunk(bytes: number): Chunk {
    // Lent plus kept stays within the limit: kept buffers go first (the reservation is counted already).
    while (this.free.length > 0 && this.residentBytes > this.cfg.budget.limit) this.discard(this.free.shift()!);
    if (!this.alignedRefused) {
      try {
        // Shared, for download workers to receive bodies into (range-workers.ts).
        const memory = alignedMemory(bytes, this.cfg.shared === true);
        return { memory, buffer: Buffer.from(memory), idleSince: 0 };
      } catch {
        // Out of address space for another WebAssembly.Memory: plain buffers still work, only slower.
        this.alignedRefused = true;
      }
    }
    return { memory: null, buffer: Buffer.allocUnsafeSlow(bytes), idleSince: 0 };
  }

  /** Called by a lease whose last reference is gone. */
  giveBack(chunk: Chunk, reservation: Reservation): void {
    this.leased--;
    if (this.cfg.poison) chunk.buffer.fill(POISON);
    if (chunk.buffer.length === this.cfg.blockSize) {
      chunk.idleSince = Date.now();
      this.free.push(chunk);
    } else {
      this.discard(chunk);
    }
    // Last: the release may hand memory straight to a waiting read, which may take this very buffer.
    reservation.release();
  }

  /** Its pages go back to the system now, not whenever the garbage collector frees the memory. */
  private discard(chunk: Chunk): void {
    if (chunk.memory) discardMemory(chunk.memory);
  }

  /** Free buffers unused for a while are given back. The oldest are at the front (reuse takes the newest). */
  private trim(): void {
    const now = Date.now();
    let n = 0;
    while (n < this.free.length && now - this.free[n]!.idleSince >= this.cfg.idleTrimMs) n++;
    for (const chunk of this.free.splice(0, n)) this.discard(chunk);
    if (this.busy && this.leased === 0 && this.free.length === 0) {
      this.busy = false;
      this.cfg.onIdle?.();
    }
  }

  close(): void {
    clearInterval(this.trimTimer);
    for (const chunk of this.free.splice(0)) this.discard(chunk);
  }
}
