import type { BlockSource } from '../blocks/block-source.js';
import type { DiskCache } from '../blocks/disk-cache.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { Namespace } from '../namespace/namespace.js';
import { baseName, childPath, parentPath } from '../namespace/paths.js';
import type { PrefetchStore } from './prefetch-store.js';
import { ReadStream } from './read-stream.js';
import { ARRAY_METADATA_FILES, chunkCount, indicesOfKey, indicesOfLinear, keyOfIndices, linearOf, parseArrayMetadata, type ZarrLayout } from './zarr-layout.js';

export interface PrefetchConfig {
  zarr: boolean;
  siblings: boolean;
  /** The furthest a stream may run ahead, in files. */
  maxFilesAhead: number;
  /** Prefetched files downloading at once, across all streams. */
  maxParallel: number;
  /** Blocks fetched ahead of one file: the open file's own readahead takes over from there. */
  maxBlocksPerFile: number;
}

export interface PrefetcherDeps {
  namespace: Namespace;
  blocks: BlockSource;
  disk: DiskCache | null;
  store: PrefetchStore;
  config: PrefetchConfig;
  log: Logger;
  metrics: Metrics;
}

interface ZarrArray {
  root: string;
  layout: ZarrLayout;
  stream: ReadStream;
}

/** A chunk file's base name: digits joined by '.', or one Zarr v3 'c'. Anything else is not looked at as a chunk. */
const CHUNK_NAME = /^(c|[0-9]+)([.][0-9]+)*$/;
/** Folders whose array-or-not answer is kept. */
const KNOWN_FOLDERS = 10_000;
/** Array metadata is small; anything larger than one block is not a .zarray we understand. */
const MAX_METADATA_BLOCKS = 1;
/** Zarr v2 consolidated metadata: every array's .zarray, in one file at the root of the store. */
const CONSOLIDATED = '.zmetadata';
/** Consolidated metadata of thousands of arrays runs to megabytes; beyond this many blocks it is not read. */
const MAX_CONSOLIDATED_BLOCKS = 4;
/** Group folders looked through, above an array, for the store's consolidated metadata. */
const MAX_GROUP_DEPTH = 8;

/**
 * Fetches files before they are opened, from what the opens so far say: the next chunks of a Zarr array
 * in C order (grid and key encoding from the array's own metadata, read through the mount's block
 * source), or the next files of a folder read in name order. Only keys the folder's listing has are
 * fetched (a missing Zarr chunk is a fill value), each pinned to the generation the listing gave, at the
 * scheduler's lowest priority, within a global budget, and never when it would make the disk cache evict.
 */
export class Prefetcher {
  private readonly arrays = new Map<string, Promise<ZarrArray | null>>();
  /** Parsed consolidated metadata, per store root and generation of its `.zmetadata`. */
  private readonly consolidated = new Map<string, Promise<Record<string, unknown> | null>>();
  private readonly folders = new Map<string, { last: string; stream: ReadStream | null }>();
  private inFlight = 0;
  private closed = false;
  /** Rounds waiting for one of the --prefetch-max-parallel-downloads slots. */
  private readonly slotWaiters: (() => void)[] = [];

  constructor(private readonly deps: PrefetcherDeps) {
    deps.metrics.setGauge('prefetch_in_flight', () => this.inFlight);
  }

  /** Stops starting downloads (the mount is going away); those in flight finish. */
  close(): void {
    this.closed = true;
    for (const wake of this.slotWaiters.splice(0)) wake();
  }

  /** An open of `path`, pinned to `meta`: counts a prefetch used, and maybe fetches what comes next. */
  opened(path: string, meta: ObjectMeta): void {
    this.deps.store.opened(meta);
    if (this.closed) return;
    this.follow(path).catch((err: unknown) => this.deps.log.debug({ path, err: String(err) }, 'prefetch failed'));
  }

  private async follow(path: string): Promise<void> {
    const { config } = this.deps;
    const dir = parentPath(path);
    const base = path.slice(dir.length + 1);
    if (config.zarr && CHUNK_NAME.test(base)) {
      const array = await this.arrayOf(dir);
      if (array) return this.followArray(array, path);
    }
    if (config.siblings) await this.followFolder(dir, base);
  }

