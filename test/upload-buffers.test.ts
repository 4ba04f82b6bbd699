import { describe, expect, it } from 'vitest';
import { MemoryBudget } from '../src/memory/memory-budget.js';
import { UploadBuffers } from '../src/writes/upload-buffers.js';

const MIB = 1024 * 1024;
const budget = (mib: number) => new MemoryBudget({ limitBytes: mib * MIB, demandHeadroomBytes: 0, idleReclaimAfterMs: 10 });

describe('UploadBuffers', () => {
  it('lends the same memory again, keeps its reservation while idle, and gives it back after the idle time', async () => {
    const memory = budget(64);
    const pool = new UploadBuffers(memory, 8 * MIB, 2, 50);
    const a = await pool.take(8 * MIB);
    const first = a.bytes.buffer;
    a.release();
    a.release(); // twice is once
    expect(memory.inUse).toBe(8 * MIB);
    const b = await pool.take(3 * MIB);
    expect(b.bytes.buffer).toBe(first);
    expect(b.bytes.length).toBe(3 * MIB);
    b.release();
    await new Promise((r) => setTimeout(r, 120));
    expect(memory.inUse).toBe(0);
    pool.close();
  });

  it('a request above the chunk size gets its own, reserved, and is not kept', async () => {
    const memory = budget(64);
    const pool = new UploadBuffers(memory, 8 * MIB, 1, 10_000);
    const [a, b] = [await pool.take(8 * MIB), await pool.take(8 * MIB)];
    expect(memory.inUse).toBe(16 * MIB);
    a.release();
    b.release();
    expect(memory.inUse).toBe(16 * MIB); // two lent at once: both kept
    const big = await pool.take(20 * MIB);
    expect(memory.inUse).toBe(36 * MIB);
    big.release();
    expect(memory.inUse).toBe(16 * MIB);
    pool.close();
    expect(memory.inUse).toBe(0);
  });

  it('gives idle buffers to a read waiting for memory', async () => {
    const memory = budget(16);
    const pool = new UploadBuffers(memory, 8 * MIB, 2, 60_000);
    const [a, b] = [await pool.take(8 * MIB), await pool.take(8 * MIB)];
    a.release();
    b.release();
    expect(memory.inUse).toBe(16 * MIB);
    const granted = await Promise.race([Promise.resolve(memory.reserve(12 * MIB)), new Promise<null>((r) => setTimeout(() => r(null), 1000))]);
    expect(granted).not.toBeNull();
    expect(pool.idleBytes).toBe(0);
    granted!.release();
    pool.close();
  });
});

describe('UploadBuffers: many files written at once', () => {
  it('keeps as many idle buffers as were lent at once, then gives them back when idle', async () => {
    const memory = budget(64);
    const pool = new UploadBuffers(memory, 4 * MIB, 1, 80);
    const lent = [0, 1, 2, 3, 4].map(() => pool.tryTakeChunk()!);
    const first = lent.map((b) => b.bytes.buffer);
    for (const b of lent) b.release();
    expect(pool.idleBytes).toBe(20 * MIB); // five lent at once: five kept, not `keep` (1)
    const again = [0, 1, 2, 3, 4].map(() => pool.tryTakeChunk()!);
    expect(new Set(again.map((b) => b.bytes.buffer))).toEqual(new Set(first)); // the same memory, no fresh allocation
    for (const b of again) b.release();
    await new Promise((r) => setTimeout(r, 250));
    expect(pool.idleBytes).toBe(0);
    expect(memory.inUse).toBe(0);
    // Idle since: the peak starts again, and `keep` holds.
    const [a, b] = [pool.tryTakeChunk()!, pool.tryTakeChunk()!];
    a.release();
    b.release();
    expect(pool.idleBytes).toBe(8 * MIB);
    pool.close();
  });
});
