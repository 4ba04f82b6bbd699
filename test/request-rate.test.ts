import { describe, expect, it } from 'vitest';
import { ByteRate } from '../src/gcs/byte-rate.js';
import { DEFAULT_REQUEST_RATE, RequestRate, requestRateForFlags, type RateGrant, type RequestRateConfig } from '../src/gcs/request-rate.js';
import { StallTimeout } from '../src/gcs/stall-timeout.js';

/** A clock and timer queue the test moves by hand. */
class FakeClock {
  t = 0;
  private timers: { at: number; fn: () => void; live: boolean }[] = [];
  now = (): number => this.t;
  schedule = (fn: () => void, ms: number): (() => void) => {
    const timer = { at: this.t + ms, fn, live: true };
    this.timers.push(timer);
    return () => (timer.live = false);
  };
  /** Moves time forward, running each timer at its time. */
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    for (;;) {
      const due = this.timers.filter((x) => x.live && x.at <= end).sort((a, b) => a.at - b.at)[0];
      if (!due) break;
      this.t = Math.max(this.t, due.at);
      due.live = false;
      due.fn();
      await Promise.resolve();
      await Promise.resolve();
    }
    this.t = end;
    this.timers = this.timers.filter((x) => x.live);
  }
}

/** A token, moving the clock until it is granted. */
async function granted(r: RequestRate, clock: FakeClock): Promise<RateGrant> {
  let g: RateGrant | null = null;
  void r.acquire().then((x) => (g = x));
  await Promise.resolve();
  while (!g) await clock.advance(1);
  return g;
}

function limiter(clock: FakeClock, over: Partial<RequestRateConfig> = {}): RequestRate {
  return new RequestRate({ ...DEFAULT_REQUEST_RATE, initial: 100, max: Number.POSITIVE_INFINITY, now: clock.now, schedule: clock.schedule, ...over });
}

describe('request rate: token bucket', () => {
  it('grants at the rate, not faster, once the burst is spent', async () => {
    const clock = new FakeClock();
    const r = limiter(clock, { initial: 10, burstSeconds: 0.1 });
    let granted = 0;
    for (let i = 0; i < 30; i++) void r.acquire().then(() => granted++);
    await Promise.resolve();
    expect(granted).toBe(1); // the burst: max(1, 10 x 0.1)
    await clock.advance(1000);
    expect(granted).toBe(11);
    await clock.advance(1000);
    expect(granted).toBe(21);
    expect(r.waits).toBe(20);
    expect(r.waitedMs).toBeGreaterThan(0);
  });

  it('grants urgent waiters before background ones, and a raised priority counts', async () => {
    const clock = new FakeClock();
    const r = limiter(clock, { initial: 1, burstSeconds: 1 });
    await r.acquire(); // spends the one token
    const order: string[] = [];
    const promoted = { priority: 'background' as const } as { priority: 'urgent' | 'background' };
    void r.acquire({ priority: 'background' }).then(() => order.push('readahead-1'));
    void r.acquire(promoted).then(() => order.push('promoted'));
    void r.acquire({ priority: 'urgent' }).then(() => order.push('lookup'));
    promoted.priority = 'urgent';
    await clock.advance(3000);
    // Urgent ones first in arrival order (the promoted one came first), then the readahead.
    expect(order).toEqual(['promoted', 'lookup', 'readahead-1']);
  });

  it('stops granting for a Retry-After', async () => {
    const clock = new FakeClock();
    const r = limiter(clock, { initial: 100, burstSeconds: 1, min: 50 });
    const g = await r.acquire();
    r.throttled(g, 2);
    let granted = false;
    void r.acquire().then(() => (granted = true));
    await clock.advance(1900);
    expect(granted).toBe(false);
    await clock.advance(200);
    expect(granted).toBe(true);
  });

  it('pauses the mount for at most 30 s whatever a Retry-After asks (an hour froze every request)', async () => {
    const clock = new FakeClock();
    const r = limiter(clock, { initial: 100, burstSeconds: 1, min: 50 });
    r.throttled(await r.acquire(), 3600);
    let granted = false;
    void r.acquire().then(() => (granted = true));
    await clock.advance(29_000);
    expect(granted).toBe(false);
    await clock.advance(2_000);
    expect(granted).toBe(true);
  });
});