  private async followArray(array: ZarrArray, path: string): Promise<void> {
    const key = path.slice(array.root === '/' ? 1 : array.root.length + 1);
    const idx = indicesOfKey(array.layout, key);
    if (!idx) return;
    const advice = array.stream.observe(linearOf(array.layout, idx));
    if (!advice) return;
    const total = chunkCount(array.layout);
    const paths: string[] = [];
    for (let i = 1, p = advice.from + advice.direction; i <= advice.distance && p >= 0 && p < total; i++, p += advice.direction) {
      paths.push(childPath(array.root, keyOfIndices(array.layout, indicesOfLinear(array.layout, p))));
    }
    const epoch = array.stream.epoch;
    await this.fetchAll(paths, () => array.stream.epoch === epoch);
  }

  private async followFolder(dir: string, base: string): Promise<void> {
    const state = this.folders.get(dir);
    if (!state) {
      this.remember(this.folders, dir, { last: base, stream: null });
      return;
    }
    const previous = state.last;
    state.last = base;
    // Until two opens in a row are near neighbours going up in name order (as far as the names held say:
    // the pages that answered the opens hold the names after each), the folder is not worth a listing.
    // Random opens in a folder of 100,000 go up half the time, and would list it whole.
    if (!state.stream && !this.neighbours(dir, previous, base)) return;
    const listing = await this.deps.namespace.readdir(dir);
    const position = listing.fileOrdinal(base);
    if (position < 0) return;
    if (!state.stream) {
      state.stream = new ReadStream(this.deps.config.maxFilesAhead);
      const before = listing.fileOrdinal(previous);
      if (before >= 0) state.stream.observe(before);
    }
    const advice = state.stream.observe(position);
    if (!advice) return;
    const paths = listing.filesFrom(advice.from, advice.direction, advice.distance).map((name) => childPath(dir, name));
    const stream = state.stream;
    const epoch = stream.epoch;
    await this.fetchAll(paths, () => stream.epoch === epoch);
  }

  /** Whether `base` is one of the two files after `previous` among the names held of `dir`. */
  private neighbours(dir: string, previous: string, base: string): boolean {
    const held = this.deps.namespace.heldListing(dir);
    if (!held) return false;
    const a = held.fileOrdinal(previous);
    const b = held.fileOrdinal(base);
    return a >= 0 && b > a && b - a <= 2;
  }

  /**
   * Fetches each path the listing of its folder has, in order, until a budget says stop or the reader
   * jumps elsewhere (`wanted` turns false) while this round waits for a download slot.
   */
  private async fetchAll(paths: string[], wanted: () => boolean): Promise<void> {
    for (const path of paths) {
      while (this.inFlight >= this.deps.config.maxParallel && !this.closed) await new Promise<void>((r) => this.slotWaiters.push(r));
      if (!wanted() || this.closed) return;
      const meta = await this.listed(path);
      if (!meta) {
        this.deps.metrics.inc('prefetch_fill_skipped');
        continue;
      }
      if (meta.size === 0 || this.deps.store.has(meta)) continue;
      if (!this.startFetch(meta)) return;
    }
  }

  /**
   * The object at `path`, or null when there is no such file. A lookup, not a listing of its folder: in
   * a nested store (`t2m/c/T/Y/X`) a listing per chunk folder would cost a request per folder, while the
   * lookup walk that answered the reader's own opens already holds the chunks after them.
   */
  private async listed(path: string): Promise<ObjectMeta | null> {
    let e;
    try {
      e = await this.deps.namespace.lookup(path);
    } catch {
      return null;
    }
    return e?.kind === 'file' ? e.meta : null;
  }

  /** Starts one file's download if the budgets allow; false when they do not (stop this round). */
  private startFetch(meta: ObjectMeta): boolean {
    const { blocks, disk, store, config, metrics } = this.deps;
    const blockCount = Math.min(config.maxBlocksPerFile, Math.ceil(meta.size / blocks.blockSize));
    const bytes = Math.min(meta.size, blockCount * blocks.blockSize);
    const missing: number[] = [];
    for (let i = 0; i < blockCount; i++) if (!blocks.cached(meta, i)) missing.push(i);
    // Already in the disk cache: the open will find it there.
    if (missing.length === 0) return true;
    // The mount's memory budget first: a guess never makes a read wait for memory.
    if (!store.fits(bytes) || !blocks.hasMemoryFor(missing.length * blocks.blockSize, 'prefetch')) {
      metrics.inc('prefetch_budget_stops');
      return false;
    }
    // Prefetched blocks would be the newest in the cache: any eviction they cause drops blocks that
    // were read more recently than these will be (maybe never). Stop before that.
    if (disk && disk.spareBytes < bytes) {
      metrics.inc('prefetch_budget_stops');
      return false;
    }
    store.started(meta);
    this.inFlight++;
    const loads: Promise<void>[] = [];
    for (const i of missing) {
      loads.push(blocks.get(meta, i, 'prefetch').then((data) => store.arrived(meta, i, data)));
    }
    void Promise.allSettled(loads).then(() => {
      this.inFlight--;
      this.slotWaiters.shift()?.();
    });
    return true;
  }

