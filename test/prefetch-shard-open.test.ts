import { describe, expect, it } from 'vitest';
import type { BlockSource } from '../src/blocks/block-source.js';
import type { ObjectMeta } from '../src/gcs/object-client.js';
import type { Namespace } from '../src/namespace/namespace.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';
import { Prefetcher } from '../src/prefetch/prefetcher.js';
import { PrefetchStore } from '../src/prefetch/prefetch-store.js';
import { eventually } from './helpers/harness.js';

const metaOf = (name: string, size: number): ObjectMeta => ({ name, size, generation: '1', metageneration: '1', updatedMs: 0, crc32c: null });

/**
 * A sharded v3 array's shards are opened once per inner chunk, and a shard is followed (its reads reach
 * the prefetcher, not the native path or the kernel's readahead) only if that is decided before its open
 * is answered. Once the array is known, the first open of every further shard must be followed too.
 */
describe('Prefetcher: the first open of a shard of a known sharded array', () => {
  it('is followed from that open on, while opens before the array is known are not', async () => {
    // 2 x 2 shards of 50 x 100, inner chunks of 10 x 10; shards c/0/0 and c/0/1 share the folder c/0.
    const doc = JSON.stringify({
      zarr_format: 3,
      node_type: 'array',
      shape: [100, 200],
      chunk_grid: { name: 'regular', configuration: { chunk_shape: [50, 100] } },
      codecs: [{ name: 'sharding_indexed', configuration: { chunk_shape: [10, 10] } }],
    });
    const objects = new Map<string, ObjectMeta>([
      ['/arr/zarr.json', metaOf('arr/zarr.json', doc.length)],
      ['/arr/c/0/0', metaOf('arr/c/0/0', 100_000)],
      ['/arr/c/0/1', metaOf('arr/c/0/1', 100_000)],
    ]);
    const namespace = {
      lookup: async (path: string) => (objects.has(path) ? { kind: 'file', meta: objects.get(path)! } : null),
      heldListing: () => null,
    } as unknown as Namespace;
    const blocks = {
      blockSize: 1024 * 1024,
      // The metadata is read; a shard's index never arrives (what follows it is not under test here).
      get: (meta: ObjectMeta) => (meta.name === 'arr/zarr.json' ? Promise.resolve({ bytes: Buffer.from(doc), release: () => undefined, retain() { return this; } }) : new Promise(() => undefined)),
      cached: () => false,
      excluded: () => false,
      // As without a disk cache: nothing is fetched alone.
      getRange: () => null,
      hasMemoryFor: () => true,
    } as unknown as BlockSource;
    const metrics = new Metrics();
    const prefetcher = new Prefetcher({
      namespace,
      blocks,
      disk: null,
      store: new PrefetchStore(0, metrics),
      config: { zarr: true, siblings: false, maxFilesAhead: 8, maxParallel: 4, maxBlocksPerFile: 4 },
      log: silentLogger,
      metrics,
    });
    const first = objects.get('/arr/c/0/0')!;
    const second = objects.get('/arr/c/0/1')!;

    // The array is not known at the first shard's open: that open is not followed; its answer starts the search.
    prefetcher.opening('/arr/c/0/0', first);
    expect(prefetcher.followsReads(first)).toBe(false);
    prefetcher.opened('/arr/c/0/0', first);
    await eventually(async () => prefetcher.followsReads(first), 5_000);

    // Known now: the next shard is followed at its first open, before that open is answered.
    prefetcher.opening('/arr/c/0/1', second);
    expect(prefetcher.followsReads(second)).toBe(true);

    // A file of the folder that is no chunk is never taken for a shard.
    const other = metaOf('arr/c/0/notes.txt', 10);
    prefetcher.opening('/arr/c/0/notes.txt', other);
    expect(prefetcher.followsReads(other)).toBe(false);
    prefetcher.close();
  });
});
