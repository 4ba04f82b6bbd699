import { describe, expect, it } from 'vitest';
import type { BlockData } from '../src/blocks/block-buffers.js';
import type { BlockSource } from '../src/blocks/block-source.js';
import { HandleReader } from '../src/blocks/handle-reader.js';
import { ReadaheadBudget } from '../src/blocks/readahead-budget.js';
import type { ObjectMeta } from '../src/gcs/object-client.js';
import { HandleTable } from '../src/fs/handles.js';

const meta = (name: string, generation: string, size = 10): ObjectMeta => ({ name, size, generation, metageneration: '1', updatedMs: 0, crc32c: null });
const readerOf = (m: ObjectMeta) => ({ meta: m }) as unknown as HandleReader;

describe('the table of sizes reported to the kernel', () => {
  it('holds at most its bound of paths, the most recently reported', () => {
    const table = new HandleTable({ ttlMs: 60_000, max: 3 });
    for (let i = 0; i < 10; i++) table.reportedToKernel(`/f${i}`, meta(`f${i}`, '1'));
    expect(table.reportedCount).toBe(3);
    const fresh = meta('f9', '2');
    expect(table.generationFor('/f9', fresh).generation).toBe('1'); // the one whose size the kernel holds
    expect(table.generationFor('/f0', meta('f0', '2')).generation).toBe('2'); // pushed out: the fresh one
  });

  it('forgets a size once the kernel\'s attribute timeout has passed, and frees the entries', () => {
    let now = 1_000; // lru-cache takes a start time of 0 for "no TTL"
    const table = new HandleTable({ ttlMs: 60_000, max: 1000, now: () => now });
    for (let i = 0; i < 100; i++) table.reportedToKernel(`/f${i}`, meta(`f${i}`, '1'));
    now += 59_000;
    expect(table.generationFor('/f5', meta('f5', '2')).generation).toBe('1'); // the kernel may still hold it
    now += 2_000;
    expect(table.generationFor('/f5', meta('f5', '2')).generation).toBe('2'); // it asks again now
    table.reportedToKernel('/new', meta('new', '1')); // a TTL has passed since the last sweep
    expect(table.reportedCount).toBe(1);
  });

  it('keeps an open file\'s generation for as long as it is open, however long that is', () => {
    let now = 1_000; // lru-cache takes a start time of 0 for "no TTL"
    const table = new HandleTable({ ttlMs: 1_000, max: 1, now: () => now });
    const old = meta('a', '1');
    table.reportedToKernel('/a', old);
    const fd = table.add('/a', readerOf(table.generationFor('/a', meta('a', '2'))));
    for (let i = 0; i < 50; i++) table.reportedToKernel(`/other${i}`, meta(`other${i}`, '1')); // pushes /a out
    now += 10 * 60_000;
    expect(table.generationFor('/a', meta('a', '2'))).toBe(old);
    expect(table.pinned('/a')).toBe(old);
    table.remove(fd);
    expect(table.generationFor('/a', meta('a', '2')).generation).toBe('2');
  });

  it('keeps a size for a second even when the kernel is told attributes expire at once', () => {
    let now = 1_000; // lru-cache takes a start time of 0 for "no TTL"
    const table = new HandleTable({ ttlMs: 0, max: 10, now: () => now });
    table.reportedToKernel('/a', meta('a', '1'));
    now += 500; // between the kernel's getattr and the open that follows it
    expect(table.generationFor('/a', meta('a', '2')).generation).toBe('1');
    now += 1_000;
    expect(table.generationFor('/a', meta('a', '2')).generation).toBe('2');
  });
});

describe('open handles when their object moves or is replaced', () => {
  it('follow a rename or an upload only of the generation they are pinned to', () => {
    const table = new HandleTable({ ttlMs: 60_000, max: 10 });
    const g1 = meta('a', '1');
    const r1 = readerOf(g1);
    const r2 = readerOf(g1);
    const fd1 = table.add('/a', r1);
    const fd2 = table.add('/a', r2);
    // The object at /a was replaced behind the mount (generation 2), and that one was renamed: the
    // handles stay on generation 1, under /a.
    expect(table.moved('/a', '/b', '2', meta('b', '3'))).toEqual([]);
    expect(table.pinned('/a')).toBe(g1);
    expect(table.pinned('/b')).toBeUndefined();
    expect(r1.meta).toBe(g1);
    // Generation 1 itself moved: both handles read the moved copy, under the new name.
    const moved = meta('b', '4');
    expect(table.moved('/a', '/b', '1', moved)).toEqual([fd1, fd2]);
    expect(table.pinned('/a')).toBeUndefined();
    expect(table.pinned('/b')).toBe(moved);
    expect([r1.meta, r2.meta, table.pathOf(fd1)]).toEqual([moved, moved, '/b']);
    // An upload over generation 4 (from === to) moves them on again; one over another generation does not.
    expect(table.moved('/b', '/b', '3', meta('b', '5'))).toEqual([]);
    expect(table.moved('/b', '/b', '4', meta('b', '6'))).toEqual([fd1, fd2]);
    expect(table.pinned('/b')?.generation).toBe('6');
  });
});

describe('a handle reader switched to a generation with other bytes', () => {
  const MIB = 1024 * 1024;
  const blockOf = (fill: number): BlockData => {
    const bytes = Buffer.alloc(MIB, fill);
    const data: BlockData = { bytes, directCapacity: 0, retain: () => data, release: () => undefined };
    return data;
  };

  it('answers from the new generation only, even when loads of the old one land after the switch', async () => {
    // Loads of generation 1 wait until let go; generation 2's block i is filled with 0x20 + i.
    const waiting: Array<() => void> = [];
    const asked: string[] = [];
    const source = {
      blockSize: MIB,
      get: (m: ObjectMeta, index: number): Promise<BlockData> => {
        asked.push(`${m.generation}:${index}`);
        if (m.generation === '2') return Promise.resolve(blockOf(0x20 + index));
        return new Promise((resolve) => waiting.push(() => resolve(blockOf(0x10 + index))));
      },
    } as unknown as BlockSource;
    const budget = new ReadaheadBudget(8);
    const reader = new HandleReader(source, meta('a', '1', 2 * MIB), { maxWindowBlocks: 4, budget });
    const first = reader.read(0, Buffer.alloc(1024)); // block 0 on demand, block 1 ahead
    expect(new Set(asked)).toEqual(new Set(['1:0', '1:1']));
    reader.regenerate(meta('a', '2', 3 * MIB));
    expect(budget.inUse).toBe(0); // the load ahead gave its share back
    for (const go of waiting) go();
    await first; // the read already under way answers with what it asked for
    for (const pos of [0, MIB, 2 * MIB]) {
      const into = Buffer.alloc(16);
      expect(await reader.read(pos, into)).toBe(16);
      expect(into[0]).toBe(0x20 + pos / MIB);
      expect(reader.view(pos, 16)?.bytes[0]).toBe(0x20 + pos / MIB);
    }
    reader.close();
  });
});