describe('request rate: AIMD', () => {
  it('restarts from the floor at the first 429 and slow-starts on wall-clock steps until the next', async () => {
    const clock = new FakeClock();
    clock.t = 1_010; // not on a step: the steps fall on multiples of the wall clock, not on the cut
    const r = limiter(clock, { initial: 1000 });
    // A burst that went through, then the first 429: no measure of it survives (it was luck).
    const grants: RateGrant[] = [];
    for (let i = 0; i < 20; i++) grants.push(await r.acquire());
    for (const g of grants.slice(0, 19)) r.succeeded(g);
    expect(r.throttled(grants[19]!, null)).toBe(true);
    expect(r.rate).toBe(DEFAULT_REQUEST_RATE.min);
    // Saturated: doubles at 1125, 1250, 1375, 1500 ms of the clock (steps of an eighth of a second).
    let stop = false;
    const pump = async () => {
      while (!stop) {
        const g = await r.acquire();
        if (!stop) r.succeeded(g);
      }
    };
    void pump();
    void pump();
    await clock.advance(105); // t = 1115: no step yet
    expect(r.rate).toBe(1);
    await clock.advance(395); // t = 1510: four steps
    expect(r.rate).toBe(16);
    // The 429 that ends it halves what was sent over the last 300 ms (4/s, 8/s and 16/s steps: less
    // than the rate its token was granted at); a late one of the same overload does not cut.
    const over = await granted(r, clock);
    const late = await granted(r, clock);
    expect(r.throttled(over, null)).toBe(true);
    expect(over.rate).toBeGreaterThanOrEqual(16);
    expect(r.rate).toBeLessThan(over.rate / 2);
    expect(r.rate).toBeGreaterThan(over.rate / 4);
    expect(r.throttled(late, null)).toBe(false);
    stop = true;
    await clock.advance(2_000);
  });

  it('a first 429 after a whole second of accepted requests cuts to half of what was accepted, not to the floor', async () => {
    const clock = new FakeClock();
    const r = limiter(clock, { initial: 1000 });
    // A daemon whose readers started late: the bucket accepted it at 20/s for 1.5 s before its first 429.
    let g!: RateGrant;
    for (let i = 0; i < 30; i++) {
      g = await granted(r, clock);
      r.succeeded(g);
      await clock.advance(50);
    }
    expect(r.throttled(g, null)).toBe(true);
    expect(r.rate).toBeGreaterThan(DEFAULT_REQUEST_RATE.slowStartDecreaseFactor * 18);
    expect(r.rate).toBeLessThan(DEFAULT_REQUEST_RATE.slowStartDecreaseFactor * 22);
    // No slow start follows: it grows as after any cut (one step a second, below what was accepted).
    let stop = false;
    const pump = async () => {
      while (!stop) {
        const x = await r.acquire();
        if (!stop) r.succeeded(x);
      }
    };
    const cut = r.rate;
    void pump();
    void pump();
    await clock.advance(1_100);
    expect(r.rate).toBeLessThanOrEqual(cut + DEFAULT_REQUEST_RATE.increasePerSecond + 1e-9);
    stop = true;
    await clock.advance(1_000);
  });

  it('slow-starts no further than twice what its readers use', async () => {
    const clock = new FakeClock();
    const r = limiter(clock, { initial: 1000 });
    r.throttled(await granted(r, clock), null);
    // Readers that ask for 10 tokens at once, every second: requests wait, but 10/s is all they use.
    for (let s = 0; s < 8; s++) {
      for (let i = 0; i < 10; i++) void r.acquire().then((g) => r.succeeded(g));
      await clock.advance(1000);
    }
    expect(r.rate).toBeGreaterThanOrEqual(8);
    expect(r.rate).toBeLessThanOrEqual(2 * 80); // the most a step can have seen: 10 tokens in 125 ms
  });

  it('ends a slow start at half of what it sent over its last 300 ms, not half its nominal rate', async () => {
    const clock = new FakeClock();
    clock.t = 1_010;
    const r = limiter(clock, { initial: 1000 });
    r.throttled(await granted(r, clock), null); // to the floor: the slow start
    // A reader asking every 50 ms: 20/s, while the steps double the rate past it.
    let last: RateGrant | null = null;
    for (let i = 0; i < 60; i++) {
      void r.acquire().then((g) => {
        last = g;
        r.succeeded(g);
      });
      await clock.advance(50);
    }
    expect(r.rate).toBeGreaterThanOrEqual(32);
    expect(r.throttled(last!, null)).toBe(true);
    // Half of the 20/s it sent (half its nominal rate would be 16/s or more).
    expect(r.rate).toBeGreaterThan(8);
    expect(r.rate).toBeLessThan(12);
  });

  it('then cuts to a fraction of its own rate once per overload; below that rate it adds one step a second, beyond it the step doubles', async () => {
    const clock = new FakeClock();
    const r = limiter(clock, { initial: 1000 });
    r.throttled(await granted(r, clock), null); // the start: to the floor
    r.throttled(await granted(r, clock), null); // the end of the slow start
    // A daemon at 20/s, saturated for two seconds (so what it sent is 20/s, and a cut is from its own rate).
    (r as unknown as { control: { rateValue: number } }).control.rateValue = 20;
    let stop = false;
    const pump = async () => {
      while (!stop) {
        const g = await r.acquire();
        if (!stop) r.succeeded(g);
      }
    };
    void pump();
    void pump();
    await clock.advance(2_000);
    // A 429: x0.9 of its own rate, whatever the last second accepted; the same overload answering late does not cut again.
    const a = await granted(r, clock);
    const b = await granted(r, clock);
    const before = r.rate;
    expect(r.throttled(a, null)).toBe(true);
    const cut = r.rate;
    expect(cut).toBeCloseTo(DEFAULT_REQUEST_RATE.decreaseFactor * before, 5);
    expect(r.throttled(b, null)).toBe(false);
    // Below the plateau (the rate the 429 came at) one step a second; from it on, the step doubles each
    // second (2, 4, 8 steps), within half the rate. Sampled just past each second since the cut.
    const step = DEFAULT_REQUEST_RATE.increasePerSecond;
    const rates: number[] = [];
    for (let s = 0; s < 6; s++) {
      await clock.advance(1_000);
      rates.push(r.rate);
    }
    const expected = [cut + step, cut + 2 * step];
    let x = expected[1]!;
    for (let k = 1; k <= 4; k++) expected.push((x += Math.min(step * 2 ** k, Math.max(step, x / 2))));
    expect(expected[1]).toBeGreaterThanOrEqual(before); // the plateau is passed in the second second
    for (let s = 0; s < 6; s++) {
      // Growth is counted in whole seconds from the first wait after the cut: at most one second behind.
      expect(rates[s]).toBeGreaterThanOrEqual(s === 0 ? cut : expected[s - 1]! - 1e-9);
      expect(rates[s]).toBeLessThanOrEqual(expected[s]! + 1e-9);
    }
    expect(rates[5]).toBeGreaterThan(cut + 10 * step); // additive steps alone would be cut + 6 steps
    // Another 429 makes the steps additive again, below the new plateau.
    const c = await granted(r, clock);
    r.throttled(c, null);
    const again = r.rate;
    await clock.advance(2_000);
    expect(r.rate).toBeLessThanOrEqual(again + 2 * step + 1e-9);
    stop = true;
    await clock.advance(1_000);
  });

  it('grows no further than twice what the bucket accepted over the last second, after the slow start too', async () => {
    const clock = new FakeClock();
    const r = limiter(clock, { initial: 1000 });
    r.throttled(await granted(r, clock), null); // the start: to the floor
    r.throttled(await granted(r, clock), null); // the end of the slow start
    (r as unknown as { control: { rateValue: number } }).control.rateValue = 8;
    // Readers that ask for 10 tokens at once, every second: they queue each time, but use 10/s.
    for (let s = 0; s < 12; s++) {
      for (let i = 0; i < 10; i++) void r.acquire().then((g) => r.succeeded(g));
      await clock.advance(1000);
    }
    expect(r.rate).toBeGreaterThan(8);
    expect(r.rate).toBeLessThanOrEqual((2 * 10) / 0.9); // the window is the last 0.9-1 s
  });

  it('cuts a rate far above what was sent for a whole second from three times what was accepted', async () => {
    const clock = new FakeClock();
    const r = limiter(clock, { initial: 1000 });
    r.throttled(await granted(r, clock), null);
    r.throttled(await granted(r, clock), null);
    // Grown to 200/s long ago, now used at 20/s (readers slower than the rate) for two seconds.
    (r as unknown as { control: { rateValue: number } }).control.rateValue = 200;
    let g!: RateGrant;
    for (let i = 0; i < 40; i++) {
      g = await granted(r, clock);
      r.succeeded(g);
      await clock.advance(50);
    }
    r.throttled(g, null);
    expect(r.rate).toBeGreaterThan(DEFAULT_REQUEST_RATE.decreaseFactor * 3 * 18);
    expect(r.rate).toBeLessThan(DEFAULT_REQUEST_RATE.decreaseFactor * 3 * 22);
  });

  it('does not grow while nobody waits for tokens', async () => {
    const clock = new FakeClock();
    const r = limiter(clock, { initial: 1000 });
    const g = await r.acquire();
    r.succeeded(g);
    r.throttled(g, null);
    const cut = r.rate;
    for (let i = 0; i < 20; i++) {
      await clock.advance(1000);
      r.succeeded(await r.acquire());
    }
    expect(r.rate).toBe(cut);
  });

  it('is built from the flags: --limit-ops-per-sec caps the rate also without a ramp (--initial-ops-per-sec 0)', () => {
    expect(requestRateForFlags(0, -1)).toBeNull();
    expect(requestRateForFlags(0, 0)).toBeNull();
    const capOnly = requestRateForFlags(0, 50)!;
    expect([capOnly.rate, capOnly.ceiling()]).toEqual([50, 50]);
    expect(requestRateForFlags(5000, 50)!.ceiling()).toBe(50);
    expect(requestRateForFlags(5000, -1)!.ceiling()).toBeCloseTo(5000, 0);
  });

  it('ramps the ceiling by doubling every period, within the hard max', async () => {
    const clock = new FakeClock();
    const r = limiter(clock, { initial: 5000, rampDoublingMs: 20 * 60_000, max: 15_000 });
    expect(r.ceiling()).toBe(5000);
    await clock.advance(20 * 60_000);
    expect(r.ceiling()).toBeCloseTo(10_000, 0);
    await clock.advance(40 * 60_000);
    expect(r.ceiling()).toBe(15_000);
  });

  it('three daemons sharing a 60/s bucket converge to about a third each, near the limit, with few 429s', async () => {
    const clock = new FakeClock();
    const LIMIT = 60;
    const daemons = [0, 1, 2].map(() => limiter(clock, { initial: 5000 }));
    // The bucket: a token bucket of 60/s with a fifth of a second of burst, shared by all three.
    let tokens = 12;
    let last = 0;
    const take = () => {
      tokens = Math.min(12, tokens + ((clock.t - last) / 1000) * LIMIT);
      last = clock.t;
      if (tokens < 1) return false;
      tokens -= 1;
      return true;
    };
    const accepted = [0, 0, 0];
    let throttled = 0;
    let total = 0;
    let stop = false;
    const sleep = (ms: number) => new Promise<void>((r) => clock.schedule(r, ms));
    // 8 readers per daemon, 30 ms per request; the third daemon starts 20 s late.
    const reader = async (d: number) => {
      if (d === 2) await sleep(20_000);
      while (!stop) {
        const g = await daemons[d]!.acquire();
        total++;
        const ok = take();
        await sleep(30);
        if (ok) {
          if (clock.t > 60_000) accepted[d]!++;
          daemons[d]!.succeeded(g);
        } else {
          throttled++;
          daemons[d]!.throttled(g, null);
        }
      }
    };
    for (let d = 0; d < 3; d++) for (let w = 0; w < 8; w++) void reader(d);
    for (let t = 0; t < 120_000; t += 5) {
      await clock.advance(5);
      await new Promise((r) => setImmediate(r));
    }
    stop = true;
    const sum = accepted.reduce((a, b) => a + b, 0);
    // Over the second minute: near the limit, near equal shares, few 429s over the whole run.
    expect(sum / 60 / LIMIT).toBeGreaterThan(0.88);
    for (const a of accepted) expect(a / sum).toBeGreaterThan(0.25);
    expect(throttled / total).toBeLessThan(0.05);
  }, 60_000);
});

