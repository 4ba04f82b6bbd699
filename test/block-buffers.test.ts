import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { BlockBuffers } from '../src/blocks/block-buffers.js';
import { BlockSource } from '../src/blocks/block-source.js';
import { DEFAULT_DISK_CACHE, DiskCache } from '../src/blocks/disk-cache.js';
import { DownloadScheduler } from '../src/blocks/download-scheduler.js';
import { HandleReader } from '../src/blocks/handle-reader.js';
import { ReadaheadBudget } from '../src/blocks/readahead-budget.js';
import { MemoryBudget } from '../src/memory/memory-budget.js';
import type { ObjectClient, ObjectMeta } from '../src/gcs/object-client.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';

const BLOCK = 64 * 1024;

function buffers(poison = true, maxBlocks = 8): BlockBuffers {
  return new BlockBuffers({ blockSize: BLOCK, maxBytes: maxBlocks * BLOCK, poison, idleTrimMs: 60_000 });
}

/** Anonymous memory of this process in transparent huge pages, in KiB. */
function anonHugeKiB(): number {
  return Number(/AnonHugePages:\s+(\d+)/.exec(readFileSync('/proc/self/smaps_rollup', 'utf8'))?.[1] ?? 0);
}

/** Anonymous memory in RAM of each mapping of this process, in KiB, by the mapping's start address. */
function anonKiBByMapping(): Map<string, number> {
  const byStart = new Map<string, number>();
  let start = '';
  for (const line of readFileSync('/proc/self/smaps', 'utf8').split('\n')) {
    const range = /^([0-9a-f]+)-[0-9a-f]+ /.exec(line);
    if (range) start = range[1]!;
    const anon = /^Anonymous:\s+(\d+)/.exec(line);
    if (anon) byStart.set(start, Number(anon[1]));
  }
  return byStart;
}

const THP_OFF = !/\[(always|madvise)\]/.test(readFileSync('/sys/kernel/mm/transparent_hugepage/enabled', 'utf8'));

describe('block buffers', () => {
  it.skipIf(THP_OFF)('keeps blocks in transparent huge pages (the kernel pins them per page for O_DIRECT and FUSE replies)', () => {
    const pool = new BlockBuffers({ blockSize: 4 * 1024 * 1024, maxBytes: 64 * 1024 * 1024, poison: false, idleTrimMs: 60_000 });
    const before = anonHugeKiB();
    const lease = pool.lease(4 * 1024 * 1024);
    lease.bytes.fill(7);
    expect(anonHugeKiB() - before).toBeGreaterThanOrEqual(4096);
    lease.release();
    pool.close();
  });

  it('gives an idle buffer\'s memory back when it trims it, not when the garbage collector gets to it', async () => {
    const pool = new BlockBuffers({ blockSize: 4 * 1024 * 1024, maxBytes: 64 * 1024 * 1024, poison: false, idleTrimMs: 50 });
    const untouched = anonKiBByMapping();
    const lease = pool.lease(4 * 1024 * 1024);
    lease.bytes.fill(7);
    const bytes = lease.bytes; // a view a careless holder might keep: it must read zeros, not crash
    const touched = anonKiBByMapping();
    lease.release();
    expect(pool.pooled).toBe(1);
    await new Promise((r) => setTimeout(r, 300));
    expect(pool.pooled).toBe(0);
    // The buffer's own mapping, not the whole process (whose other allocations move meanwhile): it gained
    // the block's 4 MiB when touched and gave them all back when trimmed.
    const trimmed = anonKiBByMapping();
    const mappings = [...touched].filter(([start, kib]) => kib - (untouched.get(start) ?? 0) >= 4096);
    expect(mappings.length).toBeGreaterThanOrEqual(1);
    expect(mappings.some(([start, kib]) => kib - (trimmed.get(start) ?? 0) >= 4096)).toBe(true);
    expect(bytes[0]).toBe(0);
    pool.close();
  });

  it('reuses a buffer only once its last holder has released it, and poisons it then', () => {
    const pool = buffers(true, 1);
    const a = pool.lease(BLOCK);
    a.bytes.fill(1);
    const second = a.retain();
    a.release();
    expect(pool.inUse).toBe(1);
    expect(second.bytes[0]).toBe(1);
    second.release();
    expect(pool.inUse).toBe(0);
    expect(pool.pooled).toBe(1);
    const b = pool.lease(100);
    expect(b.bytes.length).toBe(100);
    expect(b.bytes.every((x) => x === 0xdb)).toBe(true);
    pool.close();
  });

  it('refuses bytes, retains and releases after the last release', () => {
    const pool = buffers();
    const a = pool.lease(BLOCK);
    a.release();
    expect(() => a.bytes).toThrow(/after release/);
    expect(() => a.retain()).toThrow(/after release/);
    expect(() => a.release()).toThrow(/twice/);
    // The buffer went back once: two new leases get two different buffers.
    const b = pool.lease(BLOCK);
    const c = pool.lease(BLOCK);
    b.bytes.fill(2);
    c.bytes.fill(3);
    expect(b.bytes[0]).toBe(2);
    pool.close();
  });

  it('lends page-aligned buffers within its budget, never past it, and reuses a released one', async () => {
    const pool = buffers(false, 2);
    const [a, b] = [pool.lease(BLOCK), pool.lease(BLOCK)];
    expect([a.directCapacity, b.directCapacity]).toEqual([BLOCK, BLOCK]);
    // A third is refused to a guess, and waits for a read.
    expect(pool.tryLease(BLOCK, 'readahead')).toBeNull();
    const c = pool.leaseWhenFree(BLOCK);
    expect(c).toBeInstanceOf(Promise);
    a.bytes.fill(7);
    a.release();
    const d = await c;
    expect(d.directCapacity).toBe(BLOCK);
    expect(d.bytes[0]).toBe(7); // the same buffer again (not poisoned in this pool)
    for (const l of [b, d]) l.release();
    expect(pool.inUse).toBe(0);
    expect(pool.pooled).toBe(2);
    expect(pool.residentBytes).toBe(2 * BLOCK);
    pool.close();
  });
});

