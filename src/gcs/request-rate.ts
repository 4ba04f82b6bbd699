/**
 * Requests per second to GCS, per daemon: a token bucket whose rate follows what the bucket says
 * (rate-controller.ts sets it: AIMD on 429s, a slow start, a plateau, a ramped ceiling, and why).
 *
 * A concurrency limit cannot go below one request in flight, and one request in flight at 30 ms is
 * already 33 requests/s; several daemons sharing a bucket capped at a few dozen requests/s need a rate.
 * A Retry-After stops all grants until it has passed.
 *
 * Grants go to waiters in priority order: lookups and demand reads before readahead and prefetch.
 */
import { RateController, type RateControlConfig } from './rate-controller.js';

export type RatePriority = 'urgent' | 'background';

/** A waiter's priority, which may change while it waits (a readahead a reader starts waiting on). */
export interface PriorityRef {
  priority: RatePriority;
}

/**
 * The longest a Retry-After pauses the whole mount: the retry policy's longest backoff. One 429 that asked
 * for an hour (a proxy's, or an HTTP-date read with a clock behind) froze every request on the mount for
 * it; a server that still means it answers 429 again, and the pause starts over.
 */
const MAX_PAUSE_MS = 30_000;

export interface RequestRateConfig extends RateControlConfig {
  /** Seconds of tokens the bucket may hold: how large a burst is allowed after idling. */
  burstSeconds: number;
  now?: () => number;
  /** The wall clock (ms), shared by daemons on other machines: slow-start steps fall on its multiples. */
  wallNow?: () => number;
  /** Schedules `fn` after `ms`; returns a cancel function. Injected by tests. */
  schedule?: (fn: () => void, ms: number) => () => void;
}

export const DEFAULT_REQUEST_RATE: Omit<RequestRateConfig, 'initial' | 'max'> = {
  rampDoublingMs: 20 * 60_000,
  min: 1,
  increasePerSecond: 2,
  decreaseFactor: 0.9,
  settledDecreaseFactor: 0.95,
  settledIncreasePerSecond: 1,
  slowStartStepMs: 125,
  slowStartGrowth: 2,
  slowStartDecreaseFactor: 0.5,
  burstSeconds: 0.1,
};

/** What a grant hands back, so the outcome can be matched to the rate it was granted under. */
export interface RateGrant {
  readonly epoch: number;
  /** The rate (requests/s) the token was granted at. */
  readonly rate: number;
  /** Milliseconds spent waiting for the token. */
  readonly waitedMs: number;
}

interface Waiter {
  ref: PriorityRef;
  since: number;
  resolve: (g: RateGrant) => void;
}

/**
 * The limiter gcsfuse's flags ask for: `initialOpsPerSec` (--initial-ops-per-sec, 0 = no ramp) and
 * `limitOpsPerSec` (--limit-ops-per-sec, a hard cap; <= 0 = none). A cap alone starts the rate at the
 * cap; neither means no limiter at all (429s then only halve the requests in flight).
 */
export function requestRateForFlags(initialOpsPerSec: number, limitOpsPerSec: number, base: Omit<RequestRateConfig, 'initial' | 'max'> = DEFAULT_REQUEST_RATE): RequestRate | null {
  const max = limitOpsPerSec > 0 ? limitOpsPerSec : Number.POSITIVE_INFINITY;
  const initial = initialOpsPerSec > 0 ? initialOpsPerSec : max;
  return Number.isFinite(initial) ? new RequestRate({ ...base, initial, max }) : null;
}

export class RequestRate {
  private readonly now: () => number;
  private readonly schedule: (fn: () => void, ms: number) => () => void;
  /** What the rate is, and how 429s and saturated seconds move it. */
  private readonly control: RateController;
  private tokens: number;
  private lastRefill: number;
  private pausedUntil = 0;
  private readonly waiters: Waiter[] = [];
  private cancelTimer: (() => void) | null = null;

  // Counters for stats.
  grants = 0;
  waits = 0;
  waitedMs = 0;

