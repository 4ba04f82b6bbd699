/**
 * The rate a daemon's request-rate limiter grants tokens at (request-rate.ts holds the tokens and the
 * waiters), set by what the bucket answers.
 *
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
 * --limit-ops-per-sec).
 */
import { RateWindow } from './rate-window.js';
import { SlowStart, type SlowStartConfig } from './slow-start.js';

export interface RateControlConfig extends SlowStartConfig {
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
  /** The 429 that ends a slow start cuts the rate to this fraction of the rate its token was granted at. */
  slowStartDecreaseFactor: number;
}

/** The clocks a controller reads, and when it started (the ceiling's ramp counts from then). */
export interface RateClocks {
  now: () => number;
  /** The wall clock (ms), shared by daemons on other machines: slow-start steps fall on its multiples. */
  wallNow: () => number;
  startedAt: number;
}

/** What a 429 is matched against: the cut epoch and the rate its token was granted under. */
export interface GrantedUnder {
  readonly epoch: number;
  readonly rate: number;
}

/** A cut starts from at most this many times the rate GCS accepted over the last full second. */
const UNUSED_RATE_FACTOR = 3;
/** The slow start ends at half what was granted over this many 100 ms slots (about two and a half steps). */
const SLOW_START_END_SLOTS = 3;
/** Growth after the slow start takes the rate to at most this many times what was accepted over the last second. */
const GROWTH_USE_FACTOR = 2;
/** Settled: the last this many cuts came at rates within SETTLED_SPREAD of their mean (max - min over mean). */
const SETTLED_CUTS = 6;
const SETTLED_SPREAD = 0.3;

export class RateController {
  private readonly now: () => number;
  private readonly startedAt: number;
  /** What was granted and accepted over the last second: cuts and growth are measured against use. */
  private readonly window: RateWindow;
  private rateValue: number;
  /** Bumped at each cut: outcomes of grants from an older epoch do not cut again. */
  private epochValue = 0;
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
  private readonly slowStart: SlowStart;
  /** The rates the last SETTLED_CUTS additive-phase cuts came at (their plateaus), oldest first. */
  private readonly cutRates: number[] = [];
  /** Cuts so far, for stats. */
  cuts = 0;

