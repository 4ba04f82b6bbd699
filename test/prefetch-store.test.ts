import { describe, expect, it } from 'vitest';
import { unpooled } from '../src/blocks/block-buffers.js';
import type { ObjectMeta } from '../src/gcs/object-client.js';
import { Metrics } from '../src/observe/metrics.js';
import { PrefetchStore } from '../src/prefetch/prefetch-store.js';

const meta = (name: string, generation: string, size = 8): ObjectMeta => ({ name, size, generation, metageneration: '1', updatedMs: 0, crc32c: null });
const block = (n: number) => unpooled(Buffer.alloc(n, 7));

describe('PrefetchStore', () => {
  it('serves a held block only to the generation that was prefetched', () => {
    const metrics = new Metrics();
    const store = new PrefetchStore(1024, metrics);
    const old = meta('a/0.0', '100');
    store.started(old);
    store.arrived(old, 0, block(8));
    expect(store.take(meta('a/0.0', '200'), 0)).toBeNull();
    store.opened(meta('a/0.0', '200'));
    expect(metrics.snapshot().counters.prefetch_used_files).toBe(0);
    const got = store.take(old, 0);
    expect(got?.bytes.length).toBe(8);
    expect(store.take(old, 0)).toBeNull(); // handed over once
  });

  it('counts used files, and wasted bytes for files pushed out unopened', () => {
    const metrics = new Metrics();
    const store = new PrefetchStore(16, metrics);
    const [a, b, c] = [meta('x/a', '1'), meta('x/b', '1'), meta('x/c', '1')];
    for (const m of [a, b, c]) store.started(m);
    store.arrived(a, 0, block(8));
    store.arrived(b, 0, block(8));
    store.opened(b);
    store.arrived(c, 0, block(8)); // over 16 bytes: a (never opened) goes
    const c2 = metrics.snapshot().counters;
    expect(c2.prefetch_files).toBe(3);
    expect(c2.prefetch_used_files).toBe(1);
    expect(c2.prefetch_wasted_bytes).toBe(8);
    expect(store.take(a, 0)).toBeNull();
    expect(store.has(a)).toBe(false);
    expect(store.has(b)).toBe(true); // opened: never fetched again
  });

  it('makes room for new fetches from blocks of files opened a while ago, oldest first, never from guesses not yet opened', () => {
    const metrics = new Metrics();
    let now = 0;
    const store = new PrefetchStore(24, metrics, undefined, () => now);
    const [a, b, c] = [meta('y/a', '1'), meta('y/b', '1'), meta('y/c', '1')];
    for (const m of [a, b, c]) store.started(m);
    // a's reader opened it while its block was on the way, and read only its header.
    store.opened(a);
    store.arrived(a, 0, block(8));
    store.arrived(b, 0, block(8));
    store.opened(b);
    store.arrived(c, 0, block(8)); // not opened: a guess still waiting for its reader
    // Just opened: their reads are still to come, so nothing is evicted (and nothing when it could not make room).
    expect(store.fits(8)).toBe(false);
    expect(metrics.snapshot().counters.prefetch_evicted_bytes ?? 0).toBe(0);
    now = 1500;
    expect(store.fits(32)).toBe(false);
    expect(metrics.snapshot().counters.prefetch_evicted_bytes ?? 0).toBe(0);
    expect(store.fits(8)).toBe(true); // a's block makes room
    expect(store.take(a, 0)).toBeNull();
    expect(store.fits(16)).toBe(true); // then b's
    expect(store.take(b, 0)).toBeNull();
    expect(store.fits(24)).toBe(false); // c's is kept for its reader
    expect(store.take(c, 0)?.bytes.length).toBe(8);
    expect(metrics.snapshot().counters.prefetch_evicted_bytes).toBe(16);
    expect(metrics.snapshot().counters.prefetch_wasted_bytes ?? 0).toBe(0);
  });

  it("keeps an opened file's blocks for its reader while the walk that open started asks for room; holds none its reader joined in flight", () => {
    const metrics = new Metrics();
    let now = 0;
    const store = new PrefetchStore(16, metrics, undefined, () => now);
    const [a, b, c] = [meta('z/a', '1', 16), meta('z/b', '1'), meta('z/c', '1')];
    for (const m of [a, b]) store.started(m);
    store.arrived(a, 0, block(8));
    store.arrived(b, 0, block(8));
    now = 5;
    store.opened(a);
    // The open's walk wants c before the reader's first read of a arrives.
    expect(store.fits(8)).toBe(false);
    expect(store.take(a, 0)?.bytes.length).toBe(8);
    // a's block 1 was joined by the reader while in flight: it got it from that load.
    store.joined(a, 1);
    store.arrived(a, 1, block(8));
    expect(store.take(a, 1)).toBeNull();
    expect(store.fits(8)).toBe(true);
    store.started(c);
    expect(store.has(c)).toBe(true);
  });

  it('closes with files of several blocks held', () => {
    const store = new PrefetchStore(1 << 20, new Metrics());
    const big = meta('s/shard-1.tar', '1', 24);
    store.started(big);
    for (let i = 0; i < 3; i++) store.arrived(big, i, block(8));
    expect(() => store.close()).not.toThrow();
    expect(store.take(big, 1)).toBeNull();
  });
});
