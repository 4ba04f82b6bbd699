import { describe, expect, it } from 'vitest';
import type { HandleReader } from '../src/blocks/handle-reader.js';
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
