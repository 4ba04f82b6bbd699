import type { BlockSource } from '../blocks/block-source.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { Metrics } from '../observe/metrics.js';
import type { Namespace } from '../namespace/namespace.js';
import { baseName, childPath, parentPath } from '../namespace/paths.js';
import { ARRAY_METADATA_FILES, layoutOfDocument, parseArrayMetadata, type ZarrLayout } from './zarr-layout.js';

export interface ArrayFinderDeps {
  namespace: Namespace;
  blocks: BlockSource;
  metrics: Metrics;
}

/** Folders whose array-or-not answer is kept. */
const KNOWN_FOLDERS = 10_000;
/** Array metadata is small; anything larger than one block is not a .zarray we understand. */
const MAX_METADATA_BLOCKS = 1;
/** Zarr v2 consolidated metadata: every array's .zarray, in one file at the root of the store. */
const CONSOLIDATED_V2 = '.zmetadata';
/** Zarr v3: a group's zarr.json, which holds the store's consolidated metadata when it was consolidated. */
const GROUP_V3 = 'zarr.json';
/** Consolidated metadata of thousands of arrays runs to megabytes; beyond this many blocks it is not read. */
const MAX_CONSOLIDATED_BLOCKS = 4;
/** Group folders looked through, above an array, for the store's consolidated metadata. */
const MAX_GROUP_DEPTH = 8;

type Consolidated = Record<string, unknown>;

/**
 * Which Zarr array a chunk folder belongs to, and its layout, found by lookups and read through the
 * block source (so through the cache, like any read). Kept per folder: each folder's answer is its
 * parent's when it has no metadata of its own, so the array's metadata is read once and all its chunk
 * folders share one answer (`make` builds what the caller keeps per array: its read streams).
 */
export class ArrayFinder<T> {
  private readonly arrays = new Map<string, Promise<T | null>>();
  /** The answers that have arrived, for callers that cannot wait (an open being answered). */
  private readonly settled = new Map<string, T | null>();
  /** Parsed consolidated metadata, per store root, format and generation. */
  private readonly consolidated = new Map<string, Promise<Consolidated | null>>();

  constructor(
    private readonly deps: ArrayFinderDeps,
    private readonly make: (root: string, layout: ZarrLayout) => T,
  ) {}

  /** The Zarr array whose chunks live in `dir` (its own folder, or below it with '/' keys), or null. */
  arrayOf(dir: string): Promise<T | null> {
    const known = this.arrays.get(dir);
    if (known) return known;
    const found = this.findArray(dir);
    remember(this.arrays, dir, found);
    // A failed listing is not an answer: ask again next time.
    found.then(
      (array) => {
        if (this.arrays.get(dir) === found) remember(this.settled, dir, array);
      },
      () => this.arrays.delete(dir),
    );
    return found;
  }

  /** The array of `dir` if its answer has arrived (null: not an array), undefined while unknown. */
  known(dir: string): T | null | undefined {
    return this.settled.get(dir);
  }

  /**
   * The array whose chunk folder `dir` is, from its metadata file, found by lookups: a listing of the
   * folder would cost a request per chunk folder of a nested store, and a whole listing of a flat one
   * (100,000 chunks) just to learn that `.zarray` is there.
   */
  private async findArray(dir: string): Promise<T | null> {
    for (const name of ARRAY_METADATA_FILES) {
      const e = await this.deps.namespace.lookup(childPath(dir, name));
      if (e?.kind !== 'file') continue;
      // An array in a consolidated store: its layout is in the store's consolidated metadata, which the
      // reader (xarray, zarr) has read already, so it is in the cache; the array's own file would be one
      // more GET per array.
      const consolidated = name === '.zarray' ? await this.consolidatedV2(dir) : await this.consolidatedV3(dir);
      const layout = consolidated ?? parseArrayMetadata(name, await this.readSmall(e.meta, MAX_METADATA_BLOCKS));
      if (layout) return this.make(dir, layout);
    }
    // Only folders named like chunk indices ('/'-separated keys, v3's 'c') can sit inside an array.
    const name = baseName(dir);
    if (dir === '/' || !/^(c|[0-9]+)$/.test(name)) return null;
    return this.arrayOf(parentPath(dir));
  }

