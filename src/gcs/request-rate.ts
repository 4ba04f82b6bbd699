/**
 * Requests per second to GCS, per daemon: a token bucket whose rate follows what the bucket says.
 *
 * A concurrency limit cannot go below one request in flight, and one request in flight at 30 ms is
 * already 33 requests/s; several daemons sharing a bucket capped at a few dozen requests/s need a rate.
 * The rate is AIMD: it grows by a fixed `increasePerSecond` every second in which requests waited for
 * tokens and none was throttled, and on a 429 it is cut to `decreaseFactor` times the rate GCS actually
 * accepted over the last second (not the nominal rate, which may be far above anything ever sent).
 * K daemons doing this on one bucket converge to about 1/K each: every cut shrinks the differences
 * between them by the factor, every increase adds the same amount to each (Chiu and Jain's argument for
 * TCP). A cut counts once per overload: a 429 on a request granted before the last cut is the same
 * overload answering late.
 *
 * The rate never exceeds the ceiling, which follows GCS's request-rate guidelines (a bucket starts at
 * about 5,000 reads/s and should be ramped by doubling no faster than every 20 minutes): `initial`,
 * doubled every `rampDoublingMs` since the start, and never above the hard `max` (gcsfuse's
 * --limit-ops-per-sec). A Retry-After stops all grants until it has passed.
 *
 * Grants go to waiters in priority order: lookups and demand reads before readahead and prefetch.
 */
export type RatePriority = 'urgent' | 'background';

/** A waiter's priority, which may change while it waits (a readahead a reader starts waiting on). */
export interface PriorityRef {
  priority: RatePriority;
}

export interface RequestRateConfig {
  /** Requests/s the ceiling starts at (and the rate, until the first 429). */
  initial: number;
  /** Hard cap in requests/s (gcsfuse's --limit-ops-per-sec); Infinity = none. */
  max: number;
  /** The ceiling doubles every this many ms; Infinity = never. */
  rampDoublingMs: number;
  /** Lowest rate a cut can reach, requests/s. */
  min: number;
  /** Requests/s added per second of saturated, unthrottled use. */
  increasePerSecond: number;
  /** A 429 cuts the rate to this fraction of the accepted rate. */
  decreaseFactor: number;
  /** Seconds of tokens the bucket may hold: how large a burst is allowed after idling. */
  burstSeconds: number;
  now?: () => number;
  /** Schedules `fn` after `ms`; returns a cancel function. Injected by tests. */
  schedule?: (fn: () => void, ms: number) => () => void;
}

export const DEFAULT_REQUEST_RATE: Omit<RequestRateConfig, 'initial' | 'max'> = {
  rampDoublingMs: 20 * 60_000,
  min: 1,
  increasePerSecond: 5,
  decreaseFactor: 0.75,
  burstSeconds: 0.1,
};

/** What a grant hands back, so the outcome can be matched to the rate it was granted under. */
export interface RateGrant {
  readonly epoch: number;
  /** Milliseconds spent waiting for the token. */
  readonly waitedMs: number;
}

interface Waiter {
  ref: PriorityRef;
  since: number;
  resolve: (g: RateGrant) => void;
}

/** Successes in the last second are counted in buckets of this many ms. */
const WINDOW_SLOT_MS = 100;
const WINDOW_SLOTS = 10;
/** Saturated seconds without a 429 before the increase starts doubling. */
const CALM_SECONDS = 5;
/** The step grows to at most 2^this times the additive step: a daemon that misses the 429s of an overload must not run away. */
const MAX_DOUBLINGS = 2;

export class RequestRate {
  private readonly now: () => number;
  private readonly schedule: (fn: () => void, ms: number) => () => void;
  private readonly startedAt: number;
  private rateValue: number;
  private tokens: number;
  private lastRefill: number;
  private pausedUntil = 0;
  /** Bumped at each cut: outcomes of grants from an older epoch do not cut again. */
  private epoch = 0;
  private readonly waiters: Waiter[] = [];
  private cancelTimer: (() => void) | null = null;
  /** Accepted requests per 100 ms slot over the last second (a ring). */
  private readonly accepted = new Array<number>(WINDOW_SLOTS).fill(0);
  private slotStart: number;
  private slot = 0;
  /** When requests started flowing after a quiet second: the accepted rate is measured from then at most. */
  private activeSince: number;
  private lastGrantAt = Number.NEGATIVE_INFINITY;
  /** Since when requests have waited for tokens with no 429 (null: not saturated). */
  private growSince: number | null = null;
  /** Saturated seconds in a row without a 429: past a few, the steps double (capacity has freed up). */
  private calmSeconds = 0;

  // Counters for stats.
  grants = 0;
  waits = 0;
  waitedMs = 0;
  cuts = 0;

  constructor(private readonly cfg: RequestRateConfig) {
    this.now = cfg.now ?? (() => performance.now());
    this.schedule =
      cfg.schedule ??
      ((fn, ms) => {
        const t = setTimeout(fn, ms);
        return () => clearTimeout(t);
      });
    this.startedAt = this.now();
    this.lastRefill = this.startedAt;
    this.slotStart = this.startedAt;
    this.activeSince = this.startedAt;
    this.rateValue = Math.min(cfg.initial, cfg.max);
    this.tokens = this.capacity();
  }

