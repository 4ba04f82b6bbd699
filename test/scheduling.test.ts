import { describe, expect, it } from 'vitest';
import { DownloadScheduler } from '../src/blocks/download-scheduler.js';
import { AdaptiveConcurrency } from '../src/gcs/adaptive-concurrency.js';

function deferred() {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}
const tick = () => new Promise((r) => setImmediate(r));

describe('adaptive concurrency (AIMD)', () => {
  it('halves on a 429 at most once per cooldown, and grows back one slot per window of successes', async () => {
    let now = 0;
    const c = new AdaptiveConcurrency({ max: 16, min: 1, cooldownMs: 1000, now: () => now });
    for (let i = 0; i < 8; i++) await c.acquire();
    for (let i = 0; i < 8; i++) c.release('throttled'); // one overload answers many requests: one halving
    expect(c.current).toBe(8);
    now += 1000;
    await c.acquire();
    c.release('throttled');
    expect(c.current).toBe(4);
    for (let i = 0; i < 5; i++) {
      await c.acquire();
      c.release('ok');
    }
    expect(c.current).toBe(5); // +1/limit per success: about one slot per window of 4 or 5
    for (let i = 0; i < 1000; i++) {
      await c.acquire();
      c.release('ok');
    }
    expect(c.current).toBe(16);
  });

  it('makes callers wait beyond the limit and never drops below the minimum', async () => {
    const c = new AdaptiveConcurrency({ max: 2, min: 1, cooldownMs: 0 });
    await c.acquire();
    await c.acquire();
    let third = false;
    const p = c.acquire().then(() => (third = true));
    await tick();
    expect(third).toBe(false);
    c.release('throttled'); // limit 1, one in use: still waiting
    await tick();
    expect(third).toBe(false);
    c.release('failed');
    await p;
    expect(third).toBe(true);
    c.release('throttled');
    expect(c.current).toBe(1);
  });
});

describe('download scheduler', () => {
  it('keeps within the global and per-file limits, demand before readahead, and promotes on request', async () => {
    const s = new DownloadScheduler({ global: 3, perFile: 2 });
    const started: string[] = [];
    const gates = new Map<string, ReturnType<typeof deferred>>();
    let running = 0;
    let peak = 0;
    const job = (file: string, name: string, priority: 'demand' | 'readahead') => {
      const gate = deferred();
      gates.set(name, gate);
      return s.run(file, priority, async () => {
        started.push(name);
        peak = Math.max(peak, ++running);
        await gate.promise;
        running--;
        return name;
      });
    };
    job('a', 'a1', 'demand');
    job('a', 'a2', 'demand');
    job('a', 'a3', 'demand'); // per-file limit of 2: waits although a global slot is free
    job('b', 'b1', 'readahead'); // takes the free global slot
    const c1 = job('c', 'c1', 'readahead');
    job('d', 'd1', 'readahead');
    job('e', 'e1', 'demand');
    await tick();
    expect(started).toEqual(['a1', 'a2', 'b1']);
    gates.get('b1')!.resolve();
    await tick();
    expect(started.at(-1)).toBe('e1'); // demand before the older readaheads
    c1.ticket.promote(); // a reader now waits on c1
    gates.get('e1')!.resolve();
    await tick();
    expect(started.at(-1)).toBe('c1'); // promoted ahead of d1
    gates.get('a1')!.resolve();
    await tick();
    expect(started.at(-1)).toBe('a3'); // a has a slot again, and a3 is demand
    for (const g of gates.values()) g.resolve();
    await new Promise((r) => setTimeout(r, 10));
    for (const g of gates.values()) g.resolve();
    await new Promise((r) => setTimeout(r, 10));
    expect(started).toHaveLength(7);
    expect(peak).toBeLessThanOrEqual(3);
    expect(s.inFlight).toBe(0);
  });
});
