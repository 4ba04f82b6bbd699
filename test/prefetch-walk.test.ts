import { describe, expect, it } from 'vitest';
import type { BlockSource } from '../src/blocks/block-source.js';
import type { ObjectMeta } from '../src/gcs/object-client.js';
import type { Namespace } from '../src/namespace/namespace.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';
import { Prefetcher } from '../src/prefetch/prefetcher.js';
import { PrefetchStore } from '../src/prefetch/prefetch-store.js';

const metaOf = (name: string, size: number): ObjectMeta => ({ name, size, generation: '1', metageneration: '1', updatedMs: 0, crc32c: null });
const settle = () => new Promise((r) => setTimeout(r, 5));

/**
 * A reader opening a Zarr array's chunks in order: each open moves the stream, and what it reaches
 * beyond the last walk is fetched. Files already dealt with are not looked up again at every open (they
 * were: 32 lookups per open at the default distance).
 */
describe('Prefetcher: a stream walked once', () => {
  async function run(order: number[], opts: { budgetStopsAt?: number; budgetBackAt?: number; excluded?: boolean } = {}) {
    const chunks = 400;
    const zarray = JSON.stringify({ zarr_format: 2, shape: [chunks], chunks: [1], dtype: '<f4', order: 'C', dimension_separator: '.', compressor: null, fill_value: 0, filters: null });
    const objects = new Map<string, ObjectMeta>([['/arr/.zarray', metaOf('arr/.zarray', zarray.length)]]);
    for (let i = 0; i < chunks; i++) objects.set(`/arr/${i}`, metaOf(`arr/${i}`, 4));
    const lookups = new Map<string, number>();
    const namespace = {
      lookup: async (path: string) => {
        lookups.set(path, (lookups.get(path) ?? 0) + 1);
        return objects.has(path) ? { kind: 'file', meta: objects.get(path)! } : null;
      },
      heldListing: () => null,
    } as unknown as Namespace;
    const fetched: string[] = [];
    let allowed = opts.budgetStopsAt ?? Infinity;
    const data = (bytes: Buffer) => ({ bytes, release: () => undefined, retain() { return this; } });
    const blocks = {
      blockSize: 1024 * 1024,
      get: (meta: ObjectMeta) => {
        if (meta.name !== 'arr/.zarray') fetched.push(meta.name);
        return Promise.resolve(data(meta.name === 'arr/.zarray' ? Buffer.from(zarray) : Buffer.alloc(4)));
      },
      cached: () => false,
      excluded: () => opts.excluded ?? false,
      hasMemoryFor: () => allowed-- > 0,
    } as unknown as BlockSource;
    const metrics = new Metrics();
    const store = new PrefetchStore(0, metrics);
    const prefetcher = new Prefetcher({
      namespace,
      blocks,
      disk: null,
      store,
      config: { zarr: true, siblings: false, maxFilesAhead: 32, maxParallel: 64, maxBlocksPerFile: 4 },
      log: silentLogger,
      metrics,
    });
    for (const i of order) {
      if (i === opts.budgetBackAt) allowed = Infinity;
      prefetcher.opened(`/arr/${i}`, objects.get(`/arr/${i}`)!);
      await settle();
    }
    prefetcher.close();
    const chunkLookups = [...lookups].filter(([p]) => /^\/arr\/\d+$/.test(p)).reduce((n, [, c]) => n + c, 0);
    return { fetched, chunkLookups };
  }

  it('fetches nothing ahead of objects the disk cache does not keep (--file-cache-exclude-regex)', async () => {
    const { fetched } = await run(Array.from({ length: 40 }, (_, i) => i), { excluded: true });
    expect(fetched).toEqual([]);
  });

  it('looks each chunk up once, and fetches each chunk ahead of the reader once', async () => {
    const { fetched, chunkLookups } = await run(Array.from({ length: 200 }, (_, i) => i));
    // The reader opened 0..199; prefetch reached 32 beyond it.
    expect(new Set(fetched).size).toBe(fetched.length);
    expect(fetched).toContain('arr/231');
    expect(fetched).not.toContain('arr/232');
    expect(chunkLookups).toBeLessThanOrEqual(232);
  });

  it('after a budget stop, a later open goes on from where the walk stopped: nothing refused is skipped', async () => {
    const { fetched } = await run(Array.from({ length: 40 }, (_, i) => i), { budgetStopsAt: 5, budgetBackAt: 20 });
    // Refused from the sixth start until the reader's 20th open; from then on each chunk ahead of it.
    const ahead = fetched.map((name) => Number(name.slice(4)));
    expect(new Set(ahead).size).toBe(ahead.length);
    for (let c = 21; c <= 71; c++) expect(ahead).toContain(c);
  });

  it('a jump starts a new stream, which fetches from the reader\'s new place', async () => {
    const order = [...Array.from({ length: 20 }, (_, i) => i), ...Array.from({ length: 20 }, (_, i) => 300 + i)];
    const { fetched } = await run(order);
    expect(new Set(fetched).size).toBe(fetched.length);
    expect(fetched).toContain('arr/340');
    expect(fetched).toContain('arr/51');
  });
});
