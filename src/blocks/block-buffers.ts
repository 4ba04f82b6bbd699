/**
 * A block's bytes, shared by every reader of the block and by its write to disk. Each holder takes its
 * own reference and gives it back exactly once; the bytes must not be touched after that.
 */
export interface BlockData {
  readonly bytes: Buffer;
  /** Another reference to the same bytes, for another holder. */
  retain(): BlockData;
  release(): void;
}

/** A buffer of the pool, lent out until its last holder releases it. */
class Lease implements BlockData {
  private refs = 1;

  constructor(
    private readonly pool: BlockBuffers,
    private readonly buffer: Buffer,
    private readonly length: number,
  ) {}

  get bytes(): Buffer {
    // Cheap enough to keep on: a read of released bytes would be a read of some other block's bytes.
    if (this.refs <= 0) throw new Error('block buffer used after release');
    return this.buffer.subarray(0, this.length);
  }

  retain(): BlockData {
    if (this.refs <= 0) throw new Error('block buffer retained after release');
    this.refs++;
    return this;
  }

  release(): void {
    if (this.refs <= 0) throw new Error('block buffer released twice');
    if (--this.refs === 0) this.pool.giveBack(this.buffer);
  }
}

/** Bytes that belong to no pool (a whole small object, say): the garbage collector frees them. */
class Unpooled implements BlockData {
  constructor(readonly bytes: Buffer) {}
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
  /** Free buffers kept for reuse; beyond that a released buffer is left to the garbage collector. */
  maxFree: number;
  /**
   * Fill released buffers with a pattern: a holder that reads bytes after releasing them then returns
   * wrong bytes that the torture test's checksums catch (set by GCSMOUNT_POISON_RELEASED_BLOCKS=1).
   */
  poison: boolean;
  /** A pool unused this long hands its free buffers back to the garbage collector. */
  idleTrimMs: number;
}

const POISON = 0xdb;

/**
 * Block-sized buffers, reused. A cold sequential read otherwise allocates a fresh 4 MiB buffer per block:
 * measured on the 2-core bench machine, page faults on the new memory and the garbage collections that
 * V8 runs for the external memory churn were the largest single share of the daemon's CPU time.
 */
export class BlockBuffers {
  private readonly free: Buffer[] = [];
  private leased = 0;
  private usedSinceTrim = false;
  private readonly trimTimer: NodeJS.Timeout;

  constructor(private readonly cfg: BlockBuffersConfig) {
    this.trimTimer = setInterval(() => {
      if (!this.usedSinceTrim) this.free.length = 0;
      this.usedSinceTrim = false;
    }, cfg.idleTrimMs);
    this.trimTimer.unref();
  }

  get blockSize(): number {
    return this.cfg.blockSize;
  }

  /** Buffers lent out now. */
  get inUse(): number {
    return this.leased;
  }

  get pooled(): number {
    return this.free.length;
  }

  /** A buffer for `length` bytes (at most a block), with one reference held by the caller. */
  lease(length: number): BlockData {
    if (length > this.cfg.blockSize) throw new Error(`lease of ${length} bytes exceeds the block size`);
    this.usedSinceTrim = true;
    this.leased++;
    return new Lease(this, this.free.pop() ?? Buffer.allocUnsafeSlow(this.cfg.blockSize), length);
  }

  /** Called by a lease whose last reference is gone. */
  giveBack(buffer: Buffer): void {
    this.leased--;
    if (this.cfg.poison) buffer.fill(POISON);
    if (this.free.length < this.cfg.maxFree) this.free.push(buffer);
  }

  close(): void {
    clearInterval(this.trimTimer);
    this.free.length = 0;
  }
}