  /**
   * `settleTokens` is called just before growth sets a new rate, so the tokens earned until then are
   * counted at the rate they were earned at.
   */
  constructor(
    private readonly cfg: RateControlConfig,
    clocks: RateClocks,
    private readonly settleTokens: () => void,
  ) {
    this.now = clocks.now;
    this.startedAt = clocks.startedAt;
    this.window = new RateWindow(clocks.now, clocks.startedAt);
    this.slowStart = new SlowStart(cfg, clocks.wallNow);
    this.rateValue = Math.min(cfg.initial, cfg.max);
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

  /** The current cut epoch, handed out with each grant. */
  get epoch(): number {
    return this.epochValue;
  }

  /** A token was granted at `t`. */
  granted(t: number): void {
    this.slowStart.granted();
    this.window.granted(t);
  }

  /** A request was answered (anything but a 429). */
  succeeded(): void {
    this.window.succeeded();
  }

  /** A request has started waiting for a token: the rate is what holds requests back, so growth counts from now. */
  waiting(): void {
    if (this.growSince === null) this.growSince = this.now();
  }

  /**
   * A request granted under `grant` was answered 429 at `t`; returns whether this 429 cut the rate (the
   * first of its overload). The caller empties the token bucket after a cut.
   */
  throttled(grant: GrantedUnder, t: number): boolean {
    this.growSince = null;
    this.beyondPlateau = 0;
    if (grant.epoch !== this.epochValue) return false;
    if (!this.established && this.window.fullSecond(t)) this.endLateStart(t);
    else if (!this.established) this.startSlowStart();
    else if (this.slowStarting) this.endSlowStart(grant, t);
    else this.cut(t);
    this.epochValue++;
    this.cuts++;
    return true;
  }

  /**
   * While slow-starting: how long until the next wall-clock step, when the rate grows between grants
   * (so the token timer looks again then rather than at the old rate); null otherwise.
   */
  untilNextStep(): number | null {
    return this.slowStarting ? this.slowStart.untilNextStep() : null;
  }

  /**
   * While slow-starting: one step at each wall-clock multiple of `slowStartStepMs` passed while requests
   * waited (none when nobody waited: the rate is not what holds the requests back).
   *
   * Then, for each full second of saturated use without a 429: one additive step below the plateau;
   * at or beyond it, a step that doubles with each such second (within half the rate), since no 429
   * there means the limit has moved (another daemon has stopped, or GCS has scaled up) and +1 step/s
   * would take minutes to find it. Never beyond twice what was accepted over the last second.
   *
   * `waiting`: whether requests are still waiting for tokens.
   */
  grow(waiting: boolean): void {
    const t = this.now();
    if (this.slowStarting) this.growSlowStart(t, waiting);
    else this.growSaturated(t, waiting);
  }

  /**
   * The first 429 after a whole second of requests accepted: a daemon whose readers started after
   * the others' (a second apart on a loaded machine), which the bucket served while they, cut at
   * their first 429s, were slow-starting. What it was accepted at is a second's measure, not a
   * burst's luck, and the others are near it now: it ends its start as a slow start ends, at half
   * that. Sent to the floor instead, it slow-started into a full bucket, its slow start ended at a
   * few requests/s, and it held a fifth of the limit for the rest of a 20 s job (measured).
   */
  private endLateStart(t: number): void {
    this.established = true;
    this.plateau = this.window.acceptedRate(t, this.cfg.min);
    this.rateValue = Math.max(this.cfg.min, this.cfg.slowStartDecreaseFactor * this.plateau);
  }

  /**
   * The first overload: what GCS accepted so far is a few requests in a fraction of a second, and
   * which daemon's requests the bucket's burst happened to take is luck. A cut from that measure
   * kept the luckiest daemon at several times the others' rate for the whole job; every daemon
   * restarting from the same floor and doubling keeps none of the start's differences.
   */
  private startSlowStart(): void {
    this.rateValue = this.cfg.min;
    this.established = true;
    this.slowStarting = true;
    this.slowStart.begin();
  }

  /**
   * Doubling overshoots by up to one doubling: back to half the rate this overload was sent at,
   * as sent over the last 300 ms, not the nominal rate: which daemon's 429 comes a step late is
   * chance, and readers may not use the doublings (a slow start that grew to 112/s while it sent
   * 32/s, in the simulation); what was sent is about the same for every daemon at the overload.
   */
  private endSlowStart(grant: GrantedUnder, t: number): void {
    this.plateau = Math.min(grant.rate, this.rate, this.window.sentRate(t, SLOW_START_END_SLOTS) ?? Number.POSITIVE_INFINITY);
    this.rateValue = Math.max(this.cfg.min, this.cfg.slowStartDecreaseFactor * this.plateau);
    this.slowStarting = false;
  }

  /**
   * From its own rate, so every daemon's cut is the same fraction of its rate (a cut from what GCS
   * accepted over the last second cut the daemon whose readers were backing off after 429s deeper,
   * and it fell further behind with each cut). A rate far above what was sent for a whole second
   * (readers slower than the rate) is first brought down to UNUSED_RATE_FACTOR times what was accepted.
   */
  private cut(t: number): void {
    const sent = this.window.fullSecond(t) ? UNUSED_RATE_FACTOR * this.window.acceptedRate(t, this.cfg.min) : Number.POSITIVE_INFINITY;
    this.plateau = Math.min(this.rate, sent);
    const factor = this.settled() ? this.cfg.settledDecreaseFactor : this.cfg.decreaseFactor;
    this.rateValue = Math.max(this.cfg.min, factor * this.plateau);
    this.cutRates.push(this.plateau);
    if (this.cutRates.length > SETTLED_CUTS) this.cutRates.shift();
  }

  private growSlowStart(t: number, waiting: boolean): void {
    const taken = this.slowStart.take();
    if (taken === null) return;
    if (this.growSince !== null) {
      this.settleTokens();
      this.rateValue = Math.min(this.ceiling(), this.slowStart.grown(this.rate, taken));
    }
    this.growSince = waiting ? t : null;
  }

  private growSaturated(t: number, waiting: boolean): void {
    if (this.growSince === null) return;
    const seconds = Math.floor((t - this.growSince) / 1000);
    if (seconds < 1) return;
    this.settleTokens();
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
    if (this.window.fullSecond(t)) rate = Math.min(rate, Math.max(this.rate, GROWTH_USE_FACTOR * this.window.acceptedRate(t, this.cfg.min)));
    this.rateValue = Math.min(this.ceiling(), rate);
    this.growSince = this.growSince + seconds * 1000;
    if (!waiting) {
      this.growSince = null;
      this.beyondPlateau = 0;
    }
  }

  /**
   * Whether the last cuts came at about the same rate: the rate has found its share, and the finer
   * steps keep it there (see the comment at the top). A daemon whose share is still moving (its cuts
   * come at rising or falling rates) keeps the coarse steps, which move it faster.
   */
  private settled(): boolean {
    if (this.cutRates.length < SETTLED_CUTS) return false;
    const hi = Math.max(...this.cutRates);
    const lo = Math.min(...this.cutRates);
    return (hi - lo) / ((hi + lo) / 2) < SETTLED_SPREAD;
  }
}
