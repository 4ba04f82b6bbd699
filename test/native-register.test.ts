import { describe, expect, it, vi } from 'vitest';
import type { BlockSource } from '../src/blocks/block-source.js';
import type { BlockData } from '../src/blocks/block-buffers.js';
import type { DiskCache } from '../src/blocks/disk-cache.js';
import type { FuseAddon, NativeFile } from '../src/fs/kernel.js';
import { NativeReads } from '../src/fs/native-reads.js';
import type { ObjectMeta } from '../src/gcs/object-client.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';

/** The addon's side as these tests need it: every call succeeds unless `overrides` says otherwise. */
function fakeFuse(overrides: Partial<Record<keyof FuseAddon, unknown>>): FuseAddon {
  return {
    startNativeReads: () => true,
    nativeStats: () => new Array(16).fill(0),
    expectBlock: () => true,
    addBlocks: () => undefined,
    lendBlock: () => true,
    revokeBlock: () => undefined,
    loanServed: () => false,
    blockLanded: () => undefined,
    ...overrides,
  } as unknown as FuseAddon;
}

/**
 * A read of a block on its way to disk waits in the addon, where JavaScript does not see it: the block
 * it starts at must be promoted as it is registered, or a prefetch still queued behind the mount's other
 * downloads kept it waiting up to the addon's 10 s limit. The blocks after it are expectations only.
 */
describe('registering blocks on their way to disk with the native side', () => {
  it("promotes the download of the block the read starts at, and only that one", () => {
    const promoted: number[] = [];
    const expected: number[] = [];
    const fuse = fakeFuse({
      expectBlock: (_file: NativeFile, block: number) => {
        expected.push(block);
        return true;
      },
    });
    const blocks = {
      blockSize: 1024,
      inMemory: () => false,
      diskRow: () => null,
      coming: (_meta: ObjectMeta, i: number) => ({ key: `k${i}`, landed: new Promise(() => undefined) }),
      promote: (_meta: ObjectMeta, i: number) => promoted.push(i),
      beingWritten: () => null,
    } as unknown as BlockSource;
    const disk = { blocksDir: '/nonexistent', direct: false, addAccessSource: () => undefined } as unknown as DiskCache;
    const reads = NativeReads.start({ fuse, blocks, disk, metrics: new Metrics(), log: silentLogger })!;
    const meta: ObjectMeta = { name: 'a/0.0', size: 8 * 1024, generation: '1', metageneration: '1', updatedMs: 0, crc32c: null };
    expect(reads.register({} as NativeFile, meta, 2, 4)).toBe(4);
    expect(expected).toEqual([2, 3, 4, 5]);
    expect(promoted).toEqual([2]);
  });
});

/**
 * A block lent to the addon that then does not reach the disk (no room, a failed write): its reads are
 * answered from the loan until the loan ends. Told at once, the addon dropped the block, gave back every
 * read of it after that, and the handle, holding it no longer, fetched it again.
 */
describe('a lent block that does not land', () => {
  it('is told to the addon as not landed only once its loan ends, after the loan is revoked', async () => {
    vi.useFakeTimers();
    try {
      const calls: string[] = [];
      const fuse = fakeFuse({
        revokeBlock: (key: string) => calls.push(`revoke ${key}`),
        blockLanded: (key: string, _crc: number, size: number) => calls.push(`landed ${key} ${size}`),
      });
      let land!: (row: null) => void;
      const blocks = {
        blockSize: 1024,
        inMemory: () => false,
        diskRow: () => null,
        coming: (_meta: ObjectMeta, i: number) => (i === 0 ? { key: 'k0', landed: new Promise<null>((r) => (land = r)) } : null),
        promote: () => undefined,
        beingWritten: () => null,
      } as unknown as BlockSource;
      const disk = { blocksDir: '/nonexistent', direct: false, addAccessSource: () => undefined } as unknown as DiskCache;
      const reads = NativeReads.start({ fuse, blocks, disk, metrics: new Metrics(), log: silentLogger })!;
      const meta: ObjectMeta = { name: 'a/0.0', size: 1024, generation: '1', metageneration: '1', updatedMs: 0, crc32c: null };
      expect(reads.register({} as NativeFile, meta, 0, 1)).toBe(1);
      let released = 0;
      const block = { bytes: Buffer.alloc(1024), retain() { return this; }, release: () => void released++ } as unknown as BlockData;
      reads.lend('k0', block);
      land(null);
      await vi.advanceTimersByTimeAsync(0);
      expect(calls).toEqual([]);
      await vi.advanceTimersByTimeAsync(5_000);
      expect(calls).toEqual(['revoke k0', 'landed k0 0']);
      expect(released).toBe(1);
    } finally {
      vi.useRealTimers();
    }
  });
});

