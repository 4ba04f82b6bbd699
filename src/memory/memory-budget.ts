/**
 * Who asks for memory. Demand (a read waits on these bytes) waits for them; readahead and prefetch are
 * guesses, which take memory only when it is plentiful and nobody waits, and are skipped otherwise.
 * 'write' is a streamed file's bytes held ahead of its staged copy: taken on the same terms as a guess
 * (a refusal sends the write through the page cache instead), not counted as one.
 */
export type MemoryUse = 'demand' | 'readahead' | 'prefetch' | 'write';

/**
 * How hard a reclaimer is asked to give memory back. 'spare': what nobody is reading now (blocks fetched
 * ahead, blocks behind a reader, prefetched blocks). 'idle': also what a reader that has not read for a
 * while holds. Each holder gives back one piece at a time while `short()` still says so.
 */
export type ReclaimLevel = 'spare' | 'idle';
export type Reclaimer = (level: ReclaimLevel, short: () => boolean) => void;

export interface MemoryBudgetConfig {
  limitBytes: number;
  /**
   * Readahead and prefetch leave this much of the limit to demand: a reader arriving finds memory without
   * waiting for a guess to be read or dropped.
   */
  demandHeadroomBytes: number;
  /** A demand request stuck this long asks holders for their idle memory too ('idle'). */
  idleReclaimAfterMs: number;
}

/** Memory a holder has; give it back once with release(). */
export interface Reservation {
  readonly bytes: number;
  release(): void;
}

interface Waiter {
  bytes: number;
  since: number;
  grant: (r: Reservation) => void;
}

/**
 * One memory budget for the whole mount: every block buffer (demand, readahead, prefetch; later write
 * buffers) is taken from it, and nothing is allocated past the limit. Demand requests wait in FIFO order;
 * readahead and prefetch never wait, they are refused while demand waits or memory is short, so a guess
 * can never hold up a read. When demand has to wait, holders are asked to give back what nobody reads now
 * (reclaimers), then, if it still waits, what idle readers hold: every byte is then either on its way
 * back (a download or disk write finishing, a read copying out) or held by a reader that is reading, so
 * the head of the queue always gets its memory and a single reader always progresses (see DESIGN.md).
 * Other parts (listings) may be accounted here without being limited.
 */
export class MemoryBudget {
  private used = 0;
  private peak = 0;
  private readonly queue: Waiter[] = [];
  private readonly reclaimers = new Set<Reclaimer>();
  private readonly accounted = new Map<string, () => number>();
  private idleTimer: NodeJS.Timeout | null = null;
  private pumping = false;
  /** Counts for the metrics: demand requests that waited and for how long, guesses refused, reclaimer calls. */
  readonly counts = { waits: 0, waitMs: 0, readaheadRefused: 0, prefetchRefused: 0, reclaims: 0 };

  constructor(private readonly cfg: MemoryBudgetConfig) {
    if (!(cfg.limitBytes > 0)) throw new Error('memory limit must be positive');
  }

  get limit(): number {
    return this.cfg.limitBytes;
  }

  /** Bytes reserved now. */
  get inUse(): number {
    return this.used;
  }

  /** The most bytes ever reserved at once. */
  get peakInUse(): number {
    return this.peak;
  }

  /** Demand requests waiting for memory now. */
  get waiting(): number {
    return this.queue.length;
  }

  get waitingBytes(): number {
    return this.queue.reduce((n, w) => n + w.bytes, 0);
  }

  /** Bytes other parts report (listings), by name: shown with the budget, not limited by it (yet). */
  accountedBytes(): Record<string, number> {
    return Object.fromEntries([...this.accounted].map(([name, read]) => [name, read()]));
  }

  account(name: string, read: () => number): void {
    this.accounted.set(name, read);
  }

  /** A holder that can give memory back on request; returns the function that unregisters it. */
  addReclaimer(r: Reclaimer): () => void {
    this.reclaimers.add(r);
    return () => this.reclaimers.delete(r);
  }

  /**
   * Memory for a guess (readahead, prefetch), or null: refused while demand waits or when it would eat
   * into demand's headroom. Demand may use this too, to learn whether it would have to wait.
   */
  tryReserve(bytes: number, use: MemoryUse): Reservation | null {
    return this.admits(bytes, use) ? this.grant(bytes) : null;
  }

  /**
   * Whether tryReserve would grant `bytes` now, for a guess deciding whether to start at all; a refusal
   * counts as a guess skipped, as tryReserve's does.
   */
  admits(bytes: number, use: MemoryUse): boolean {
    const ceiling = use === 'demand' ? this.cfg.limitBytes : this.cfg.limitBytes - this.cfg.demandHeadroomBytes;
    if (this.queue.length === 0 && this.used + bytes <= ceiling) return true;
    if (use === 'readahead') this.counts.readaheadRefused++;
    else if (use === 'prefetch') this.counts.prefetchRefused++;
    return false;
  }

  /** Memory for demand: at once when there is room and nobody is ahead, else in FIFO order. */
  reserve(bytes: number): Reservation | Promise<Reservation> {
    const now = this.tryReserve(bytes, 'demand');
    if (now) return now;
    if (bytes > this.cfg.limitBytes) throw new Error(`a request of ${bytes} bytes can never fit a memory limit of ${this.cfg.limitBytes}`);
    this.counts.waits++;
    const waiting = new Promise<Reservation>((resolve) => this.queue.push({ bytes, since: Date.now(), grant: resolve }));
    this.pump();
    return waiting;
  }

  private grant(bytes: number): Reservation {
    this.used += bytes;
    if (this.used > this.peak) this.peak = this.used;
    let released = false;
    return {
      bytes,
      release: () => {
        if (released) throw new Error('memory released twice');
        released = true;
        this.used -= bytes;
        this.pump();
      },
    };
  }

  private fits(w: Waiter): boolean {
    return this.used + w.bytes <= this.cfg.limitBytes;
  }

  /**
   * Grants waiters in order while they fit; when the head does not, asks holders for spare memory, and
   * arms a timer that asks for idle memory too if it is still waiting then. Releases that reclaiming
   * causes come back here: the flag keeps that from recursing.
   */
  private pump(): void {
    if (this.pumping) return;
    this.pumping = true;
    try {
      this.grantFitting();
      if (this.queue.length > 0) {
        this.reclaim('spare');
        this.grantFitting();
      }
    } finally {
      this.pumping = false;
    }
    if (this.queue.length === 0) {
      if (this.idleTimer) clearTimeout(this.idleTimer);
      this.idleTimer = null;
    } else if (!this.idleTimer) {
      this.idleTimer = setTimeout(() => {
        this.idleTimer = null;
        if (this.queue.length === 0) return;
        this.pumping = true;
        try {
          this.reclaim('idle');
          this.grantFitting();
        } finally {
          this.pumping = false;
        }
        // Still waiting: try again later (an idle reader's memory, a finished download).
        this.pump();
      }, this.cfg.idleReclaimAfterMs);
      this.idleTimer.unref();
    }
  }

  private grantFitting(): void {
    while (this.queue.length > 0 && this.fits(this.queue[0]!)) {
      const w = this.queue.shift()!;
      this.counts.waitMs += Date.now() - w.since;
      w.grant(this.grant(w.bytes));
    }
  }

  private reclaim(level: ReclaimLevel): void {
    const short = () => this.queue.length > 0 && !this.fits(this.queue[0]!);
    for (const r of this.reclaimers) {
      if (!short()) return;
      this.counts.reclaims++;
      r(level, short);
    }
  }

  close(): void {
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = null;
  }
}
