import { describe, expect, it } from 'vitest';
import { DEFAULT_REQUEST_RATE, RequestRate } from '../src/gcs/request-rate.js';
import { mulberry32 } from '../src/emulator/faults.js';

/**
 * Several daemons' request rates against one simulated bucket, on a simulated clock: a discrete-event
 * loop that runs each timer at its time and lets every promise chain settle before the next one.
 */
class SimClock {
  t = 0;
  private seq = 0;
  private timers: { at: number; seq: number; fn: () => void; live: boolean }[] = [];
  now = (): number => this.t;
  schedule = (fn: () => void, ms: number): (() => void) => {
    const timer = { at: this.t + Math.max(0, ms), seq: this.seq++, fn, live: true };
    this.timers.push(timer);
    return () => (timer.live = false);
  };
  sleep = (ms: number): Promise<void> => new Promise((r) => this.schedule(r, ms));
  /** Runs timers in order until `done()` or `limitMs` of simulated time. */
  async run(done: () => boolean, limitMs: number): Promise<void> {
    while (!done() && this.t < limitMs) {
      let next: (typeof this.timers)[number] | undefined;
      for (const x of this.timers) if (x.live && (!next || x.at < next.at || (x.at === next.at && x.seq < next.seq))) next = x;
      if (!next) break;
      this.timers = this.timers.filter((x) => x.live && x !== next);
      this.t = Math.max(this.t, next.at);
      next.fn();
      await new Promise((r) => setImmediate(r));
    }
  }
}

interface SharingSim {
  /** Each daemon's share of the requests answered before the first daemon was done (as the benchmark counts). */
  shares: number[];
  /** Requests answered (not 429) per second over that time, over the limit. */
  goodput: number;
  /** 429s over all requests sent. */
  throttledShare: number;
  doneAtMs: number[];
}

/**
 * The benchmark's setting: K daemons, 8 readers each, `files` requests each, one bucket answering 429
 * beyond `limit`/s (a token bucket holding a fifth of a second), a 429 answered at once, a success after
 * 30 ms plus up to 200 ms more (the reader's own work on a loaded machine: the benchmark's readers get
 * through about 28 requests/s per daemon), the client's retry backoff after a 429 (full jitter from
 * 100 ms), and the daemons' readers starting within 30 ms of each other.
 */
async function simulateSharing(seed: number): Promise<SharingSim> {
  const K = 3;
  const files = 300;
  const limit = 60;
  const rand = mulberry32(seed);
  const clock = new SimClock();
  const rates = Array.from({ length: K }, () => new RequestRate({ ...DEFAULT_REQUEST_RATE, initial: 5000, max: Number.POSITIVE_INFINITY, now: clock.now, schedule: clock.schedule }));
  const burst = limit / 5;
  let tokens = burst;
  let refilled = 0;
  const take = (): boolean => {
    tokens = Math.min(burst, tokens + ((clock.t - refilled) / 1000) * limit);
    refilled = clock.t;
    if (tokens < 1) return false;
    tokens -= 1;
    return true;
  };
  const remaining = Array.from({ length: K }, () => files);
  const done = Array.from({ length: K }, () => 0);
  const answered: { d: number; at: number }[] = [];
  const doneAtMs = Array.from({ length: K }, () => Number.POSITIVE_INFINITY);
  let throttled = 0;
  let sent = 0;
  const reader = async (d: number): Promise<void> => {
    await clock.sleep(rand() * 30);
    while (remaining[d]! > 0) {
      remaining[d]!--;
      for (let attempt = 1; ; attempt++) {
        const g = await rates[d]!.acquire();
        sent++;
        if (take()) {
          await clock.sleep(30 + rand() * 200);
          rates[d]!.succeeded(g);
          answered.push({ d, at: clock.t });
          if (++done[d]! === files) doneAtMs[d] = clock.t;
          break;
        }
        await clock.sleep(1);
        throttled++;
        rates[d]!.throttled(g, null);
        await clock.sleep(rand() * Math.min(30_000, 100 * 2 ** (attempt - 1)));
      }
    }
  };
  const readers: Promise<void>[] = [];
  for (let d = 0; d < K; d++) for (let w = 0; w < 8; w++) readers.push(reader(d));
  let finished = 0;
  for (const r of readers) void r.then(() => finished++);
  await clock.run(() => finished === readers.length, 10 * 60_000);
  for (const r of rates) r.close();
  const firstDone = Math.min(...doneAtMs);
  const early = answered.filter((a) => a.at <= firstDone);
  const shares = Array.from({ length: K }, (_, d) => early.filter((a) => a.d === d).length / early.length);
  return { shares, goodput: early.length / (firstDone / 1000) / limit, throttledShare: throttled / sent, doneAtMs };
}

describe('request rate: daemons sharing one bucket', () => {
  it('three daemons starting together get about a third each from the start, near the limit, with few 429s', async () => {
    const runs: SharingSim[] = [];
    for (let seed = 1; seed <= 12; seed++) runs.push(await simulateSharing(seed));
    for (const r of runs) for (const share of r.shares) {
      expect(share).toBeGreaterThan(0.25);
      expect(share).toBeLessThan(0.42);
    }
    const mean = (f: (r: SharingSim) => number) => runs.reduce((a, r) => a + f(r), 0) / runs.length;
    expect(mean((r) => r.goodput)).toBeGreaterThan(0.9);
    expect(mean((r) => r.throttledShare)).toBeLessThan(0.05);
  });
});