  constructor(private readonly cfg: RequestRateConfig) {
    this.now = cfg.now ?? (() => performance.now());
    const wallNow = cfg.wallNow ?? (cfg.now ? cfg.now : () => Date.now());
    this.schedule =
      cfg.schedule ??
      ((fn, ms) => {
        const t = setTimeout(fn, ms);
        return () => clearTimeout(t);
      });
    const startedAt = this.now();
    this.lastRefill = startedAt;
    this.control = new RateController(cfg, { now: this.now, wallNow, startedAt }, () => this.refill());
    this.tokens = this.capacity();
  }

  /** The ceiling now: the initial rate doubled every ramp period since the start, within the hard max. */
  ceiling(): number {
    return this.control.ceiling();
  }

  /** Requests per second allowed now. */
  get rate(): number {
    return this.control.rate;
  }

  get queued(): number {
    return this.waiters.length;
  }

  /** Cuts of the rate so far. */
  get cuts(): number {
    return this.control.cuts;
  }

  /** Resolves when a token is granted; `ref.priority` is read at grant time, so it may be raised meanwhile. */
  acquire(ref: PriorityRef = { priority: 'urgent' }): Promise<RateGrant> {
    this.refill();
    if (this.waiters.length === 0 && this.tokens >= 1 && this.now() >= this.pausedUntil) {
      this.tokens -= 1;
      this.granted(this.now());
      return Promise.resolve({ epoch: this.control.epoch, rate: this.rate, waitedMs: 0 });
    }
    return new Promise((resolve) => {
      this.waiters.push({ ref, since: this.now(), resolve });
      this.control.waiting();
      this.arm();
    });
  }

  /** A request granted under `grant` was answered (anything but a 429). */
  succeeded(_grant: RateGrant): void {
    this.control.succeeded();
    this.grow();
  }

  /**
   * A request granted under `grant` was answered 429, with the server's Retry-After in seconds if any.
   * Returns whether this 429 cut the rate (the first of its overload).
   */
  throttled(grant: RateGrant, retryAfterSeconds: number | null): boolean {
    const t = this.now();
    if (retryAfterSeconds !== null && retryAfterSeconds > 0) {
      this.pausedUntil = Math.max(this.pausedUntil, t + Math.min(retryAfterSeconds * 1000, MAX_PAUSE_MS));
      this.arm();
    }
    if (!this.control.throttled(grant, t)) return false;
    this.tokens = Math.min(this.tokens, 0);
    return true;
  }

  close(): void {
    this.cancelTimer?.();
    this.cancelTimer = null;
  }

  private granted(t: number): void {
    this.grants++;
    this.control.granted(t);
  }

  private grow(): void {
    this.control.grow(this.waiters.length > 0);
  }

  private capacity(): number {
    return Math.max(1, this.rate * this.cfg.burstSeconds);
  }

  private refill(): void {
    const t = this.now();
    const from = Math.max(this.lastRefill, Math.min(t, this.pausedUntil));
    if (t > from) this.tokens = Math.min(this.capacity(), this.tokens + ((t - from) / 1000) * this.rate);
    this.lastRefill = t;
  }

  /** Grants what the bucket holds now, most urgent first, and sets a timer for the next token. */
  private pump(): void {
    this.cancelTimer = null;
    this.grow();
    this.refill();
    const t = this.now();
    while (this.waiters.length > 0 && this.tokens >= 1 && t >= this.pausedUntil) {
      let i = this.waiters.findIndex((w) => w.ref.priority === 'urgent');
      if (i < 0) i = 0;
      const [w] = this.waiters.splice(i, 1);
      this.tokens -= 1;
      this.granted(t);
      this.waits++;
      this.waitedMs += t - w!.since;
      w!.resolve({ epoch: this.control.epoch, rate: this.rate, waitedMs: t - w!.since });
    }
    this.arm();
  }

  private arm(): void {
    if (this.cancelTimer || this.waiters.length === 0) return;
    this.refill();
    const t = this.now();
    const untilToken = this.tokens >= 1 ? 0 : ((1 - this.tokens) / this.rate) * 1000;
    let delay = Math.max(untilToken, this.pausedUntil - t, 0);
    // While slow-starting the rate grows between grants: look again soon rather than at the old rate.
    if (t >= this.pausedUntil) {
      const toStep = this.control.untilNextStep();
      if (toStep !== null) delay = Math.min(delay, toStep);
    }
    this.cancelTimer = this.schedule(() => this.pump(), Math.max(1, Math.ceil(delay)));
  }
}
