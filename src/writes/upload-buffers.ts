import { alignedMemory, discardMemory, WASM_PAGE } from '../block-memory.js';
import type { MemoryBudget, Reservation } from '../memory/memory-budget.js';

/** A chunk's memory, lent for one upload request or one streamed file's chunk. */
export interface UploadBuffer {
  readonly bytes: Buffer;
  /** Page-aligned (O_DIRECT may write it straight from here). */
  readonly aligned: boolean;
  release(): void;
}

interface Pooled {
  buffer: Buffer;
  /** The page-aligned memory under `buffer`, or null for a plain Buffer. */
  memory: ArrayBufferLike | null;
  reservation: Reservation;
}

/**
 * Memory for upload chunks, reused between chunks. A fresh 32 MiB Buffer is a fresh mmap: every page of
 * it faults and is zeroed by the kernel before the staged file's bytes are read into it, which cost more
 * CPU than the read itself (perf, 1 GiB streamed: 10% of the daemon's cycles in clear_page). A buffer
 * keeps its reservation of the memory budget while it waits here, so the budget always sees it;
 * buffers idle for `idleMs`, or wanted by a read waiting for memory, are given back. Chunk-sized buffers
 * are page-aligned (a WebAssembly.Memory each, as block buffers are) so a streamed file's chunk can go to
 * its staged copy with O_DIRECT, past the page cache. Idle buffers are kept up to `keep`, or up to the
 * most lent at once since the pool was last idle, whichever is more: many files written at once (a
 * checkpoint's 16 writers) hand their chunks on to the next files rather than allocate and fault fresh
 * memory each time (4 kept: 193 MiB/s and 1.76 CPU-s per GiB in the write bench's checkpoint; 32: 241
 * and 1.60).
 */
export class UploadBuffers {
  private readonly free: Pooled[] = [];
  private timer: NodeJS.Timeout | null = null;
  private lastUse = 0;
  private readonly unregister: () => void;
  private alignedRefused = false;
  /** Chunk buffers lent out now, and the most at once since the pool was last idle. */
  private lent = 0;
  private peak = 0;

  constructor(
    private readonly memory: MemoryBudget,
    /** The size buffers are pooled at (the upload chunk size); larger or smaller requests take a slice or their own. */
    private readonly chunkBytes: number,
    private readonly keep = 4,
    private readonly idleMs = 1000,
    /** In shared memory (a SharedArrayBuffer each), which download workers send upload chunks from. */
    private readonly shared = false,
  ) {
    // A read waiting for memory gets idle chunk buffers first: they hold nothing anyone needs.
    this.unregister = memory.addReclaimer((_level, short) => {
      while (this.free.length > 0 && short()) this.discard(this.free.pop()!);
    });
  }

  /** Bytes held by idle buffers. */
  get idleBytes(): number {
    return this.free.length * this.chunkBytes;
  }

  /** A buffer for an upload request: waits for memory when the budget is spent. */
  async take(length: number): Promise<UploadBuffer> {
    this.lastUse = Date.now();
    if (length > this.chunkBytes) {
      const reservation = await this.memory.reserve(length);
      return { bytes: Buffer.allocUnsafe(length), aligned: false, release: () => reservation.release() };
    }
    const pooled = this.free.pop() ?? this.fresh(await this.memory.reserve(this.chunkBytes));
    return this.lend(pooled, length);
  }

  /**
   * A whole chunk for a streamed file's bytes, now or never: memory is taken only as a guess would take
   * it (leaving demand its headroom), since the file can always go through the page cache instead.
   */
  tryTakeChunk(): UploadBuffer | null {
    this.lastUse = Date.now();
    let pooled = this.free.pop();
    if (!pooled) {
      const reservation = this.memory.tryReserve(this.chunkBytes, 'write');
      if (!reservation) return null;
      pooled = this.fresh(reservation);
    }
    return this.lend(pooled, this.chunkBytes);
  }

  /** Idle buffers' memory back to the budget and none kept from now on (the mount stops). */
  close(): void {
    this.unregister();
    this.drop();
  }

  /** Every idle buffer's memory back to the budget (nothing uploads, or a reader waits for memory). */
  drop(): void {
    for (const p of this.free.splice(0)) this.discard(p);
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private fresh(reservation: Reservation): Pooled {
    if (!this.alignedRefused && this.chunkBytes % WASM_PAGE === 0) {
      try {
        const memory = alignedMemory(this.chunkBytes, this.shared);
        return { buffer: Buffer.from(memory), memory, reservation };
      } catch {
        // Out of address space for another WebAssembly.Memory: plain buffers work, through the page cache.
        this.alignedRefused = true;
      }
    }
    return { buffer: Buffer.allocUnsafeSlow(this.chunkBytes), memory: null, reservation };
  }

  private lend(lent: Pooled, length: number): UploadBuffer {
    this.lent++;
    this.peak = Math.max(this.peak, this.lent);
    let given = false;
    return {
      bytes: lent.buffer.subarray(0, length),
      aligned: lent.memory !== null,
      release: () => {
        if (given) return;
        given = true;
        this.giveBack(lent);
      },
    };
  }

  private discard(pooled: Pooled): void {
    // Its pages go back to the system now, not whenever the garbage collector frees the memory.
    if (pooled.memory) discardMemory(pooled.memory);
    pooled.reservation.release();
  }

  private giveBack(pooled: Pooled): void {
    this.lastUse = Date.now();
    this.lent--;
    if (this.free.length + this.lent >= Math.max(this.keep, this.peak)) {
      this.discard(pooled);
      return;
    }
    this.free.push(pooled);
    this.timer ??= setTimeout(() => this.expire(), this.idleMs).unref();
  }

  private expire(): void {
    this.timer = null;
    if (this.free.length === 0) return;
    const idle = Date.now() - this.lastUse;
    if (idle >= this.idleMs) {
      this.drop();
      this.peak = this.lent;
    }
    else this.timer = setTimeout(() => this.expire(), this.idleMs - idle).unref();
  }
}