describe('stall timeout', () => {
  const cfg = { initialMs: 5000, minMs: 1500, maxMs: 60_000, percentile: 0.99 };

  it('is the initial timeout until a few silences were seen, then their percentile within floor and cap', () => {
    const s = new StallTimeout(cfg);
    expect(s.currentMs).toBe(5000);
    for (let i = 0; i < 4; i++) s.observe(20);
    expect(s.currentMs).toBe(5000);
    s.observe(20);
    expect(s.currentMs).toBe(1500); // the floor
    for (let i = 0; i < 200; i++) s.observe(i < 190 ? 50 : 3000);
    expect(s.currentMs).toBe(3000);
    for (let i = 0; i < 1000; i++) s.observe(10 * 60_000);
    expect(s.currentMs).toBe(60_000); // the cap
    // The window keeps the last 1,000: once slow silences have left it, the floor is back.
    for (let i = 0; i < 1040; i++) s.observe(50);
    expect(s.currentMs).toBe(1500);
  });

  it('doubles for each cut of the same request, within the cap, so a server slow for everyone is waited for', () => {
    const s = new StallTimeout(cfg);
    expect(s.forRetry(0)).toBe(5000);
    expect(s.forRetry(1)).toBe(10_000);
    expect(s.forRetry(2)).toBe(20_000);
    expect(s.forRetry(10)).toBe(60_000);
  });
});

