/**
 * Bytes per second read from GCS, per daemon (gcsfuse's --limit-bytes-per-sec): a token bucket of bytes.
 *
 * Each range read takes its length before its first attempt. The bucket holds one second of bytes, and
 * at least the largest read the mount makes (`minCapacity`: a block, or a whole small object), so a read
 * never leaves it in debt that a reader's next read would wait out behind a prefetch; one larger still
 * is let through once the bucket is full. gcsfuse's holds its rate times 576 s, which lets the first
 * ten minutes of a job through unthrottled.
 *
 * Waiters are granted most urgent first (a reader's own read before readahead and prefetch), in order
 * of arrival within a priority; a priority raised while waiting is seen at the next grant.
 */
import type { PriorityRef } from './request-rate.js';

export interface ByteRateConfig {
  bytesPerSecond: number;
  /** The largest read the mount makes: the bucket holds at least this much. */
  minCapacity?: number;
  now?: () => number;
  /** Schedules `fn` after `ms`; returns a cancel function. Injected by tests. */
  schedule?: (fn: () => void, ms: number) => () => void;
}

interface Waiter {
  bytes: number;
  ref: PriorityRef;
  since: number;
  resolve: (waitedMs: number) => void;
  reject: (err: Error) => void;
}

export class ByteRate {
  private readonly now: () => number;
  private readonly schedule: (fn: () => void, ms: number) => () => void;
  private readonly capacity: number;
  private tokens: number;
  private lastRefill: number;
  private readonly waiters: Waiter[] = [];
  private cancelTimer: (() => void) | null = null;
  private closedBy: Error | null = null;

  constructor(private readonly cfg: ByteRateConfig) {
    if (!(cfg.bytesPerSecond > 0)) throw new RangeError(`ByteRate: ${cfg.bytesPerSecond} bytes/s`);
    this.now = cfg.now ?? (() => performance.now());
    this.schedule =
      cfg.schedule ??
      ((fn, ms) => {
        const t = setTimeout(fn, ms);
        return () => clearTimeout(t);
      });
    this.capacity = Math.max(cfg.bytesPerSecond, cfg.minCapacity ?? 0, 1);
    this.tokens = this.capacity;
    this.lastRefill = this.now();
  }

  get queued(): number {
    return this.waiters.length;
  }

  /** Resolves with the milliseconds waited once `bytes` may be read; rejects once closed. */
  acquire(bytes: number, ref: PriorityRef = { priority: 'urgent' }): Promise<number> {
    if (this.closedBy) return Promise.reject(this.closedBy);
    this.refill();
    if (this.waiters.length === 0 && this.tokens >= this.needed(bytes)) {
      this.tokens -= bytes;
      return Promise.resolve(0);
    }
    return new Promise((resolve, reject) => {
      this.waiters.push({ bytes, ref, since: this.now(), resolve, reject });
      // The newcomer goes first (urgent behind background ones): the timer armed for the waiter before
      // it may be far off, while the bucket may hold enough for this one now.
      if (this.next() === this.waiters.length - 1) {
        this.cancelTimer?.();
        this.cancelTimer = null;
        this.pump();
      } else this.arm();
    });
  }

  /** Fails every waiter (and later acquire) with `err`: the client is closing. */
  close(err: Error): void {
    this.closedBy = err;
    this.cancelTimer?.();
    this.cancelTimer = null;
    for (const w of this.waiters.splice(0)) w.reject(err);
  }

  /** A read waits for no more than a full bucket, so one larger than it is still granted. */
  private needed(bytes: number): number {
    return Math.min(bytes, this.capacity);
  }

  private refill(): void {
    const t = this.now();
    if (t > this.lastRefill) this.tokens = Math.min(this.capacity, this.tokens + ((t - this.lastRefill) / 1000) * this.cfg.bytesPerSecond);
    this.lastRefill = t;
  }

  /** The waiter granted next: the first urgent one, else the first. */
  private next(): number {
    const i = this.waiters.findIndex((w) => w.ref.priority === 'urgent');
    return i < 0 ? 0 : i;
  }

  private pump(): void {
    this.cancelTimer = null;
    this.refill();
    const t = this.now();
    while (this.waiters.length > 0) {
      const i = this.next();
      const w = this.waiters[i]!;
      if (this.tokens < this.needed(w.bytes)) break;
      this.waiters.splice(i, 1);
      this.tokens -= w.bytes;
      w.resolve(t - w.since);
    }
    this.arm();
  }

  private arm(): void {
    if (this.cancelTimer || this.waiters.length === 0 || this.closedBy) return;
    this.refill();
    const short = this.needed(this.waiters[this.next()]!.bytes) - this.tokens;
    const delay = short <= 0 ? 0 : (short / this.cfg.bytesPerSecond) * 1000;
    this.cancelTimer = this.schedule(() => this.pump(), Math.max(1, Math.ceil(delay)));
  }
}
