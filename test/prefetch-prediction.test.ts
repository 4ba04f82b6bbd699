import { describe, expect, it } from 'vitest';
import { ReadStream } from '../src/prefetch/read-stream.js';
import { chunkCount, indicesOfKey, keysAhead, keyOfIndices, parseArrayMetadata } from '../src/prefetch/zarr-layout.js';

describe('Zarr metadata -> chunk grid and key encoding', () => {
  it('v2 with the default "." separator, ragged last chunk', () => {
    const l = parseArrayMetadata('.zarray', JSON.stringify({ zarr_format: 2, shape: [10, 7], chunks: [4, 3] }))!;
    expect(l).toEqual({ grid: [3, 3], separator: '.', prefix: '' });
    expect(chunkCount(l)).toBe(9);
    expect(indicesOfKey(l, '2.1')).toEqual([2, 1]);
    expect(indicesOfKey(l, '3.0')).toBeNull(); // outside the grid
    expect(indicesOfKey(l, '.zarray')).toBeNull();
    expect(indicesOfKey(l, '01.1')).toBeNull();
  });

  it('v2 with "/" separator', () => {
    const l = parseArrayMetadata('.zarray', JSON.stringify({ shape: [4, 4, 4], chunks: [2, 2, 2], dimension_separator: '/' }))!;
    expect(l.separator).toBe('/');
    expect(keysAhead(l, '0/1/1', 1, 3)).toEqual(['1/0/0', '1/0/1', '1/1/0']);
  });

  it('v3 default encoding c/…, v2 encoding, and sharded arrays (the shards are the files)', () => {
    const v3 = parseArrayMetadata('zarr.json', JSON.stringify({ zarr_format: 3, node_type: 'array', shape: [6, 6], chunk_grid: { name: 'regular', configuration: { chunk_shape: [3, 2] } } }))!;
    expect(v3).toEqual({ grid: [2, 3], separator: '/', prefix: 'c/' });
    expect(keyOfIndices(v3, [1, 2])).toBe('c/1/2');
    expect(keysAhead(v3, 'c/0/2', 1, 2)).toEqual(['c/1/0', 'c/1/1']);
    const dotted = parseArrayMetadata('zarr.json', JSON.stringify({ node_type: 'array', shape: [4], chunk_grid: { name: 'regular', configuration: { chunk_shape: [1] } }, chunk_key_encoding: { name: 'default', configuration: { separator: '.' } } }))!;
    expect(keyOfIndices(dotted, [3])).toBe('c.3');
    const v2enc = parseArrayMetadata('zarr.json', JSON.stringify({ node_type: 'array', shape: [4, 4], chunk_grid: { name: 'regular', configuration: { chunk_shape: [2, 2] } }, chunk_key_encoding: { name: 'v2', configuration: { separator: '.' } } }))!;
    expect(keyOfIndices(v2enc, [1, 0])).toBe('1.0');
    const sharded = parseArrayMetadata(
      'zarr.json',
      JSON.stringify({ node_type: 'array', shape: [100, 100], chunk_grid: { name: 'regular', configuration: { chunk_shape: [50, 100] } }, codecs: [{ name: 'sharding_indexed', configuration: { chunk_shape: [10, 10] } }] }),
    )!;
    expect(sharded.grid).toEqual([2, 1]);
    expect(parseArrayMetadata('zarr.json', JSON.stringify({ node_type: 'group' }))).toBeNull();
    expect(parseArrayMetadata('.zarray', 'not json')).toBeNull();
  });

  it('walks backwards and stops at the ends of the grid', () => {
    const l = parseArrayMetadata('.zarray', JSON.stringify({ shape: [2, 2], chunks: [1, 1] }))!;
    expect(keysAhead(l, '1.0', -1, 5)).toEqual(['0.1', '0.0']);
    expect(keysAhead(l, '1.1', 1, 5)).toEqual([]);
  });
});