  /**
   * The Zarr array whose chunks live in `dir` (its own folder, or below it with '/' keys), or null. Kept
   * per folder, and each folder's answer is its parent's when it has no metadata of its own, so the
   * array's metadata is read once and all its chunk folders share one stream.
   */
  private arrayOf(dir: string): Promise<ZarrArray | null> {
    const known = this.arrays.get(dir);
    if (known) return known;
    const found = this.findArray(dir);
    this.remember(this.arrays, dir, found);
    // A failed listing is not an answer: ask again next time.
    found.catch(() => this.arrays.delete(dir));
    return found;
  }

  /**
   * The array whose chunk folder `dir` is, from its metadata file, found by lookups: a listing of the
   * folder would cost a request per chunk folder of a nested store, and a whole listing of a flat one
   * (100,000 chunks) just to learn that `.zarray` is there.
   */
  private async findArray(dir: string): Promise<ZarrArray | null> {
    for (const name of ARRAY_METADATA_FILES) {
      const e = await this.deps.namespace.lookup(childPath(dir, name));
      if (e?.kind !== 'file') continue;
      // A v2 array in a consolidated store: its layout is in the store's .zmetadata, which the reader
      // (xarray, zarr) has read already, so it is in the cache; the .zarray would be one more GET.
      const layout = (name === '.zarray' ? await this.consolidatedLayout(dir) : null) ?? parseArrayMetadata(name, await this.readSmall(e.meta, MAX_METADATA_BLOCKS));
      if (layout) return { root: dir, layout, stream: new ReadStream(this.deps.config.maxFilesAhead) };
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
  private async consolidatedLayout(dir: string): Promise<ZarrLayout | null> {
    let folder = dir;
    let key = '';
    for (let depth = 0; depth <= MAX_GROUP_DEPTH; depth++) {
      const found = await this.deps.namespace.lookup(childPath(folder, CONSOLIDATED));
      if (found?.kind === 'file') {
        const doc = await this.consolidatedOf(folder, found.meta);
        const zarray = doc?.[key ? `${key}/.zarray` : '.zarray'];
        if (typeof zarray !== 'object' || zarray === null) return null;
        const layout = parseArrayMetadata('.zarray', JSON.stringify(zarray));
        if (layout) this.deps.metrics.inc('prefetch_consolidated_layouts');
        return layout;
      }
      // Only a group can hold the store's root above; the first folder that is none ends the search.
      if (folder === '/' || (depth > 0 && (await this.deps.namespace.lookup(childPath(folder, '.zgroup')))?.kind !== 'file')) return null;
      key = key ? `${baseName(folder)}/${key}` : baseName(folder);
      folder = parentPath(folder);
    }
    return null;
  }

  /** `.zmetadata`'s "metadata" object, parsed once per store and generation; null if unreadable. */
  private consolidatedOf(root: string, meta: ObjectMeta): Promise<Record<string, unknown> | null> {
    const id = `${root}#${meta.generation}`;
    const known = this.consolidated.get(id);
    if (known) return known;
    const parsed = this.readSmall(meta, MAX_CONSOLIDATED_BLOCKS).then((text) => {
      try {
        const doc = JSON.parse(text) as { metadata?: unknown };
        return typeof doc.metadata === 'object' && doc.metadata !== null ? (doc.metadata as Record<string, unknown>) : null;
      } catch {
        return null;
      }
    });
    this.remember(this.consolidated, id, parsed);
    parsed.catch(() => this.consolidated.delete(id));
    return parsed;
  }

  /** A metadata file's text, read through the block source (so through the cache, like any read); '' when over `maxBlocks`. */
  private async readSmall(meta: ObjectMeta, maxBlocks: number): Promise<string> {
    const { blocks } = this.deps;
    if (meta.size > maxBlocks * blocks.blockSize) return '';
    if (meta.size === 0) return '';
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

  private remember<T>(map: Map<string, T>, key: string, value: T): void {
    map.set(key, value);
    if (map.size > KNOWN_FOLDERS) map.delete(map.keys().next().value!);
  }
}


