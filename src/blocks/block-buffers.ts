import { adviseHugePages, discardMemory } from '../block-memory.js';

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

/** Where a lease's bytes live: a slot of a slab, or (when the slabs are all lent out) a buffer of its own. */
interface Slot {
  slab: Slab | null;
  buffer: Buffer;
}

/** A buffer of the pool, lent out until its last holder releases it. */
class Lease implements BlockData {
  private refs = 1;

  constructor(
    private readonly pool: BlockBuffers,
    private readonly slot: Slot,
    private readonly length: number,
  ) {}

  get bytes(): Buffer {
    // Cheap enough to keep on: a read of released bytes would be a read of some other block's bytes.
    if (this.refs <= 0) throw new Error('block buffer used after release');
    return this.slot.buffer.subarray(0, this.length);
  }

  get directCapacity(): number {
    return this.slot.slab ? this.slot.buffer.length : 0;
  }

  retain(): BlockData {
    if (this.refs <= 0) throw new Error('block buffer retained after release');
    this.refs++;
    return this;
  }

  release(): void {
    if (this.refs <= 0) throw new Error('block buffer released twice');
    if (--this.refs === 0) this.pool.giveBack(this.slot);
  }
}

/** Bytes that belong to no pool (a whole small object, say): the garbage collector frees them. */
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

export interface BlockBuffersConfig {
  blockSize: number;
  /** Memory the pool may hold in slabs, lent out or free; beyond it, leases get buffers of their own. */
  maxBytes: number;
  /**
   * Fill released buffers with a pattern: a holder that reads bytes after releasing them then returns
   * wrong bytes that the torture test's checksums catch (set by GCSMOUNT_POISON_RELEASED_BLOCKS=1).
   */
  poison: boolean;
  /** A slab with nothing lent out for this long is dropped, its pages given back to the system at once. */
  idleTrimMs: number;
}

const POISON = 0xdb;
/** Slabs are allocated this size (or one block, if larger): few allocations, and unused ones can go. */
const SLAB_BYTES = 64 * 1024 * 1024;

/**
 * Page-aligned memory cut into block-sized slots. WebAssembly.Memory is the one allocation Node offers
 * whose address is page-aligned, which O_DIRECT needs (a Buffer's is not); its pages are only backed by
 * RAM once touched, in huge pages where the system allows (src/block-memory.ts).
 */
class Slab {
  readonly free: Buffer[] = [];
  readonly memory: ArrayBuffer;
  lent = 0;
  idleSince = 0;

  constructor(blockSize: number, slots: number) {
    const pages = (blockSize * slots) / 65536;
    this.memory = new WebAssembly.Memory({ initial: pages, maximum: pages }).buffer;
    // Before any page is touched: faults then fill 2 MiB at a time.
    adviseHugePages(this.memory);
    const all = Buffer.from(this.memory);
    // Handed out from the front, so a lightly used slab touches few pages.
    for (let i = slots - 1; i >= 0; i--) this.free.push(all.subarray(i * blockSize, (i + 1) * blockSize));
  }
}

/**
 * Block-sized buffers, reused. A cold sequential read otherwise allocates a fresh 4 MiB buffer per block:
 * measured on the 2-core bench machine, page faults on the new memory and the garbage collections that
 * V8 runs for the external memory churn were the largest single share of the daemon's CPU time. Slots
 * are page-aligned, so the disk cache can write them with O_DIRECT.
 */
export class BlockBuffers {
  private readonly slabs: Slab[] = [];
  private readonly slotsPerSlab: number;
  private readonly maxSlabs: number;
  private leased = 0;
  /** Set once the runtime refuses a slab: leases then get buffers of their own. */
  private slabsRefused = false;
  private readonly trimTimer: NodeJS.Timeout;

  constructor(private readonly cfg: BlockBuffersConfig) {
    if (cfg.blockSize % 65536 !== 0) throw new Error('block size must be a multiple of 64 KiB');
    this.slotsPerSlab = Math.max(1, Math.floor(Math.min(SLAB_BYTES, cfg.maxBytes) / cfg.blockSize));
    this.maxSlabs = Math.max(1, Math.floor(cfg.maxBytes / (this.slotsPerSlab * cfg.blockSize)));
    this.trimTimer = setInterval(() => this.trim(), cfg.idleTrimMs);
    this.trimTimer.unref();
  }

  get blockSize(): number {
    return this.cfg.blockSize;
  }

  /** Buffers lent out now. */
  get inUse(): number {
    return this.leased;
  }

  /** Slots free for reuse in the slabs held now. */
  get pooled(): number {
    return this.slabs.reduce((n, s) => n + s.free.length, 0);
  }

  /** A buffer for `length` bytes (at most a block), with one reference held by the caller. */
  lease(length: number): BlockData {
    if (length > this.cfg.blockSize) throw new Error(`lease of ${length} bytes exceeds the block size`);
    const slot = this.slot();
    this.leased++;
    return new Lease(this, slot, length);
  }

  private slot(): Slot {
    let slab = this.slabs.find((s) => s.free.length > 0);
    if (!slab && !this.slabsRefused && this.slabs.length < this.maxSlabs) {
      try {
        slab = new Slab(this.cfg.blockSize, this.slotsPerSlab);
        this.slabs.push(slab);
      } catch {
        // Out of address space for another WebAssembly.Memory: plain buffers still work, only slower.
        this.slabsRefused = true;
      }
    }
    if (!slab) return { slab: null, buffer: Buffer.allocUnsafeSlow(this.cfg.blockSize) };
    slab.lent++;
    return { slab, buffer: slab.free.pop()! };
  }

  /** Called by a lease whose last reference is gone. */
  giveBack(slot: Slot): void {
    this.leased--;
    if (this.cfg.poison) slot.buffer.fill(POISON);
    const slab = slot.slab;
    if (!slab) return;
    slab.free.push(slot.buffer);
    if (--slab.lent === 0) slab.idleSince = Date.now();
  }

  /** Slabs with nothing lent out for a while are dropped; the garbage collector returns their memory. */
  private trim(): void {
    const now = Date.now();
    for (let i = this.slabs.length - 1; i >= 0; i--) {
      const s = this.slabs[i]!;
      if (s.lent === 0 && now - s.idleSince >= this.cfg.idleTrimMs) {
        this.slabs.splice(i, 1);
        // Nothing is lent out of it: its pages go back now, not whenever the garbage collector runs.
        discardMemory(s.memory);
      }
    }
  }

  close(): void {
    clearInterval(this.trimTimer);
    this.slabs.length = 0;
  }
}