describe('the memory budget', () => {
  const budget = (limitBlocks: number, headroomBlocks = 0) =>
    new MemoryBudget({ limitBytes: limitBlocks * BLOCK, demandHeadroomBytes: headroomBlocks * BLOCK, idleReclaimAfterMs: 20 });

  it('grants waiting reads in the order they came, and refuses guesses while any waits', async () => {
    const m = budget(2, 1);
    const held = [m.tryReserve(BLOCK, 'demand')!, m.tryReserve(BLOCK, 'demand')!];
    expect(m.tryReserve(BLOCK, 'readahead')).toBeNull();
    const order: string[] = [];
    const first = Promise.resolve(m.reserve(2 * BLOCK)).then((r) => (order.push('first (two blocks)'), r));
    const second = Promise.resolve(m.reserve(BLOCK)).then((r) => (order.push('second'), r));
    expect(m.waiting).toBe(2);
    held[0]!.release();
    await tick();
    // One block free: the second would fit, but it does not pass the first.
    expect(order).toEqual([]);
    held[1]!.release();
    (await first).release();
    (await second).release();
    expect(order).toEqual(['first (two blocks)', 'second']);
    expect(m.inUse).toBe(0);
    expect(m.peakInUse).toBe(2 * BLOCK);
    // Readahead leaves demand its headroom: one block of two.
    const r = m.tryReserve(BLOCK, 'readahead')!;
    expect(m.tryReserve(BLOCK, 'prefetch')).toBeNull();
    r.release();
  });

  it('asks holders for spare memory first, and for what idle readers hold only if a read still waits', async () => {
    const m = budget(2);
    const spare = m.tryReserve(BLOCK, 'demand')!;
    const current = m.tryReserve(BLOCK, 'demand')!;
    const asked: string[] = [];
    let spareHeld = true;
    m.addReclaimer((level, short) => {
      asked.push(level);
      if (spareHeld && short()) {
        spareHeld = false;
        spare.release();
      } else if (level === 'idle' && short()) current.release();
    });
    const a = await m.reserve(BLOCK);
    expect(asked).toEqual(['spare']);
    const b = await m.reserve(BLOCK);
    expect(asked).toEqual(['spare', 'spare', 'idle']);
    a.release();
    b.release();
    m.close();
  });
});

/**
 * No read ever waits on a read that waits: many readers, each reading its file in requests that cross
 * block boundaries, share a budget of two blocks (less than one reader's readahead window) and all finish.
 * Without reclaiming, or with a waiting read holding the block it has while it waits for the next, they
 * stop for good.
 */
