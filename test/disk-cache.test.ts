import { constants, promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { BlockBuffers } from '../src/blocks/block-buffers.js';
import { DEFAULT_DISK_CACHE, DiskCache } from '../src/blocks/disk-cache.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';
import { tempDir } from './helpers/harness.js';

const BLOCK = 1024 * 1024;

describe('block files and O_DIRECT', () => {
  afterEach(() => vi.restoreAllMocks());

  it('falls back to the page cache, for good and without losing the block, where the file system refuses O_DIRECT', async () => {
    // tmpfs refused O_DIRECT with EINVAL before Linux 6.6; this kernel's accepts it, so the refusal is staged.
    const realOpen = fsp.open.bind(fsp);
    const directOpens: string[] = [];
    vi.spyOn(fsp, 'open').mockImplementation(async (path, flags, mode) => {
      if (typeof flags === 'number' && (flags & constants.O_DIRECT) !== 0) {
        directOpens.push(String(path));
        throw Object.assign(new Error('EINVAL: invalid argument, open'), { code: 'EINVAL' });
      }
      return realOpen(path, flags, mode);
    });
    const info = vi.fn();
    const log = { ...silentLogger, info, warn: vi.fn(), child: () => log } as unknown as typeof silentLogger;
    const dir = await tempDir('cache');
    const cache = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE }, log, new Metrics());
    const pool = new BlockBuffers({ blockSize: BLOCK, maxBytes: 4 * BLOCK, poison: false, idleTrimMs: 60_000 });
    try {
      const keys = [0, 1, 2].map((block) => ({ bucket: 'b', object: 'o', generation: '1', block, blockSize: BLOCK }));
      for (const [i, key] of keys.entries()) {
        const lease = pool.lease(BLOCK - 100 * i);
        lease.bytes.fill(i + 1);
        await cache.write(key, lease.bytes, lease.directCapacity);
        lease.release();
      }
      expect(directOpens).toHaveLength(1); // refused once, then no more asking
      expect(info.mock.calls.filter(([, msg]) => String(msg).includes('refuses O_DIRECT'))).toHaveLength(1);
      for (const [i, key] of keys.entries()) {
        const got = await cache.read(key);
        expect(got?.length).toBe(BLOCK - 100 * i);
        expect(got?.every((b) => b === i + 1)).toBe(true);
      }
      expect(cache.info().state).toBe('ok');
      expect((await fsp.readdir(join(dir, 'tmp'))).length).toBe(0);
    } finally {
      cache.close();
      pool.close();
      await fsp.rm(dir, { recursive: true, force: true });
    }
  });
});
