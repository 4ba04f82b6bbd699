/**
 * How long a GCS response may stay silent (no headers yet, or no body bytes) before the attempt is cut
 * and resumed: the target percentile of the silences seen recently, within a floor and a cap.
 *
 * gcsfuse (through Go's storage client) estimates the percentile with a step estimator that starts at
 * 20 s and, at its defaults, needs thousands of requests to come down to its 1.5 s floor; a window of
 * the last observations gives the percentile itself after a handful, so a stall early in a job is cut as
 * quickly as a late one. A silence that was cut is recorded as the timeout it reached, so a run of
 * stalls raises the timeout instead of cutting healthy slow responses forever.
 */
export interface StallTimeoutConfig {
  /** Used until `minSamples` silences have been seen (gcsfuse's --read-stall-initial-req-timeout). */
  initialMs: number;
  /** Floor (--read-stall-min-req-timeout). */
  minMs: number;
  /** Cap (--read-stall-max-req-timeout). */
  maxMs: number;
  /** 0..1, e.g. 0.99 (--read-stall-req-target-percentile). */
  percentile: number;
}

/** Observations kept: enough for a p99 to mean something, few enough to follow a change in minutes. */
const WINDOW = 1000;
/** Below this many observations the window says little; the initial timeout applies. */
const MIN_SAMPLES = 5;
const RESORT_EVERY = 20;

export class StallTimeout {
  /** A ring of the last WINDOW silences; a typed array sorts numerically without a comparator (~6x faster here). */
  private readonly samples = new Float64Array(WINDOW);
  private count = 0;
  private next = 0;
  private cached: number | null = null;
  private sinceSorted = 0;

  constructor(private readonly cfg: StallTimeoutConfig) {}

  /** One silence, in ms: the wait for headers, or the longest gap between body bytes of one response. */
  observe(ms: number): void {
    this.samples[this.next] = ms;
    this.next = (this.next + 1) % WINDOW;
    if (this.count < WINDOW) this.count++;
    // Sorting the window costs tens of microseconds: redo it every few observations, not per request.
    if (++this.sinceSorted >= RESORT_EVERY || this.count < 2 * MIN_SAMPLES) {
      this.cached = null;
      this.sinceSorted = 0;
    }
  }

  /**
   * The timeout for a request already cut `stalls` times: doubled each time, within the cap. A server
   * that is slow for everyone (a 16 s first byte) is then waited for after a few cuts, instead of being
   * cut at the same point forever while the window fills.
   */
  forRetry(stalls: number): number {
    return Math.min(this.cfg.maxMs, this.currentMs * 2 ** stalls);
  }

  /** The current timeout in ms. */
  get currentMs(): number {
    if (this.cached !== null) return this.cached;
    let value = this.cfg.initialMs;
    if (this.count >= MIN_SAMPLES) {
      // With a comparator, an Array's sort was 1.8% of the main thread's CPU per cold chunk file.
      const sorted = this.samples.slice(0, this.count).sort();
      value = sorted[Math.min(sorted.length - 1, Math.ceil(this.cfg.percentile * sorted.length) - 1)]!;
    }
    this.cached = Math.min(this.cfg.maxMs, Math.max(this.cfg.minMs, value));
    return this.cached;
  }
}
