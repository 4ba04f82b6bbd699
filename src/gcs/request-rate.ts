/**
 * Requests per second to GCS, per daemon: a token bucket whose rate follows what the bucket says.
 *
 * A concurrency limit cannot go below one request in flight, and one request in flight at 30 ms is
 * already 33 requests/s; several daemons sharing a bucket capped at a few dozen requests/s need a rate.
 * The rate is AIMD. It starts at the ceiling (below). The first 429 sets it to the floor `min`, and it
 * slow-starts: it doubles at every multiple of `slowStartStepMs` of the wall clock while requests wait
 * for tokens (to at most twice what was granted in the step), until the next 429 halves the rate it
 * sent at (granted over its last 300 ms, at most the rate that request was granted at). (A first 429
 * after a whole second of accepted requests goes straight to half the rate accepted over that
 * second.) From then on a 429 cuts it to `decreaseFactor` times its
 * own rate, and it grows in every second in which requests waited for tokens and none was throttled:
 * by `increasePerSecond` while it is below its plateau (the rate the last 429 came at: where the
 * bucket said no last time), and beyond the plateau by a step that doubles with each such second
 * (within half the rate: at most x1.5 a second), never beyond twice what was accepted over the last
 * second (growth is earned by use). K daemons doing this on one bucket converge to about 1/K each: every
 * cut shrinks a daemon's rate by the same fraction, every increase adds the same amount to each (Chiu
 * and Jain's argument for TCP). A cut counts once per overload: a 429 on a request granted before the
 * last cut is the same overload answering late.
 *
 * Why the plateau (CUBIC's idea, in TCP, of probing slowly near the rate of the last loss and faster
 * beyond it): with additive steps only, capacity that frees up is found at +1.5/s per second. In the
 * benchmark (three daemons, a 60/s bucket, 15-20 s) the first daemon to finish left 20/s, and four
 * seconds later the other two together still sent 44/s: the benchmark's goodput counts the whole run,
 * and that tail cost it more than any overload. Beyond the plateau no 429 answers, so the steps
 * double and the freed rate is taken in 3-4 s. Near the limit a daemon is cut every second or two at
 * about its plateau, so its steps stay mostly additive (not always: at 20/s one second's step makes
 * up a cut, so two or three seconds without a 429, which chance gives now and then, double the step;
 * part of the wandering the settled steps below damp; a margin above the plateau before doubling
 * damped it too in the simulation, but slowed the 15 s job's tail); a daemon far below its share (its last cut came while
 * it was small) passes its low plateau sooner than the others pass theirs and catches up faster than
 * with additive steps alone. The price is some more probing: in the simulation 4.4% of requests are
 * answered 429 against 4.0% without the plateau.
 *
 * What keeps the shares equal over a short job (measured with the project's emulator: three daemons,
 * one 60/s bucket, 15 s): nothing of the start survives (the first cut does not use the few requests
 * a fraction of a second gave, which is luck; daemons on other machines slow-start on the same
 * wall-clock steps, so they hold the same rate until the slow start ends); cuts are from the daemon's
 * own rate, not from what GCS accepted (a daemon whose readers were backing off after 429s had
 * accepted less and was cut deeper each time); the slow start ends at half of what was sent, not of
 * the nominal rate (below); and the steps are small (x0.9, +2/s), since each 429
 * reaches one daemon, chosen by chance, and large steps let that chance decide the shares. The slow
 * start's steps are an eighth of a second: the climb from the floor to the bucket's limit (five or six
 * doublings) is time the bucket is mostly idle, a tenth of a 15 s job at quarter-second steps.
 *
 * What does not converge fast: AIMD evens out rates with a time constant of about (rate / step)
 * seconds, some 10 s at 20/s and +2/s (larger steps and deeper cuts converge faster per cut but cost
 * more 429s and a deeper sawtooth, so no faster per 429: in the simulation x0.8 with +3/s and x0.7
 * with +4.5/s gave shares less even than x0.9 with +1.5/s). So the start decides much of a short
 * job's shares. It ended at half the nominal rate of the request the 429 answered; but the bucket's
 * burst holds the first 429s off for a step or two, the daemons' rates are equal at each step, and
 * which daemon's 429 came first was chance: a daemon answered one step late kept twice the others'
 * rate, and a daemon whose readers could not use the doublings ended at several times what it could
 * send. Half of what was sent over the last 300 ms is about the same for every daemon at the
 * overload; in the simulation it took the runs with every share within 0.28-0.39 from 50 to 73 of 96
 * (readers of 130-330 ms starting up to 0.3 s apart, as in the benchmark), with fewer 429s (3.9% ->
 * 3.2%), which paid for the +2/s steps (from +1.5/s: 73 -> 88 of 96 with readers starting together).
 * Tried and not kept, as the simulation's shares got less even: grants jittered around the rate (a
 * random cost per token, so that no daemon's phase keeps winning the bucket's refills), a random
 * phase after a cut, and at most one cut per daemon in each 250 ms-1 s (more 429s, too: an overload
 * lasts until enough cuts have come). Shares of a 15 s job still vary from run to run (the simulation
 * in test/request-rate-sharing.test.ts bounds them); what the plateau does is make the unevenness
 * cheap: the daemons left when one finishes grow into its rate within seconds.
 *
 * Settled steps (a long run: three daemons, one 60/s bucket, 75 s of all three reading): with x0.9
 * and +2/s throughout, each daemon's share of a 10 s window kept wandering between 25 and 45% long
 * after the start (in the simulation 63-77% of the windows after the first two had every share within
 * 0.28-0.39). Each 429 reaches one daemon, chosen by chance and not in proportion to its rate, so
 * each cut is noise as well as correction: a rate's spread around its share grows with the cut's
 * depth (about the square root of the cut fraction), whatever the step. Once a daemon's last six
 * cuts came at rates within 30% of each other (it has found its share: a daemon still catching up or
 * giving back cuts at rising or falling rates), it cuts to x0.95 and adds +1/s (the same ratio of
 * step to cut, so about the same 429s), and keeps the coarse steps, which move it faster, while its
 * share is still moving; the doubling beyond the plateau keeps the coarse step, so the rate a finished
 * daemon leaves is still found in seconds. In the simulation 86-97% of those windows are within the
 * band, the shares' mean distance from 1/3 halves, 429s 3.5 -> 3.6%; the 15 s job is about as
 * before (its shares are set by the start). A finer step from the
 * start (x0.95 and +1/s throughout) converged as well over the long run but left the 15 s job's
 * worst runs lower (a late daemon catches up more slowly).
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
  /** Lowest rate a cut can reach, requests/s; the slow start begins from it. */
  min: number;
  /** Requests/s added per second of saturated, unthrottled use below the plateau (the step that doubles beyond it). */
  increasePerSecond: number;
  /** A 429 cuts the rate to this fraction of itself. */
  decreaseFactor: number;
  /** Once settled (the last cuts came at about the same rate): the cut's fraction, finer than `decreaseFactor`. */
  settledDecreaseFactor: number;
  /** Once settled: the additive step below the plateau, finer than `increasePerSecond` (the doubling beyond it keeps the coarse step). */
  settledIncreasePerSecond: number;
  /** While slow-starting, the rate grows by `slowStartGrowth` at each multiple of this many ms of the wall clock. */
  slowStartStepMs: number;
  /** The factor of each slow-start step. */
  slowStartGrowth: number;
  /** The 429 that ends a slow start cuts the rate to this fraction of the rate its token was granted at. */
  slowStartDecreaseFactor: number;
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