describe('ReadStream: how far ahead', () => {
  it('ramps up while reads land where predicted, capped', () => {
    const s = new ReadStream(16);
    expect(s.observe(0)).toBeNull();
    const distances: number[] = [];
    for (let p = 1; p < 8; p++) distances.push(s.observe(p)!.distance);
    expect(distances).toEqual([2, 4, 8, 16, 16, 16, 16]);
    expect(s.observe(8)).toEqual({ from: 8, direction: 1, distance: 16 });
  });

  it('parallel readers slightly out of order keep the stream; a jump ends it', () => {
    const s = new ReadStream(16);
    for (const p of [0, 1, 3, 2, 5, 4]) s.observe(p);
    expect(s.observe(6)!.distance).toBeGreaterThan(2);
    expect(s.observe(500)).toBeNull();
    expect(s.observe(40)).toBeNull();
  });

  it('follows a reader walking backwards', () => {
    const s = new ReadStream(8);
    s.observe(10);
    expect(s.observe(9)).toEqual({ from: 9, direction: -1, distance: 2 });
  });

  it('readers starting together at the beginning (1 then 0) start a stream forward, not one backwards from 0', () => {
    // Four readers splitting a walk: their first reads arrive in any order. A backward stream from 0
    // fetches nothing, and took 2 x CROWD_READS forward reads to be given up.
    const s = new ReadStream(32);
    s.observe(1);
    expect(s.observe(0)).toEqual({ from: 1, direction: 1, distance: 2 });
    expect(s.observe(3)).toEqual({ from: 3, direction: 1, distance: 4 });
    expect(s.observe(2)).toBeNull();
    expect(s.observe(4)!.distance).toBe(8);
  });

  it('a shuffled reader gets almost nothing ahead', () => {
    let seed = 7;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const s = new ReadStream(32);
    let ahead = 0;
    for (let i = 0; i < 1000; i++) ahead += s.observe(Math.floor(rand() * 10_000))?.distance ?? 0;
    expect(ahead).toBeLessThan(20);
  });

  /**
   * 16 readers splitting a walk (reader k reads k, k + 16, ...: dask threads, loader processes) in
   * waves: each wave's 16 reads in a random order, as the readers' fetches land.
   */
  const crowd = (seed: number, readers: number, waves: number): number[] => {
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const reads: number[] = [];
    for (let w = 0; w < waves; w++) {
      const wave = Array.from({ length: readers }, (_, k) => w * readers + k);
      for (let i = wave.length - 1; i > 0; i--) {
        const k = Math.floor(rand() * (i + 1));
        [wave[i], wave[k]] = [wave[k]!, wave[i]!];
      }
      reads.push(...wave);
    }
    return reads;
  };

  it('16 readers splitting a walk: the stream starts in their first waves and reaches ahead of each reader, not only of the front', () => {
    for (let seed = 1; seed <= 20; seed++) {
      const s = new ReadStream(32);
      const reads = crowd(seed, 16, 8);
      const distances = reads.map((p) => s.observe(p)?.distance ?? 0);
      // Started within the first two waves (one reader's "two neighbours in turn" rarely happen here).
      expect(Math.max(...distances.slice(0, 32)), `seed ${seed}`).toBeGreaterThan(0);
      // By the fifth wave, several files ahead of each reader: beyond the one-reader cap of 32.
      expect(Math.max(...distances.slice(4 * 16)), `seed ${seed}`).toBeGreaterThan(4 * 32);
      // Never past 32 files ahead of each of the 16 readers.
      expect(Math.max(...distances)).toBeLessThanOrEqual(16 * 32);
    }
  });

  it('a crowd that scatters (16 shuffled readers of a large array) starts no stream', () => {
    let seed = 11;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const order = Array.from({ length: 4096 }, (_, i) => i);
    for (let i = order.length - 1; i > 0; i--) {
      const k = Math.floor(rand() * (i + 1));
      [order[i], order[k]] = [order[k]!, order[i]!];
    }
    const s = new ReadStream(32);
    let ahead = 0;
    for (const p of order) ahead += s.observe(p)?.distance ?? 0;
    // A stream starts only when two reads in turn happen to be neighbours, and the next read ends it.
    expect(ahead).toBeLessThan(200);
  });
});
