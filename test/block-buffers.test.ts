import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { BlockBuffers } from '../src/blocks/block-buffers.js';
import { BlockSource } from '../src/blocks/block-source.js';
import { DownloadScheduler } from '../src/blocks/download-scheduler.js';
import { HandleReader } from '../src/blocks/handle-reader.js';
import { ReadaheadBudget } from '../src/blocks/readahead-budget.js';
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

  it('gives an idle slab\'s memory back when it trims it, not when the garbage collector gets to it', async () => {
    const pool = new BlockBuffers({ blockSize: 4 * 1024 * 1024, maxBytes: 64 * 1024 * 1024, poison: false, idleTrimMs: 50 });
    const untouched = anonKiBByMapping();
    const lease = pool.lease(4 * 1024 * 1024);
    lease.bytes.fill(7);
    const bytes = lease.bytes; // a view a careless holder might keep: it must read zeros, not crash
    const touched = anonKiBByMapping();
    lease.release();
    await new Promise((r) => setTimeout(r, 300));
    expect(pool.pooled).toBe(0);
    // The slab's own mapping, not the whole process (whose other allocations move meanwhile): it gained
    // the block's 4 MiB when touched and gave them all back when trimmed.
    const trimmed = anonKiBByMapping();
    const slabMappings = [...touched].filter(([start, kib]) => kib - (untouched.get(start) ?? 0) >= 4096);
    expect(slabMappings.length).toBeGreaterThanOrEqual(1);
    expect(slabMappings.some(([start, kib]) => kib - (trimmed.get(start) ?? 0) >= 4096)).toBe(true);
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

  it('lends page-aligned slots up to its budget, then buffers of its own, and reuses a released slot', () => {
    const pool = buffers(false, 2);
    const [a, b, c] = [pool.lease(BLOCK), pool.lease(BLOCK), pool.lease(BLOCK)];
    expect([a.directCapacity, b.directCapacity, c.directCapacity]).toEqual([BLOCK, BLOCK, 0]);
    a.bytes.fill(7);
    a.release();
    const d = pool.lease(10);
    expect(d.directCapacity).toBe(BLOCK);
    expect(d.bytes[0]).toBe(7); // the same slot again (not poisoned in this pool)
    for (const l of [b, c, d]) l.release();
    expect(pool.inUse).toBe(0);
    expect(pool.pooled).toBe(2);
    pool.close();
  });
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

  it('lends a view of a held block for a read inside it, and nothing for a block not here or a read across two', async () => {
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
    const v = reader.view(8192, 4096)!;
    expect(v.equals(content.subarray(8192, 8192 + 4096))).toBe(true);
    expect(reader.view(BLOCK - 10, 20)).toBeNull(); // spans blocks 0 and 1: read copies it
    // The object's last bytes: clamped to its size.
    const last = reader.read(meta.size - 1000, Buffer.alloc(4096));
    await tick();
    finishAll();
    expect(await last).toBe(1000);
    await tick();
    const tail = reader.view(meta.size - 500, 4096)!;
    expect(tail.length).toBe(500);
    expect(tail.equals(content.subarray(meta.size - 500, meta.size))).toBe(true);
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
    expect(pool.inUse).toBe(1);
    expect(v3.bytes.equals(content.subarray(3 * BLOCK + 100, 3 * BLOCK + 100 + 4096))).toBe(true);
    const viewed = v3.bytes;
    v3.release();
    expect(pool.inUse).toBe(0);
    expect(viewed.every((b) => b === 0xdb)).toBe(true);
    pool.close();
  });
});
