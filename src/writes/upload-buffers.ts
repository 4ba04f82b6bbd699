import type { MemoryBudget, Reservation } from '../memory/memory-budget.js';

/** A chunk's memory, lent for one upload request. */
export interface UploadBuffer {
  readonly bytes: Buffer;
  release(): void;
}

interface Pooled {
  buffer: Buffer;
  reservation: Reservation;
}

/**
 * Memory for upload chunks, reused between chunks. A fresh 32 MiB Buffer is a fresh mmap: every page of
 * it faults and is zeroed by the kernel before the staged file's bytes are read into it, which cost more
 * CPU than the read itself (perf, 1 GiB streamed: 10% of the daemon's cycles in clear_page). A buffer
 * keeps its reservation of the memory budget while it waits here, so the budget always sees it;
 * buffers idle for `idleMs`, or wanted by a read waiting for memory, are given back.
 */
export class UploadBuffers {
  private readonly free: Pooled[] = [];
  private timer: NodeJS.Timeout | null = null;
  private lastUse = 0;
  private readonly unregister: () => void;

  constructor(
    private readonly memory: MemoryBudget,
    /** The size buffers are pooled at (the upload chunk size); larger or smaller requests take a slice or their own. */
    private readonly chunkBytes: number,
    private readonly keep = 4,
    private readonly idleMs = 1000,
  ) {
    // A read waiting for memory gets idle chunk buffers first: they hold nothing anyone needs.
    this.unregister = memory.addReclaimer((_level, short) => {
      while (this.free.length > 0 && short()) this.free.pop()!.reservation.release();
    });
  }

  /** Bytes held by idle buffers. */
  get idleBytes(): number {
    return this.free.length * this.chunkBytes;
  }

  async take(length: number): Promise<UploadBuffer> {
    this.lastUse = Date.now();
    if (length > this.chunkBytes) {
      const reservation = await this.memory.reserve(length);
      return { bytes: Buffer.allocUnsafe(length), release: () => reservation.release() };
    }
    let pooled = this.free.pop();
    if (!pooled) {
      const reservation = await this.memory.reserve(this.chunkBytes);
      pooled = { buffer: Buffer.allocUnsafeSlow(this.chunkBytes), reservation };
    }
    const lent = pooled;
    let given = false;
    return {
      bytes: lent.buffer.subarray(0, length),
      release: () => {
        if (given) return;
        given = true;
        this.giveBack(lent);
      },
    };
  }

  /** Idle buffers' memory back to the budget and none kept from now on (the mount stops). */
  close(): void {
    this.unregister();
    this.drop();
  }

  /** Every idle buffer's memory back to the budget (nothing uploads, or a reader waits for memory). */
  drop(): void {
    for (const p of this.free.splice(0)) p.reservation.release();
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private giveBack(pooled: Pooled): void {
    this.lastUse = Date.now();
    if (this.free.length >= this.keep) {
      pooled.reservation.release();
      return;
    }
    this.free.push(pooled);
    this.timer ??= setTimeout(() => this.expire(), this.idleMs).unref();
  }

  private expire(): void {
    this.timer = null;
    if (this.free.length === 0) return;
    const idle = Date.now() - this.lastUse;
    if (idle >= this.idleMs) this.drop();
    else this.timer = setTimeout(() => this.expire(), this.idleMs - idle).unref();
  }
}