/**
 * More landed loans than are kept: those a read has been answered from end first. Ending the oldest
 * alone ended a sequential reader's next blocks, landed but not read yet, which it then read back from
 * their files.
 */
describe('landed loans over their count', () => {
  it('end the ones a read was answered from first, then the oldest', async () => {
    const revoked: string[] = [];
    const served = new Set(['k5']);
    const fuse = fakeFuse({
      revokeBlock: (key: string) => revoked.push(key),
      loanServed: (key: string) => served.has(key),
    });
    const lands: ((row: { key: string; crc32c: number; size: number }) => void)[] = [];
    const blocks = {
      blockSize: 1024,
      inMemory: () => false,
      diskRow: () => null,
      coming: (_meta: ObjectMeta, i: number) => ({ key: `k${i}`, landed: new Promise((r) => (lands[i] = r)) }),
      promote: () => undefined,
    } as unknown as BlockSource;
    const disk = { blocksDir: '/nonexistent', direct: false, addAccessSource: () => undefined } as unknown as DiskCache;
    const reads = NativeReads.start({ fuse, blocks, disk, metrics: new Metrics(), log: silentLogger })!;
    const meta: ObjectMeta = { name: 'a/0.0', size: 10 * 1024, generation: '1', metageneration: '1', updatedMs: 0, crc32c: null };
    const block = { bytes: Buffer.alloc(1024), retain() { return this; }, release: () => undefined } as unknown as BlockData;
    // The handle holds each block (being written): each is lent as it is registered.
    expect(reads.register({} as NativeFile, meta, 0, 10, () => block)).toBe(10);
    for (let i = 0; i < 10; i++) {
      lands[i]!({ key: `k${i}`, crc32c: 0, size: 1024 });
      await Promise.resolve();
      await Promise.resolve();
    }
    expect(revoked).toEqual(['k5', 'k0']);
  });
});

/**
 * A file opened while its blocks' files are being written (a prefetched chunk file; the handle holds
 * none of them): the written bytes are lent as the blocks are registered, whole ones only. Not lent,
 * its reads waited for the landing, which a download worker tells up to 10 ms late with its next reply.
 */
describe('a block being written when its file is opened', () => {
  it('is lent from the write, as a block the handle holds is, when it is whole', () => {
    const lent: string[] = [];
    const fuse = fakeFuse({ lendBlock: (key: string) => (lent.push(key), true) });
    const whole = { bytes: Buffer.alloc(1024), retain() { return this; }, release: () => undefined } as unknown as BlockData;
    const short = { bytes: Buffer.alloc(100), retain() { return this; }, release: () => undefined } as unknown as BlockData;
    const blocks = {
      blockSize: 1024,
      inMemory: () => false,
      diskRow: () => null,
      coming: (_meta: ObjectMeta, i: number) => ({ key: `k${i}`, landed: new Promise(() => undefined) }),
      promote: () => undefined,
      beingWritten: (_meta: ObjectMeta, i: number) => (i === 0 ? whole : i === 1 ? short : null),
    } as unknown as BlockSource;
    const disk = { blocksDir: '/nonexistent', direct: false, addAccessSource: () => undefined } as unknown as DiskCache;
    const reads = NativeReads.start({ fuse, blocks, disk, metrics: new Metrics(), log: silentLogger })!;
    const meta: ObjectMeta = { name: 'a/0.0', size: 3 * 1024, generation: '1', metageneration: '1', updatedMs: 0, crc32c: null };
    expect(reads.register({} as NativeFile, meta, 0, 3)).toBe(3);
    expect(lent).toEqual(['k0']);
  });
});