describe('readers sharing a small memory budget', () => {
  const content = Buffer.alloc(12 * BLOCK);
  for (let i = 0; i < content.length; i += 4) content.writeUInt32LE(i, i);
  const client: ObjectClient = {
    bucket: 'b',
    probeBucket: async () => undefined,
    statObject: async () => null,
    list: async () => ({ objects: [], prefixes: [], nextPageToken: null }),
    readRange: async (_o, start, end, into) => {
      await new Promise((r) => setTimeout(r, 1));
      const out = into!.subarray(0, end - start);
      content.copy(out, 0, start, end);
      return out;
    },
  };
  /** Readers of files with `content`, their blocks from a budget of `limitBlocks`. */
  const setup = (limitBlocks: number) => {
    const memory = new MemoryBudget({ limitBytes: limitBlocks * BLOCK, demandHeadroomBytes: BLOCK, idleReclaimAfterMs: 20 });
    const pool = new BlockBuffers({ blockSize: BLOCK, budget: memory, poison: true, idleTrimMs: 60_000 });
    const source = new BlockSource({ client, disk: null, scheduler: new DownloadScheduler({ global: 16, perFile: 16 }), buffers: pool, wholeObjectThreshold: 0, log: silentLogger, metrics: new Metrics() });
    const reader = (name: string) => {
      const meta: ObjectMeta = { name, size: content.length, generation: '1', metageneration: '1', updatedMs: 0, crc32c: null };
      return new HandleReader(source, meta, { maxWindowBlocks: 8, budget: new ReadaheadBudget(64), memory });
    };
    const check = async (r: HandleReader, pos: number, length: number) => {
      const into = Buffer.alloc(length);
      const n = await r.read(pos, into);
      expect(n).toBe(length);
      expect(into.equals(content.subarray(pos, pos + n))).toBe(true);
    };
    return { memory, pool, reader, check };
  };

  it('all finish with the right bytes, within the budget', async () => {
    const { memory, pool, reader, check } = setup(2);
    const readAll = async (r: number) => {
      const h = reader(`o${r}`);
      // A third of a block at a time: every third request spans two blocks.
      const step = Math.floor(BLOCK / 3) + 5;
      for (let pos = 0; pos < content.length; pos += step) await check(h, pos, Math.min(step, content.length - pos));
      h.close();
    };
    await Promise.all(Array.from({ length: 8 }, (_, r) => readAll(r)));
    expect(memory.peakInUse).toBeLessThanOrEqual(2 * BLOCK);
    await tick();
    expect(memory.inUse).toBe(0);
    pool.close();
    memory.close();
  }, 20_000);

  it('a read across two blocks holds neither while it waits for memory', async () => {
    const { memory, pool, reader, check } = setup(2);
    const [a, b] = [reader('a'), reader('b')];
    // Each holds its block 0: the budget is spent.
    await Promise.all([check(a, 0, 4096), check(b, 0, 4096)]);
    expect(memory.inUse).toBe(2 * BLOCK);
    // Both read across blocks 0 and 1 at once: each needs another block, which only the other's block 0 can make room for.
    const t0 = Date.now();
    await Promise.all([check(a, BLOCK - 2048, 4096), check(b, BLOCK - 2048, 4096)]);
    // Without waiting for either reader to count as idle.
    expect(Date.now() - t0).toBeLessThan(500);
    a.close();
    b.close();
    pool.close();
    memory.close();
  }, 5_000);
});

/** An object store whose range reads finish only when the test says so. */
function slowClient(content: Buffer) {
  const waiting = new Map<number, () => void>();
  const client: ObjectClient = {
    bucket: 'b',
    probeBucket: async () => undefined,
    statObject: async () => null,
    list: async () => ({ objects: [], prefixes: [], nextPageToken: null }),
    readRange: (_object, start, end, into) =>
      new Promise((resolve) => {
        waiting.set(start, () => {
          const out = into ? into.subarray(0, end - start) : Buffer.alloc(end - start);
          content.copy(out, 0, start, end);
          resolve(out);
        });
      }),
  };
  const finish = (start: number) => {
    waiting.get(start)?.();
    waiting.delete(start);
  };
  return { client, finish, finishAll: () => [...waiting.keys()].forEach(finish), pending: () => waiting.size };
}

const tick = () => new Promise((r) => setImmediate(r));

/** A handle reader over `client`, its blocks from a pool of their own, no disk cache. */
function pooledReader(client: ObjectClient, meta: ObjectMeta): { pool: BlockBuffers; reader: HandleReader } {
  const pool = buffers();
  const source = new BlockSource({
    client,
    disk: null,
    scheduler: new DownloadScheduler({ global: 16, perFile: 16 }),
    buffers: pool,
    wholeObjectThreshold: 0,
    log: silentLogger,
    metrics: new Metrics(),
  });
  return { pool, reader: new HandleReader(source, meta, { maxWindowBlocks: 4, budget: new ReadaheadBudget(16) }) };
}

