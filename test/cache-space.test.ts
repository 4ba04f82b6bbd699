import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BlockIndex } from '../src/blocks/block-index.js';
import { CacheSpace } from '../src/blocks/eviction.js';
import { Metrics } from '../src/observe/metrics.js';

const MIB = 2 ** 20;

/**
 * CacheSpace with no budget (-1) on a small file system of its own (a 16 MiB tmpfs, so statfs says what
 * the test set up): what a block write that cannot get room does to the blocks already cached.
 */
describe('CacheSpace: the free-space margin with writes in flight', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'gcsmount-space-'));
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=16m', 'tmpfs', dir]);
  });
  afterAll(() => {
    execFileSync('umount', ['-l', dir]);
    rmSync(dir, { recursive: true, force: true });
  });

  it('evicts nothing for a write that evicting every cached block would still not make room for', () => {
    // 10 MiB taken by something else: ~6 MiB free, a margin of 0.8 MiB.
    writeFileSync(join(dir, 'filler'), Buffer.alloc(10 * MIB));
    const index = BlockIndex.open(join(dir, 'index.sqlite'));
    try {
      const row = (key: string) => ({ key, bucket: 'b', object: 'o', generation: '1', block: 0, size: MIB, crc32c: 0, lastAccess: 1 });
      index.putMany([row('a'.repeat(32)), row('b'.repeat(32))]);
      const metrics = new Metrics();
      const space = new CacheSpace({ dir, limit: { kind: 'unlimited' }, lowWatermark: 0.9 }, index, metrics, (k) => join(dir, k), () => undefined);
      // Another block's 4 MiB being written: ~1.2 MiB left above the margin, 2 MiB cached.
      space.reserve(4 * MIB);
      expect(space.keepMargin(4 * MIB)).toBe('none');
      expect(metrics.snapshot().counters.block_cache_evictions ?? 0).toBe(0);
      expect(index.totals().blocks).toBe(2);
      // A write that evicting makes room for still evicts.
      expect(space.keepMargin(2 * MIB)).not.toBe('none');
      expect(metrics.snapshot().counters.block_cache_evictions).toBeGreaterThan(0);
    } finally {
      index.close(true);
    }
  });
});
