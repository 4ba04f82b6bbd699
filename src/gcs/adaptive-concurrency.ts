/**
 * How many requests may be in flight to GCS at once, adapted to what GCS says: halved on a 429 (at most
 * once per cooldown, since one overload answers many requests at once), grown back by one slot per
 * window of successes. Several machines sharing one bucket each do this, and together they settle just
 * under the bucket's limit instead of storming it (additive increase, multiplicative decrease).
 */
export interface AdaptiveConcurrencyConfig {
  max: number;
  min: number;
  /** Milliseconds; decreases closer together than this count once. */
  cooldownMs: number;
  now?: () => number;
}

export type Outcome = 'ok' | 'throttled' | 'failed';

export class AdaptiveConcurrency {
  private limit: number;
  private inUse = 0;
  private readonly waiters: (() => void)[] = [];
  private lastDecrease = Number.NEGATIVE_INFINITY;
  private readonly now: () => number;

  constructor(private readonly cfg: AdaptiveConcurrencyConfig) {
    this.limit = cfg.max;
    this.now = cfg.now ?? (() => performance.now());
  }

  /** The current limit, in whole requests. */
  get current(): number {
    return Math.floor(this.limit);
  }

  get inFlight(): number {
    return this.inUse;
  }

  async acquire(): Promise<void> {
    if (this.inUse < this.current) {
      this.inUse++;
      return;
    }
    await new Promise<void>((resolve) => this.waiters.push(resolve));
  }

  release(outcome: Outcome): void {
    if (outcome === 'throttled') {
      const t = this.now();
      if (t - this.lastDecrease >= this.cfg.cooldownMs) {
        this.limit = Math.max(this.cfg.min, Math.floor(this.limit / 2));
        this.lastDecrease = t;
      }
    } else if (outcome === 'ok') {
      this.limit = Math.min(this.cfg.max, this.limit + 1 / Math.max(1, this.limit));
    }
    this.inUse--;
    while (this.inUse < this.current && this.waiters.length > 0) {
      this.inUse++;
      this.waiters.shift()!();
    }
  }
}