describe('a handle reader sharing pooled blocks', () => {
  it('copies the right bytes into a read that waited while a seek on the same handle dropped its blocks', async () => {
    const content = Buffer.alloc(16 * BLOCK);
    for (let i = 0; i < content.length; i += 4) content.writeUInt32LE(i, i);
    const meta: ObjectMeta = { name: 'o', size: content.length, generation: '1', metageneration: '1', updatedMs: 0, crc32c: null };
    const { client, finish, finishAll, pending } = slowClient(content);
    const { pool, reader } = pooledReader(client, meta);
    const expectBytes = (got: Buffer, at: number) => expect(got.equals(content.subarray(at, at + got.length))).toBe(true);

    // Block 2 arrives; block 3 (fetched ahead) does not yet.
    const a = Buffer.alloc(4096);
    const first = reader.read(2 * BLOCK, a);
    await tick();
    finish(2 * BLOCK);
    expect(await first).toBe(4096);
    expectBytes(a, 2 * BLOCK);
    await tick();

    // A read across blocks 2 and 3 waits on 3 ...
    const b = Buffer.alloc(4096);
    const across = reader.read(3 * BLOCK - 2048, b);
    expect(across).toBeInstanceOf(Promise);
    // ... while a seek drops both, and block 2's buffer, released by the handle, goes to a new download.
    const c = Buffer.alloc(4096);
    const far = reader.read(12 * BLOCK, c);
    await tick();
    expect(pending()).toBeGreaterThan(0);
    finishAll();
    expect(await across).toBe(4096);
    expect(await far).toBe(4096);
    expectBytes(b, 3 * BLOCK - 2048);
    expectBytes(c, 12 * BLOCK);

    // Once the handle is closed and the loads are over, every buffer is back in the pool.
    reader.close();
    finishAll();
    await tick();
    await tick();
    expect(pool.inUse).toBe(0);
    pool.close();
  });

  it('lends a view of a held block for a read inside it, held until released, and nothing for a block not here or a read across two', async () => {
    const content = Buffer.alloc(8 * BLOCK);
    for (let i = 0; i < content.length; i += 4) content.writeUInt32LE(i, i);
    const meta: ObjectMeta = { name: 'o', size: content.length - 100, generation: '1', metageneration: '1', updatedMs: 0, crc32c: null };
    const { client, finishAll } = slowClient(content);
    const { pool, reader } = pooledReader(client, meta);
    expect(reader.view(0, 4096)).toBeNull(); // nothing held yet
    expect(reader.holds(0, 4096)).toBe(false);
    const first = reader.read(0, Buffer.alloc(4096));
    // Held while it is still on its way: the read is this handle's, not the disk's.
    expect(reader.holds(0, 4096)).toBe(true);
    expect(reader.holds(6 * BLOCK, 4096)).toBe(false);
    await tick();
    finishAll();
    expect(await first).toBe(4096);
    await tick();
    // Kept until the end: a view holds its block as viewLater's does (a reply sent from another thread
    // may still be reading it after the handle let go).
    const v = reader.view(8192, 4096)!;
    expect(v.bytes.equals(content.subarray(8192, 8192 + 4096))).toBe(true);
    expect(reader.view(BLOCK - 10, 20)).toBeNull(); // spans blocks 0 and 1: read copies it
    // The object's last bytes: clamped to its size.
    const last = reader.read(meta.size - 1000, Buffer.alloc(4096));
    await tick();
    finishAll();
    expect(await last).toBe(1000);
    await tick();
    const tail = reader.view(meta.size - 500, 4096)!;
    expect(tail.bytes.length).toBe(500);
    expect(tail.bytes.equals(content.subarray(meta.size - 500, meta.size))).toBe(true);
    tail.release();
    // A block still on its way: a view once it is here, held until released (poisoned after).
    expect(reader.viewLater(3 * BLOCK - 10, 20)).toBeNull(); // spans blocks 2 and 3
    const later = reader.viewLater(3 * BLOCK + 100, 4096)!;
    await tick();
    finishAll();
    const v3 = await later;
    expect(v3.bytes.equals(content.subarray(3 * BLOCK + 100, 3 * BLOCK + 100 + 4096))).toBe(true);
    // The handle lets go of its blocks; the view still holds block 3, with its bytes, until released.
    reader.close();
    finishAll();
    await tick();
    await tick();
    expect(pool.inUse).toBe(2);
    expect(v.bytes.equals(content.subarray(8192, 8192 + 4096))).toBe(true);
    expect(v3.bytes.equals(content.subarray(3 * BLOCK + 100, 3 * BLOCK + 100 + 4096))).toBe(true);
    const viewed = [v.bytes, v3.bytes];
    v3.release();
    expect(pool.inUse).toBe(1);
    v.release();
    expect(pool.inUse).toBe(0);
    for (const bytes of viewed) expect(bytes.every((b) => b === 0xdb)).toBe(true);
    pool.close();
  });
});