/** Successes in the last second are counted in buckets of this many ms. */
const WINDOW_SLOT_MS = 100;
const WINDOW_SLOTS = 10;
/** A cut starts from at most this many times the rate GCS accepted over the last full second. */
const UNUSED_RATE_FACTOR = 3;
/** Grants a slow-start step must allow before what was used in it can gate the next step. */
const MEASURABLE_GRANTS = 4;
/** The slow start ends at half what was granted over this many 100 ms slots (about two and a half steps). */
const SLOW_START_END_SLOTS = 3;
/** Growth after the slow start takes the rate to at most this many times what was accepted over the last second. */
const GROWTH_USE_FACTOR = 2;
/** Settled: the last this many cuts came at rates within SETTLED_SPREAD of their mean (max - min over mean). */
const SETTLED_CUTS = 6;
const SETTLED_SPREAD = 0.3;

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
  private readonly wallNow: () => number;
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
  /** Requests granted per 100 ms slot, in the same ring. */
  private readonly sent = new Array<number>(WINDOW_SLOTS).fill(0);
  private slotStart: number;
  private slot = 0;
  /** When requests started flowing after a quiet second: the accepted rate means something a second later. */
  private activeSince: number;
  private lastGrantAt = Number.NEGATIVE_INFINITY;
  /** Since when requests have waited for tokens with no 429 (null: not saturated). */
  private growSince: number | null = null;
  /** The rate the last cut was computed from: where the bucket last said no. */
  private plateau = 0;
  /** Saturated seconds in a row without a 429 spent at or beyond the plateau: each doubles the step. */
  private beyondPlateau = 0;
  /** Whether a 429 has set the rate yet (before, it is the nominal ceiling, not anything GCS accepted). */
  private established = false;
  /** After the first overload: the rate doubles while saturated, until the next 429. */
  private slowStarting = false;
  /** The wall-clock step the slow start last grew at, and the grants since. */
  private slowStartStep = 0;
  private stepGrants = 0;
  /** The rates the last SETTLED_CUTS additive-phase cuts came at (their plateaus), oldest first. */
  private readonly cutRates: number[] = [];

  // Counters for stats.
  grants = 0;
  waits = 0;
  waitedMs = 0;
  cuts = 0;

  constructor(private readonly cfg: RequestRateConfig) {
    this.now = cfg.now ?? (() => performance.now());
    this.wallNow = cfg.wallNow ?? (cfg.now ? cfg.now : () => Date.now());
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
      return Promise.resolve({ epoch: this.epoch, rate: this.rate, waitedMs: 0 });
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
    this.beyondPlateau = 0;
    if (grant.epoch !== this.epoch) return false;
    if (!this.established && t - this.activeSince >= WINDOW_SLOT_MS * WINDOW_SLOTS) {
      // The first 429 after a whole second of requests accepted: a daemon whose readers started after
      // the others' (a second apart on a loaded machine), which the bucket served while they, cut at
      // their first 429s, were slow-starting. What it was accepted at is a second's measure, not a
      // burst's luck, and the others are near it now: it ends its start as a slow start ends, at half
      // that. Sent to the floor instead, it slow-started into a full bucket, its slow start ended at a
      // few requests/s, and it held a fifth of the limit for the rest of a 20 s job (measured).
      this.established = true;
      this.plateau = this.acceptedRate(t);
      this.rateValue = Math.max(this.cfg.min, this.cfg.slowStartDecreaseFactor * this.plateau);
    } else if (!this.established) {
      // The first overload: what GCS accepted so far is a few requests in a fraction of a second, and
      // which daemon's requests the bucket's burst happened to take is luck. A cut from that measure
      // kept the luckiest daemon at several times the others' rate for the whole job; every daemon
      // restarting from the same floor and doubling keeps none of the start's differences.
      this.rateValue = this.cfg.min;
      this.established = true;
      this.slowStarting = true;
      this.slowStartStep = this.currentStep();
      this.stepGrants = 0;
    } else if (this.slowStarting) {
      // Doubling overshoots by up to one doubling: back to half the rate this overload was sent at,
      // as sent over the last 300 ms, not the nominal rate: which daemon's 429 comes a step late is
      // chance, and readers may not use the doublings (a slow start that grew to 112/s while it sent
      // 32/s, in the simulation); what was sent is about the same for every daemon at the overload.
      this.plateau = Math.min(grant.rate, this.rate, this.sentRate(t, SLOW_START_END_SLOTS) ?? Number.POSITIVE_INFINITY);
      this.rateValue = Math.max(this.cfg.min, this.cfg.slowStartDecreaseFactor * this.plateau);
      this.slowStarting = false;
    } else {
      // From its own rate, so every daemon's cut is the same fraction of its rate (a cut from what GCS
      // accepted over the last second cut the daemon whose readers were backing off after 429s deeper,
      // and it fell further behind with each cut). A rate far above what was sent for a whole second
      // (readers slower than the rate) is first brought down to twice that.
      const sent = t - this.activeSince >= WINDOW_SLOT_MS * WINDOW_SLOTS ? UNUSED_RATE_FACTOR * this.acceptedRate(t) : Number.POSITIVE_INFINITY;
      this.plateau = Math.min(this.rate, sent);
      const factor = this.settled() ? this.cfg.settledDecreaseFactor : this.cfg.decreaseFactor;
      this.rateValue = Math.max(this.cfg.min, factor * this.plateau);
      this.cutRates.push(this.plateau);
      if (this.cutRates.length > SETTLED_CUTS) this.cutRates.shift();
    }
    this.tokens = Math.min(this.tokens, 0);
    this.epoch++;
    this.cuts++;
    return true;
  }

  close(): void {
    this.cancelTimer?.();
    this.cancelTimer = null;
  }

  /**
   * Whether the last cuts came at about the same rate: the rate has found its share, and the finer
   * steps keep it there (see the class comment). A daemon whose share is still moving (its cuts come
   * at rising or falling rates) keeps the coarse steps, which move it faster.
   */
  private settled(): boolean {
    if (this.cutRates.length < SETTLED_CUTS) return false;
    const hi = Math.max(...this.cutRates);
    const lo = Math.min(...this.cutRates);
    return (hi - lo) / ((hi + lo) / 2) < SETTLED_SPREAD;
  }

  /** Requests/s GCS accepted over the last second (called only after a second of activity). */
  private acceptedRate(t: number): number {
    this.rollWindow();
    // The ring holds the current, partial slot and the full slots before it.
    const covered = (WINDOW_SLOTS - 1) * WINDOW_SLOT_MS + (t - this.slotStart);
    return Math.max(this.cfg.min, (this.accepted.reduce((a, b) => a + b, 0) * 1000) / Math.max(WINDOW_SLOT_MS, covered));
  }

  /**
   * Requests/s granted over the last `slots` slots of the ring, the current, partial one included;
   * null below a few grants (a 429 answered late, after the requests had stopped, would measure an
   * empty window and end the slow start at the floor).
   */
  private sentRate(t: number, slots: number): number | null {
    this.rollWindow();
    let n = 0;
    for (let i = 0; i < slots; i++) n += this.sent[(this.slot - i + WINDOW_SLOTS) % WINDOW_SLOTS]!;
    if (n < MEASURABLE_GRANTS) return null;
    return (n * 1000) / Math.max(WINDOW_SLOT_MS, (slots - 1) * WINDOW_SLOT_MS + (t - this.slotStart));
  }

  private currentStep(): number {
    return Math.floor(this.wallNow() / this.cfg.slowStartStepMs);
  }

  private granted(t: number): void {
    this.grants++;
    this.stepGrants++;
    this.rollWindow();
    this.sent[this.slot]!++;
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
   * While slow-starting: one step at each wall-clock multiple of `slowStartStepMs` passed while requests
   * waited (none when nobody waited: the rate is not what holds the requests back).
   *
   * Then, for each full second of saturated use without a 429: one additive step below the plateau;
   * at or beyond it, a step that doubles with each such second (within half the rate), since no 429
   * there means the limit has moved (another daemon has stopped, or GCS has scaled up) and +1 step/s
   * would take minutes to find it. Never beyond twice what was accepted over the last second.
   */
  private grow(): void {
    const t = this.now();
    if (this.slowStarting) {
      const step = this.currentStep();
      if (step <= this.slowStartStep) return;
      if (this.growSince !== null) {
        this.refill();
        // A step is earned by using the rate: no more than `slowStartGrowth` times what was granted in
        // the steps since the last (readers slower than the rate would otherwise let it double to
        // nonsense, and the 429 that ends the slow start would halve nonsense).
        // Below a few tokens per step the count says nothing, and waiting is enough.
        const ms = (step - this.slowStartStep) * this.cfg.slowStartStepMs;
        const used = (this.stepGrants * 1000) / ms;
        const full = this.rate * this.cfg.slowStartGrowth ** (step - this.slowStartStep);
        const grown = (this.rate * ms) / 1000 < MEASURABLE_GRANTS ? full : Math.min(full, Math.max(this.rate, this.cfg.slowStartGrowth * used));
        this.rateValue = Math.min(this.ceiling(), grown);
      }
      this.stepGrants = 0;
      this.slowStartStep = step;
      this.growSince = this.waiters.length > 0 ? t : null;
      return;
    }
    if (this.growSince === null) return;
    const seconds = Math.floor((t - this.growSince) / 1000);
    if (seconds < 1) return;
    this.refill();
    let rate = this.rate;
    const additive = this.settled() ? this.cfg.settledIncreasePerSecond : this.cfg.increasePerSecond;
    for (let i = 0; i < seconds; i++) {
      if (rate < this.plateau) {
        rate += additive;
        continue;
      }
      this.beyondPlateau++;
      const step = this.cfg.increasePerSecond * 2 ** this.beyondPlateau;
      rate += Math.min(step, Math.max(this.cfg.increasePerSecond, rate / 2));
    }
    // Earned by use, as in the slow start: readers slower than the rate still queue now and then (eight
    // of them finishing together), which counts as a saturated second. A daemon whose readers were
    // held to 18/s by a loaded machine grew its rate to 60/s that way; when another daemon finished and
    // its readers sped up, it sent at 60/s into the 60/s bucket beside a second such daemon (17 429s in
    // a second, measured).
    if (t - this.activeSince >= WINDOW_SLOT_MS * WINDOW_SLOTS) rate = Math.min(rate, Math.max(this.rate, GROWTH_USE_FACTOR * this.acceptedRate(t)));
    this.rateValue = Math.min(this.ceiling(), rate);
    this.growSince = this.growSince + seconds * 1000;
    if (this.waiters.length === 0) {
      this.growSince = null;
      this.beyondPlateau = 0;
    }
  }

  private rollWindow(): void {
    const t = this.now();
    while (t - this.slotStart >= WINDOW_SLOT_MS) {
      this.slotStart += WINDOW_SLOT_MS;
      this.slot = (this.slot + 1) % WINDOW_SLOTS;
      this.accepted[this.slot] = 0;
      this.sent[this.slot] = 0;
      // After a long idle, skip ahead instead of looping slot by slot.
      if (t - this.slotStart > WINDOW_SLOT_MS * WINDOW_SLOTS) {
        this.accepted.fill(0);
        this.sent.fill(0);
        this.slotStart = t;
      }
    }
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
      w!.resolve({ epoch: this.epoch, rate: this.rate, waitedMs: t - w!.since });
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
    if (this.slowStarting && t >= this.pausedUntil) {
      const toStep = this.cfg.slowStartStepMs - (this.wallNow() % this.cfg.slowStartStepMs);
      delay = Math.min(delay, toStep);
    }
    this.cancelTimer = this.schedule(() => this.pump(), Math.max(1, Math.ceil(delay)));
  }
}
