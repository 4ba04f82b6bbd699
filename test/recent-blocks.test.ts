import { describe, expect, it } from 'vitest';
import type { BlockData } from '../src/blocks/block-buffers.js';
import { RecentBlocks } from '../src/blocks/recent-blocks.js';
import { MemoryBudget } from '../src/memory/memory-budget.js';

/** A block whose references are counted, as BlockBuffers counts them. */
function block(size: number): BlockData & { refs: number } {
  const b = {
    refs: 1,
    bytes: Buffer.alloc(size),
    directCapacity: 0,
    retain(): BlockData {
      b.refs++;
      return b;
    },
    release(): void {
      if (--b.refs < 0) throw new Error('released twice');
    },
  };
  return b;
}

describe('recent blocks', () => {
  it('keep their own reference, hand out new ones, and drop the least recently used past their capacity', () => {
    const recent = new RecentBlocks(300, null, 100);
    const [a, b, c, d] = [block(100), block(100), block(100), block(100)];
    recent.keep('a', a);
    recent.keep('b', b);
    recent.keep('c', c);
    expect([a.refs, b.refs, c.refs]).toEqual([2, 2, 2]);
    const got = recent.take('a')!; // a is now the most recent
    expect(got).toBe(a);
    expect(a.refs).toBe(3);
    recent.keep('d', d); // over 300: b, the oldest, goes
    expect(b.refs).toBe(1);
    expect(recent.take('b')).toBeNull();
    expect(recent.bytes).toBe(300);
    recent.keep('a', a); // already kept: no second reference
    expect(a.refs).toBe(3);
    recent.keep('huge', block(400)); // larger than the whole capacity: not kept
    expect(recent.take('huge')).toBeNull();
    recent.close();
    expect([a.refs, c.refs, d.refs]).toEqual([2, 1, 1]);
    expect(recent.bytes).toBe(0);
    recent.keep('late', a); // a load finishing after the stop: not kept
    expect(a.refs).toBe(2);
  });

  it('count a short block as the whole block its buffer reserves', () => {
    const recent = new RecentBlocks(400, null, 100);
    const short = [block(10), block(10), block(10), block(10), block(10)];
    short.forEach((b, i) => recent.keep(String(i), b));
    expect(recent.bytes).toBe(400);
    expect(short[0]!.refs).toBe(1); // the fifth pushed the first out
    recent.close();
  });

  it('let go of blocks nobody asked for a while, so an idle mount gives its memory back', async () => {
    const recent = new RecentBlocks(1000, null, 100, 200);
    const [a, b] = [block(100), block(100)];
    recent.keep('a', a);
    await new Promise((r) => setTimeout(r, 150));
    recent.keep('b', b);
    recent.take('b')!.release();
    await new Promise((r) => setTimeout(r, 200));
    expect(a.refs).toBe(1); // idle past 200 ms: gone
    await new Promise((r) => setTimeout(r, 300));
    expect(b.refs).toBe(1);
    expect(recent.bytes).toBe(0);
    recent.close();
  });

  it('give their blocks back when a read waits for memory', () => {
    const budget = new MemoryBudget({ limitBytes: 1000, demandHeadroomBytes: 100, idleReclaimAfterMs: 250 });
    const recent = new RecentBlocks(1000, budget, 300);
    const held = [block(300), block(300), block(300)];
    // The blocks' memory comes from the budget and goes back when their last reference does.
    const reservations = held.map(() => budget.tryReserve(300, 'demand')!);
    held.forEach((b, i) => {
      const release = b.release.bind(b);
      b.release = () => {
        release();
        if (b.refs === 0) reservations[i]!.release();
      };
      recent.keep(String(i), b);
      b.release(); // the reader lets go: only the recent blocks hold it
    });
    let granted = false;
    void Promise.resolve(budget.reserve(300)).then(() => (granted = true));
    return new Promise<void>((resolve) => setTimeout(resolve, 10)).then(() => {
      expect(granted).toBe(true);
      expect(held[0]!.refs).toBe(0); // the oldest went first
      expect(recent.bytes).toBeLessThan(900);
      recent.close();
    });
  });
});
