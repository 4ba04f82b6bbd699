/**
 * A Zarr array's chunk grid and chunk key encoding, learned from its own metadata, and the arithmetic
 * the prefetcher needs: key -> chunk indices -> position in C order (the order dask walks a grid, the
 * last dimension fastest) and back. Pure: no I/O, so the prediction logic is unit-tested on its own.
 */

import { parseSharding, type Sharding } from './zarr-shard.js';

export interface ZarrLayout {
  /** Chunks (v3 sharded arrays: shards, which are the files) per dimension. */
  grid: number[];
  /** Between chunk indices in a key: '.' or '/'. */
  separator: '.' | '/';
  /** Before the indices: '' for v2 and v3's "v2" encoding, 'c' + separator for v3's default encoding. */
  prefix: string;
  /** v3 sharding_indexed: how inner chunks sit in each shard; absent for unsharded arrays. */
  sharding?: Sharding;
}

/** The metadata file names that mark a folder as a Zarr array. */
export const ARRAY_METADATA_FILES = ['.zarray', 'zarr.json'] as const;

/** The layout of the array described by `.zarray` (v2) or `zarr.json` (v3) text; null if not an array. */
export function parseArrayMetadata(fileName: string, text: string): ZarrLayout | null {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    return null;
  }
  return layoutOfDocument(fileName, doc);
}

/** The same from the parsed document (consolidated metadata holds them parsed already). */
export function layoutOfDocument(fileName: string, doc: unknown): ZarrLayout | null {
  if (typeof doc !== 'object' || doc === null) return null;
  const d = doc as Record<string, unknown>;
  if (fileName === '.zarray') return v2Layout(d);
  if (fileName === 'zarr.json') return v3Layout(d);
  return null;
}

function v2Layout(d: Record<string, unknown>): ZarrLayout | null {
  const shape = intArray(d.shape);
  const chunks = intArray(d.chunks);
  if (!shape || !chunks || shape.length !== chunks.length) return null;
  const sep = d.dimension_separator === '/' ? '/' : '.';
  return { grid: gridOf(shape, chunks), separator: sep, prefix: '' };
}

function v3Layout(d: Record<string, unknown>): ZarrLayout | null {
  if (d.node_type !== 'array') return null;
  const shape = intArray(d.shape);
  const grid = d.chunk_grid as { name?: unknown; configuration?: { chunk_shape?: unknown } } | undefined;
  if (!shape || grid?.name !== 'regular') return null;
  // A sharded array's chunk_grid is the shard shape: shards are the files, which is what we fetch.
  const chunks = intArray(grid.configuration?.chunk_shape);
  if (!chunks || chunks.length !== shape.length) return null;
  const sharding = parseSharding(shape, chunks, d.codecs);
  const withSharding = (l: ZarrLayout): ZarrLayout => (sharding ? { ...l, sharding } : l);
  const enc = (d.chunk_key_encoding ?? { name: 'default' }) as { name?: unknown; configuration?: { separator?: unknown } };
  if (enc.name === 'v2') {
    return withSharding({ grid: gridOf(shape, chunks), separator: enc.configuration?.separator === '/' ? '/' : '.', prefix: '' });
  }
  if (enc.name !== 'default') return null;
  const sep = enc.configuration?.separator === '.' ? '.' : '/';
  return withSharding({ grid: gridOf(shape, chunks), separator: sep, prefix: `c${sep}` });
}

function intArray(v: unknown): number[] | null {
  if (!Array.isArray(v) || !v.every((x) => Number.isSafeInteger(x) && (x as number) >= 0)) return null;
  return v as number[];
}

function gridOf(shape: number[], chunks: number[]): number[] {
  return shape.map((n, i) => (chunks[i]! > 0 ? Math.ceil(n / chunks[i]!) : 0));
}

/** Chunks in the array. */
export function chunkCount(layout: ZarrLayout): number {
  return layout.grid.reduce((a, b) => a * b, 1);
}

/** The chunk indices a key (relative to the array folder) names, or null when it is not a chunk key. */
export function indicesOfKey(layout: ZarrLayout, key: string): number[] | null {
  if (!key.startsWith(layout.prefix)) return null;
  const rest = key.slice(layout.prefix.length);
  // A 0-d array has one chunk, "0" in v2 and "c" in v3's default encoding.
  if (layout.grid.length === 0) return rest === '0' || (rest === '' && layout.prefix !== '') ? [] : null;
  const parts = rest.split(layout.separator);
  if (parts.length !== layout.grid.length) return null;
  const out: number[] = [];
  for (let i = 0; i < parts.length; i++) {
    if (!/^(0|[1-9][0-9]*)$/.test(parts[i]!)) return null;
    const n = Number(parts[i]);
    if (n >= layout.grid[i]!) return null;
    out.push(n);
  }
  return out;
}

/** The key of a chunk, relative to the array folder. */
export function keyOfIndices(layout: ZarrLayout, indices: readonly number[]): string {
  if (indices.length === 0) return layout.prefix === '' ? '0' : layout.prefix.slice(0, -1);
  return layout.prefix + indices.join(layout.separator);
}

/** Position of a chunk in C order: the last dimension fastest. */
export function linearOf(layout: ZarrLayout, indices: readonly number[]): number {
  let n = 0;
  for (let i = 0; i < layout.grid.length; i++) n = n * layout.grid[i]! + indices[i]!;
  return n;
}

/** The chunk at C-order position `linear`. */
export function indicesOfLinear(layout: ZarrLayout, linear: number): number[] {
  const out = new Array<number>(layout.grid.length);
  for (let i = layout.grid.length - 1; i >= 0; i--) {
    const g = layout.grid[i]!;
    out[i] = linear % g;
    linear = Math.floor(linear / g);
  }
  return out;
}

/** The keys of the next `count` chunks after `key` in C order, walking `direction` (+1 or -1). */
export function keysAhead(layout: ZarrLayout, key: string, direction: 1 | -1, count: number): string[] {
  const idx = indicesOfKey(layout, key);
  if (!idx) return [];
  const total = chunkCount(layout);
  const out: string[] = [];
  for (let p = linearOf(layout, idx) + direction, i = 0; i < count && p >= 0 && p < total; p += direction, i++) {
    out.push(keyOfIndices(layout, indicesOfLinear(layout, p)));
  }
  return out;
}