describe('bandwidth (--limit-bytes-per-sec): a token bucket of bytes', () => {
  const MiB = 2 ** 20;
  const bytes = (clock: FakeClock, perSecond: number): ByteRate => new ByteRate({ bytesPerSecond: perSecond, now: clock.now, schedule: clock.schedule });

  it('grants one second of bytes at once, then the rate', async () => {
    const clock = new FakeClock();
    const b = bytes(clock, MiB);
    let done = 0;
    for (let i = 0; i < 10; i++) void b.acquire(MiB / 2).then(() => done++);
    await Promise.resolve();
    expect(done).toBe(2);
    await clock.advance(1000);
    expect(done).toBe(4);
    await clock.advance(2000);
    expect(done).toBe(8);
    expect(b.queued).toBe(2);
  });

  it('lets a read larger than the bucket through once it is full, and makes the next ones pay for it', async () => {
    const clock = new FakeClock();
    const b = bytes(clock, MiB);
    const waits: number[] = [];
    void b.acquire(4 * MiB).then((w) => waits.push(w));
    void b.acquire(MiB).then((w) => waits.push(w));
    await clock.advance(1);
    expect(waits).toEqual([0]);
    // 3 MiB of debt, then a full 1 MiB: about 4 s.
    await clock.advance(3900);
    expect(waits).toHaveLength(1);
    await clock.advance(200);
    expect(waits).toHaveLength(2);
    expect(waits[1]).toBeGreaterThanOrEqual(3990);
  });

  it("grants a reader's own read before readahead that came first; a priority raised while waiting counts", async () => {
    const clock = new FakeClock();
    const b = bytes(clock, MiB);
    await b.acquire(MiB);
    const order: string[] = [];
    const raised = { priority: 'background' as 'background' | 'urgent' };
    void b.acquire(MiB, { priority: 'background' }).then(() => order.push('readahead'));
    void b.acquire(MiB, raised).then(() => order.push('raised'));
    void b.acquire(MiB, { priority: 'urgent' }).then(() => order.push('reader'));
    raised.priority = 'urgent';
    await clock.advance(3100);
    expect(order).toEqual(['raised', 'reader', 'readahead']);
  });

  it("a reader's small read that fits the bucket goes at once, though a big prefetch waits for a refill", async () => {
    const clock = new FakeClock();
    const b = new ByteRate({ bytesPerSecond: MiB, minCapacity: 4 * MiB, now: clock.now, schedule: clock.schedule });
    await b.acquire(3 * MiB, { priority: 'background' });
    const order: string[] = [];
    void b.acquire(4 * MiB, { priority: 'background' }).then(() => order.push('prefetch'));
    await clock.advance(10);
    void b.acquire(64 * 1024, { priority: 'urgent' }).then(() => order.push('reader'));
    await clock.advance(1);
    expect(order).toEqual(['reader']);
    // The bucket holds four blocks' worth: the prefetch waits for it to fill, and leaves no debt behind.
    await clock.advance(3000);
    expect(order).toEqual(['reader']);
    await clock.advance(200);
    expect(order).toEqual(['reader', 'prefetch']);
  });

  it('fails its waiters and later reads once closed', async () => {
    const clock = new FakeClock();
    const b = bytes(clock, MiB);
    await b.acquire(MiB);
    const waiting = b.acquire(MiB);
    b.close(new Error('closed'));
    await expect(waiting).rejects.toThrow('closed');
    await expect(b.acquire(1)).rejects.toThrow('closed');
  });
});
