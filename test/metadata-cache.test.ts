import { describe, expect, it } from 'vitest';
import type { ObjectMeta } from '../src/gcs/object-client.js';
import type { DirEntry } from '../src/namespace/entry.js';
import { listingOf } from '../src/namespace/listing.js';
import { MetadataCache, type MetadataCacheConfig } from '../src/namespace/metadata-cache.js';
import { Metrics } from '../src/observe/metrics.js';

const meta = (name: string, generation = '1'): ObjectMeta => ({ name, size: 10, generation, metageneration: '1', updatedMs: 0, crc32c: null });
const secs = (s: number) => ({ kind: 'ms' as const, ms: s * 1000 });

function make(overrides: Partial<MetadataCacheConfig> = {}) {
  const clock = { t: 1_000, now() { return this.t; } };
  const metrics = new Metrics();
  const cache = new MetadataCache({ ttl: secs(60), negativeTtl: secs(5), statBudget: { kind: 'bytes', bytes: 32 * 1024 * 1024 }, typeBudget: { kind: 'bytes', bytes: 4 * 1024 * 1024 }, clock, ...overrides }, metrics);
  return { cache, clock, metrics };
}

describe('metadata cache', () => {
  it('keeps files and directories for the TTL and negatives for the negative TTL', () => {
    const { cache, clock, metrics } = make();
    cache.remember('/a', { kind: 'file', meta: meta('a') });
    cache.remember('/d', { kind: 'dir', mtimeMs: null });
    cache.remember('/gone', null);
    expect(cache.lookup('/a', '/')).toMatchObject({ kind: 'file', meta: { name: 'a' } });
    expect(cache.lookup('/d', '/')).toMatchObject({ kind: 'dir' });
    expect(cache.lookup('/gone', '/')).toBe('missing');
    clock.t += 5_001;
    expect(cache.lookup('/gone', '/')).toBeUndefined();
    expect(cache.lookup('/a', '/')).toBeDefined();
    clock.t += 55_000;
    expect(cache.lookup('/a', '/')).toBeUndefined();
    expect(cache.lookup('/d', '/')).toBeUndefined();
    expect(metrics.get('meta_negative_hits')).toBe(1);
    expect(metrics.get('meta_misses')).toBe(3);
  });

  it('counts a TTL from the question, not the answer: a listing or a lookup that took 3 s expires 60 s after it was asked', () => {
    const { cache, clock } = make();
    const listing = listingOf('', [{ name: 'f', entry: { kind: 'file', meta: meta('f') } }]);
    listing.listedAt = clock.t;
    clock.t += 3_000; // the listing's last page
    cache.rememberListing('/', listing);
    clock.t += 56_000; // 59 s after it started
    expect(cache.lookup('/f', '/')).toMatchObject({ kind: 'file' });
    clock.t += 2_000; // 61 s: a name removed here at 0.5 s (its record kept until 60.5 s) must not come back
    expect(cache.lookup('/f', '/')).toBeUndefined();
    const asked = clock.t;
    clock.t += 3_000;
    cache.remember('/g', { kind: 'file', meta: meta('g') }, asked);
    clock.t += 56_000;
    expect(cache.lookup('/g', '/')).toBeDefined();
    clock.t += 2_000;
    expect(cache.lookup('/g', '/')).toBeUndefined();
    // "No such path" too: asked, then 3 s to answer, then trusted until 5 s after the question. A file
    // this mount created meanwhile is shown by its record for 5 s from the create: the answer, older
    // than the create, must be gone by then.
    const askedMissing = clock.t;
    clock.t += 3_000;
    cache.remember('/h', null, askedMissing);
    clock.t += 1_900;
    expect(cache.lookup('/h', '/')).toBe('missing');
    clock.t += 200;
    expect(cache.lookup('/h', '/')).toBeUndefined();
    // Asked longer ago than the negative TTL: not kept at all.
    cache.remember('/i', null, clock.t - 6_000);
    expect(cache.lookup('/i', '/')).toBeUndefined();
  });

  it('answers every name of a listed directory, present or not, and forgets a path that became missing', () => {
    const { cache } = make();
    const entries: DirEntry[] = [
      { name: 'f', entry: { kind: 'file', meta: meta('dir/f') } },
      { name: 'sub', entry: { kind: 'dir', mtimeMs: null } },
    ];
    const listing = listingOf('dir/', entries);
    cache.rememberListing('/dir', listing);
    expect(cache.listing('/dir')).toBe(listing);
    expect(listing.entries()).toEqual(entries);
    expect(cache.lookup('/dir/f', '/dir')).toMatchObject({ kind: 'file' });
    expect(cache.lookup('/dir/sub', '/dir')).toMatchObject({ kind: 'dir' });
    expect(cache.lookup('/dir/none', '/dir')).toBe('missing');
    cache.remember('/dir/sub', null);
    expect(cache.lookup('/dir/sub', '/dir')).toBe('missing');
  });

  it('with TTL -1 keeps entries forever; with 0 caches nothing positive but still honours the negative TTL', () => {
    const forever = make({ ttl: { kind: 'forever' } });
    forever.cache.remember('/a', { kind: 'file', meta: meta('a') });
    forever.clock.t += 1e12;
    expect(forever.cache.lookup('/a', '/')).toBeDefined();
    const off = make({ ttl: { kind: 'off' } });
    off.cache.remember('/a', { kind: 'file', meta: meta('a') });
    off.cache.rememberListing('/', listingOf('', [{ name: 'a', entry: { kind: 'file', meta: meta('a') } }]));
    off.cache.remember('/gone', null);
    expect(off.cache.lookup('/a', '/')).toBeUndefined();
    expect(off.cache.lookup('/gone', '/')).toBe('missing');
    const noNegatives = make({ negativeTtl: { kind: 'off' } });
    noNegatives.cache.remember('/gone', null);
    expect(noNegatives.cache.lookup('/gone', '/')).toBeUndefined();
  });

  it('stays within its byte budgets, evicting the least recently used', () => {
    const budget = 64 * 1024;
    const { cache } = make({ statBudget: { kind: 'bytes', bytes: budget }, typeBudget: { kind: 'bytes', bytes: budget / 4 } });
    for (let i = 0; i < 5_000; i++) cache.remember(`/dir/file-${i}`, { kind: 'file', meta: meta(`dir/file-${i}`) });
    const usage = cache.usage();
    expect(usage.statBytes).toBeLessThanOrEqual(budget);
    expect(usage.statBytes).toBeGreaterThan(budget / 2);
    expect(usage.typeBytes).toBeLessThanOrEqual(budget / 4);
    expect(cache.lookup('/dir/file-4999', '/dir')).toMatchObject({ kind: 'file', meta: { name: 'dir/file-4999' } });
    expect(cache.lookup('/dir/file-0', '/dir')).toBeUndefined();
  });

  it('caches nothing with a budget of 0', () => {
    const { cache } = make({ statBudget: { kind: 'off' }, typeBudget: { kind: 'off' } });
    cache.remember('/a', { kind: 'file', meta: meta('a') });
    cache.remember('/d', { kind: 'dir', mtimeMs: null });
    expect(cache.lookup('/a', '/')).toBeUndefined();
    expect(cache.lookup('/d', '/')).toBeUndefined();
  });
});