describe('a reader joining a guess', () => {
  /**
   * A block source with one download slot over a client whose download of object 'x' waits for `openX`
   * (the slot stays busy), any other's lands in a millisecond; `started` lists the downloads in order.
   */
  const oneSlot = (disk: DiskCache | null = null) => {
    const started: string[] = [];
    let gate: (() => void) | null = null;
    const client: ObjectClient = {
      bucket: 'b',
      probeBucket: async () => undefined,
      statObject: async () => null,
      list: async () => ({ objects: [], prefixes: [], nextPageToken: null }),
      readRange: (object, start, end, into) =>
        new Promise((resolve) => {
          started.push(start === 0 ? object.name : `${object.name}@${start}`);
          const done = (): void => resolve(into!.subarray(0, end - start).fill(1));
          if (object.name === 'x') gate = done;
          else setTimeout(done, 1);
        }),
    };
    const source = new BlockSource({ client, disk, scheduler: new DownloadScheduler({ global: 1, perFile: 1 }), buffers: buffers(false, 16), wholeObjectThreshold: 8 * BLOCK, log: silentLogger, metrics: new Metrics() });
    const meta = (name: string, size: number): ObjectMeta => ({ name, size, generation: '1', metageneration: '1', updatedMs: 0, crc32c: null });
    return { source, meta, started, openX: () => gate!() };
  };

  it('moves a prefetched small object it waits on ahead of readahead (its promotion was lost before it was queued)', async () => {
    const { source, meta, started, openX } = oneSlot();
    const tick = () => new Promise((r) => setTimeout(r, 5));
    // The one download slot is busy; a small object (fetched whole) is prefetched; a readahead queues.
    const busy = source.get(meta('x', BLOCK), 0, 'demand');
    await tick();
    const guessed = source.get(meta('small', 2 * BLOCK), 0, 'prefetch');
    await tick();
    const readahead = source.get(meta('y', BLOCK), 0, 'readahead');
    await tick();
    // A reader opens the small object and waits for it: it goes next, before the readahead.
    const read = source.get(meta('small', 2 * BLOCK), 0, 'demand');
    openX();
    for (const b of await Promise.all([busy, guessed, readahead, read])) b.release();
    expect(started).toEqual(['x', 'small', 'y']);
  });

  it('moves a queued guess ahead of readahead when a reader waits on it elsewhere (promote: a read parked in the addon, a shard read waiting on its index)', async () => {
    const { source, meta, started, openX } = oneSlot();
    const tick = () => new Promise((r) => setTimeout(r, 5));
    const busy = source.get(meta('x', BLOCK), 0, 'demand');
    await tick();
    // Guesses: the second block of a large object, and a small object fetched whole; then readahead.
    const block = source.get(meta('big', 64 * BLOCK), 1, 'prefetch');
    const whole = source.get(meta('small', 2 * BLOCK), 1, 'prefetch');
    await tick();
    const readahead = source.get(meta('y', BLOCK), 0, 'readahead');
    await tick();
    // Readers wait on both without asking the source; promoting what is not on its way starts nothing.
    source.promote(meta('big', 64 * BLOCK), 1);
    source.promote(meta('small', 2 * BLOCK), 1);
    source.promote(meta('nothing', BLOCK), 0);
    openX();
    for (const b of await Promise.all([busy, block, whole, readahead])) b.release();
    expect(started).toEqual(['x', `big@${BLOCK}`, 'small', 'y']);
  });

  it("moves a queued range loaded apart from its blocks ahead of readahead when a reader waits on it (a shard's index fetched alone)", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gcsmount-promote-range-'));
    const disk = DiskCache.open({ dir, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE, addonWrites: false }, silentLogger, new Metrics());
    try {
      const { source, meta, started, openX } = oneSlot(disk);
      const tick = () => new Promise((r) => setTimeout(r, 5));
      const busy = source.get(meta('x', BLOCK), 0, 'demand');
      await tick();
      const shard = meta('shard', 16 * BLOCK);
      const index = source.getRange(shard, 16 * BLOCK - 4096, 4096, 'prefetch')!;
      await tick();
      const readahead = source.get(meta('y', BLOCK), 0, 'readahead');
      await tick();
      source.promoteRange(shard, 16 * BLOCK - 4096, 4096);
      source.promoteRange(shard, 0, 4096); // nothing on its way there: starts nothing
      openX();
      for (const b of await Promise.all([busy, index, readahead])) b.release();
      expect(started).toEqual(['x', `shard@${16 * BLOCK - 4096}`, 'y']);
    } finally {
      disk.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