  /** The ceiling now: the initial rate doubled every ramp period since the start, within the hard max. */
  ceiling(): number {
    const periods = Number.isFinite(this.cfg.rampDoublingMs) ? (this.now() - this.startedAt) / this.cfg.rampDoublingMs : 0;
    return Math.min(this.cfg.max, this.cfg.initial * 2 ** periods);
  }

  /** Requests per second allowed now. */
  get rate(): number {
    return Math.min(this.rateValue, this.ceiling());
  }

  get queued(): number {
    return this.waiters.length;
  }

  /** Resolves when a token is granted; `ref.priority` is read at grant time, so it may be raised meanwhile. */
  acquire(ref: PriorityRef = { priority: 'urgent' }): Promise<RateGrant> {
    this.refill();
    if (this.waiters.length === 0 && this.tokens >= 1 && this.now() >= this.pausedUntil) {
      this.tokens -= 1;
      this.granted(this.now());
      return Promise.resolve({ epoch: this.epoch, waitedMs: 0 });
    }
    return new Promise((resolve) => {
      this.waiters.push({ ref, since: this.now(), resolve });
      if (this.growSince === null) this.growSince = this.now();
      this.arm();
    });
  }

  /** A request granted under `grant` was answered (anything but a 429). */
  succeeded(_grant: RateGrant): void {
    this.rollWindow();
    this.accepted[this.slot]!++;
    this.grow();
  }

  /** A request granted under `grant` was answered 429, with the server's Retry-After in seconds if any. */
  /** Returns whether this 429 cut the rate (the first of its overload). */
  throttled(grant: RateGrant, retryAfterSeconds: number | null): boolean {
    const t = this.now();
    if (retryAfterSeconds !== null && retryAfterSeconds > 0) {
      this.pausedUntil = Math.max(this.pausedUntil, t + retryAfterSeconds * 1000);
      this.arm();
    }
    this.growSince = null;
    this.calmSeconds = 0;
    if (grant.epoch !== this.epoch) return false;
    this.rollWindow();
    // The ring holds the current, partial slot and the full slots before it.
    const covered = (WINDOW_SLOTS - 1) * WINDOW_SLOT_MS + (t - this.slotStart);
    // A burst that began a moment ago after a quiet spell is measured over that moment, not a second.
    const elapsed = Math.max(WINDOW_SLOT_MS, Math.min(covered, t - this.activeSince));
    const acceptedRate = (this.accepted.reduce((a, b) => a + b, 0) * 1000) / elapsed;
    this.rateValue = Math.max(this.cfg.min, this.cfg.decreaseFactor * Math.min(this.rate, Math.max(acceptedRate, this.cfg.min)));
    this.tokens = Math.min(this.tokens, 0);
    this.epoch++;
    this.cuts++;
    return true;
  }

  close(): void {
    this.cancelTimer?.();
    this.cancelTimer = null;
  }

  private granted(t: number): void {
    this.grants++;
    if (t - this.lastGrantAt > WINDOW_SLOT_MS * WINDOW_SLOTS) this.activeSince = t;
    this.lastGrantAt = t;
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

  /**
   * Additive increase: for each full second of saturated use without a 429, one step. After
   * CALM_SECONDS such seconds in a row the step doubles each second (up to 4 steps, and half the rate): the limit
   * is not near (another daemon has stopped, or GCS has scaled up), and +1 step/s would take minutes to
   * find it. Near the limit 429s come every few seconds, so the steps stay additive and the shares fair.
   */
  private grow(): void {
    if (this.growSince === null) return;
    const t = this.now();
    const seconds = Math.floor((t - this.growSince) / 1000);
    if (seconds < 1) return;
    this.refill();
    let rate = this.rate;
    for (let i = 0; i < seconds; i++) {
      this.calmSeconds++;
      const doubling = Math.max(0, this.calmSeconds - CALM_SECONDS);
      const step = this.cfg.increasePerSecond * 2 ** Math.min(doubling, MAX_DOUBLINGS);
      rate += Math.min(step, Math.max(this.cfg.increasePerSecond, rate / 2));
    }
    this.rateValue = Math.min(this.ceiling(), rate);
    this.growSince = this.growSince + seconds * 1000;
    if (this.waiters.length === 0) {
      this.growSince = null;
      this.calmSeconds = 0;
    }
  }

  private rollWindow(): void {
    const t = this.now();
    while (t - this.slotStart >= WINDOW_SLOT_MS) {
      this.slotStart += WINDOW_SLOT_MS;
      this.slot = (this.slot + 1) % WINDOW_SLOTS;
      this.accepted[this.slot] = 0;
      // After a long idle, skip ahead instead of looping slot by slot.
      if (t - this.slotStart > WINDOW_SLOT_MS * WINDOW_SLOTS) {
        this.accepted.fill(0);
        this.slotStart = t;
      }
    }
  }

  /** Grants what the bucket holds now, most urgent first, and sets a timer for the next token. */
  private pump(): void {
    this.cancelTimer = null;
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
      w!.resolve({ epoch: this.epoch, waitedMs: t - w!.since });
    }
    this.arm();
  }

  private arm(): void {
    if (this.cancelTimer || this.waiters.length === 0) return;
    this.refill();
    const t = this.now();
    const untilToken = this.tokens >= 1 ? 0 : ((1 - this.tokens) / this.rate) * 1000;
    const delay = Math.max(untilToken, this.pausedUntil - t, 0);
    this.cancelTimer = this.schedule(() => this.pump(), Math.max(1, Math.ceil(delay)));
  }
}