  /**
   * The layout of the v2 array in `dir` from the consolidated metadata of the store it is in: `dir` itself
   * or a group folder above it (each with `.zgroup`) holding `.zmetadata`. Null when there is none, or it
   * does not name this array (then the array's own .zarray is read).
   */
  private async consolidatedV2(dir: string): Promise<ZarrLayout | null> {
    let folder = dir;
    let key = '';
    for (let depth = 0; depth <= MAX_GROUP_DEPTH; depth++) {
      const found = await this.deps.namespace.lookup(childPath(folder, CONSOLIDATED_V2));
      if (found?.kind === 'file') {
        const doc = await this.consolidatedOf(folder, found.meta, 'v2');
        return this.counted(layoutOfDocument('.zarray', doc?.[key ? `${key}/.zarray` : '.zarray']));
      }
      // Only a group can hold the store's root above; the first folder that is none ends the search.
      if (folder === '/' || (depth > 0 && (await this.deps.namespace.lookup(childPath(folder, '.zgroup')))?.kind !== 'file')) return null;
      key = key ? `${baseName(folder)}/${key}` : baseName(folder);
      folder = parentPath(folder);
    }
    return null;
  }

  /**
   * The same for a v3 array: zarr-python 3 consolidates into the root group's zarr.json
   * (`consolidated_metadata.metadata`, keyed by path from the root). The root is the topmost folder above
   * `dir` with a zarr.json, found by lookups alone, so groups in between cost no GET; the root's is the
   * one file the reader has read already.
   */
  private async consolidatedV3(dir: string): Promise<ZarrLayout | null> {
    let root: { folder: string; meta: ObjectMeta; key: string } | null = null;
    let folder = dir;
    let key = '';
    for (let depth = 0; depth < MAX_GROUP_DEPTH && folder !== '/'; depth++) {
      key = key ? `${baseName(folder)}/${key}` : baseName(folder);
      folder = parentPath(folder);
      const found = await this.deps.namespace.lookup(childPath(folder, GROUP_V3));
      if (found?.kind !== 'file') break;
      root = { folder, meta: found.meta, key };
    }
    if (!root) return null;
    const doc = await this.consolidatedOf(root.folder, root.meta, 'v3');
    return this.counted(layoutOfDocument('zarr.json', doc?.[root.key]));
  }

  private counted(layout: ZarrLayout | null): ZarrLayout | null {
    if (layout) this.deps.metrics.inc('prefetch_consolidated_layouts');
    return layout;
  }

  /** A store's consolidated metadata (path -> metadata document), parsed once per generation; null if unreadable or none. */
  private consolidatedOf(root: string, meta: ObjectMeta, format: 'v2' | 'v3'): Promise<Consolidated | null> {
    const id = `${root}#${format}#${meta.generation}`;
    const known = this.consolidated.get(id);
    if (known) return known;
    const parsed = this.readSmall(meta, MAX_CONSOLIDATED_BLOCKS).then((text) => {
      try {
        const doc = JSON.parse(text) as { metadata?: unknown; consolidated_metadata?: { metadata?: unknown } };
        const metadata = format === 'v2' ? doc.metadata : doc.consolidated_metadata?.metadata;
        return typeof metadata === 'object' && metadata !== null ? (metadata as Consolidated) : null;
      } catch {
        return null;
      }
    });
    remember(this.consolidated, id, parsed);
    parsed.catch(() => this.consolidated.delete(id));
    return parsed;
  }

  /** A metadata file's text, read through the block source; '' when over `maxBlocks`. */
  private async readSmall(meta: ObjectMeta, maxBlocks: number): Promise<string> {
    const { blocks } = this.deps;
    if (meta.size > maxBlocks * blocks.blockSize || meta.size === 0) return '';
    const parts: Buffer[] = [];
    for (let i = 0; i * blocks.blockSize < meta.size; i++) {
      const data = await blocks.get(meta, i, 'demand');
      try {
        parts.push(Buffer.from(data.bytes));
      } finally {
        data.release();
      }
    }
    return Buffer.concat(parts).toString('utf8');
  }
}

/** Sets `key` in a map kept to KNOWN_FOLDERS entries, the oldest dropped first. */
export function remember<T>(map: Map<string, T>, key: string, value: T): void {
  map.set(key, value);
  if (map.size > KNOWN_FOLDERS) map.delete(map.keys().next().value!);
}
