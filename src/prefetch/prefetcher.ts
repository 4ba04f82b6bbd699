import type { BlockSource } from '../blocks/block-source.js';
import type { DiskCache } from '../blocks/disk-cache.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { Listing } from '../namespace/listing.js';
import type { Namespace } from '../namespace/namespace.js';
import { childPath, parentPath } from '../namespace/paths.js';
import { ArrayFinder, remember } from './array-finder.js';
import type { PrefetchStore } from './prefetch-store.js';
import { ReadStream } from './read-stream.js';
import { ShardFollower, type ByteRange, type ShardedArray } from './shard-follower.js';
import { chunkCount, indicesOfKey, indicesOfLinear, keyOfIndices, linearOf, type ZarrLayout } from './zarr-layout.js';

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

/** A folder whose files are opened in name order: the last one opened, its stream once it is one, the newest listing while a walk runs. */
interface FolderWalk {
  last: string;
  stream: ReadStream | null;
  listing: Listing | null;
}

/** A file a walk may fetch; `meta` when the walk took it from a listing (else it is looked up). */
interface WalkTarget {
  path: string;
  meta?: ObjectMeta;
}

interface ZarrArray {
  root: string;
  layout: ZarrLayout;
  stream: ReadStream;
  /** Set for a sharded v3 array: its inner chunks are followed instead of its files. */
  sharded: ShardedArray | null;
}

/** The grid indices of the chunk file at `path` of `array`, or null when its key names no chunk. */
function chunkIndices(array: ZarrArray, path: string): number[] | null {
  return indicesOfKey(array.layout, path.slice(array.root === '/' ? 1 : array.root.length + 1));
}

/** A chunk file's base name: digits joined by '.', or one Zarr v3 'c'. Anything else is not looked at as a chunk. */
const CHUNK_NAME = /^(c|[0-9]+)([.][0-9]+)*$/;

/**
 * Fetches files before they are opened, from what the opens so far say: the next chunks of a Zarr array
 * in C order (grid and key encoding from the array's own metadata, read through the mount's block
 * source), or the next files of a folder read in name order. Only keys the folder's listing has are
 * fetched (a missing Zarr chunk is a fill value), each pinned to the generation the listing gave, at the
 * scheduler's lowest priority, within a global budget, and never when it would make the disk cache evict.
 */
export class Prefetcher {
  private readonly arrays: ArrayFinder<ZarrArray>;
  private readonly shards: ShardFollower;
  private readonly folders = new Map<string, FolderWalk>();
  private inFlight = 0;
  private closed = false;
  /** Rounds waiting for one of the --prefetch-max-parallel-downloads slots. */
  private readonly slotWaiters: (() => void)[] = [];

  constructor(private readonly deps: PrefetcherDeps) {
    deps.metrics.setGauge('prefetch_in_flight', () => this.inFlight);
    const maxAhead = deps.config.maxFilesAhead;
    this.arrays = new ArrayFinder(deps, (root, layout) => ({
      root,
      layout,
      stream: new ReadStream(maxAhead),
      sharded: layout.sharding ? ShardFollower.array(root, layout, layout.sharding, maxAhead) : null,
    }));
    this.shards = new ShardFollower({
      ...deps,
      file: (path) => this.listed(path),
      turn: () => this.turn(),
      start: (meta, blocks) => this.startFetch(meta, blocks),
    });
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
    this.follow(path, meta).catch((err: unknown) => this.deps.log.debug({ path, err: String(err) }, 'prefetch failed'));
  }

  /**
   * An open of `path` about to be answered: a shard of an array already known as sharded is followed from
   * this open on, so its reads (the index, the first inner chunk) reach the prefetcher too. Otherwise
   * only the shard's later opens would be: opened() learns of it after the answer.
   */
  opening(path: string, meta: ObjectMeta): void {
    if (this.closed || !this.deps.config.zarr) return;
    const dir = parentPath(path);
    const array = this.arrays.known(dir);
    if (!array?.sharded || !CHUNK_NAME.test(path.slice(dir.length + 1))) return;
    const idx = chunkIndices(array, path);
    if (idx) this.shards.shardOpened(array.sharded, idx, meta);
  }

  /** Whether reads of this file move a walk (a shard of a followed array): they must all come here. */
  followsReads(meta: ObjectMeta): boolean {
    return this.shards.follows(meta);
  }

  /** For a read of a followed shard: the one inner chunk (or index) to fetch alone, or null (see ShardFollower.rangeFor). */
  innerRange(meta: ObjectMeta, pos: number, size: number): ByteRange | Promise<ByteRange | null> | null {
    return this.closed ? null : this.shards.rangeFor(meta, pos, size);
  }

  /** An open of a followed shard all on disk, read through the page cache: stands for a read (ShardFollower.openedThroughPageCache). */
  openedThroughPageCache(meta: ObjectMeta): void {
    if (!this.closed) this.shards.openedThroughPageCache(meta);
  }

  /** A read of an open file (before the block cache answers it): moves a reader through a sharded array. */
  read(meta: ObjectMeta, pos: number): void {
    if (!this.closed) this.shards.read(meta, pos);
  }

  private async follow(path: string, meta: ObjectMeta): Promise<void> {
    const { config } = this.deps;
    const dir = parentPath(path);
    const base = path.slice(dir.length + 1);
    if (config.zarr && CHUNK_NAME.test(base)) {
      const array = await this.arrays.arrayOf(dir);
      if (array) return this.followArray(array, path, meta);
    }
    if (config.siblings) await this.followFolder(dir, base);
  }

  private async followArray(array: ZarrArray, path: string, meta: ObjectMeta): Promise<void> {
    const idx = chunkIndices(array, path);
    if (!idx) return;
    // A shard is opened once per inner chunk read: its reads say where the reader is, not this open
    // (unless it is read through the page cache: openedThroughPageCache).
    if (array.sharded) return this.shards.shardOpened(array.sharded, idx, meta);
    if (!array.stream.observe(linearOf(array.layout, idx))) return;
    const total = chunkCount(array.layout);
    await this.walk(array.stream, (from, direction, n) => {
      const targets: WalkTarget[] = [];
      for (let i = 1, p = from + direction; i <= n && p >= 0 && p < total; i++, p += direction) {
        targets.push({ path: childPath(array.root, keyOfIndices(array.layout, indicesOfLinear(array.layout, p))) });
      }
      return targets;
    });
  }

  private async followFolder(dir: string, base: string): Promise<void> {
    const state = this.folders.get(dir);
    if (!state) {
      remember(this.folders, dir, { last: base, stream: null, listing: null });
      return;
    }
    const previous = state.last;
    state.last = base;
    // Until two opens in a row are near neighbours going up in name order (as far as the names held say:
    // the pages that answered the opens hold the names after each), the folder is not worth a listing.
    // Random opens in a folder of 100,000 go up half the time, and would list it whole.
    if (!state.stream && !this.neighbours(dir, previous, base)) return;
    const listing = await this.deps.namespace.readdir(dir);
    state.listing = listing;
    const position = listing.fileOrdinal(base);
    if (position < 0) return;
    if (!state.stream) {
      state.stream = new ReadStream(this.deps.config.maxFilesAhead);
      const before = listing.fileOrdinal(previous);
      if (before >= 0) state.stream.observe(before);
    }
    if (!state.stream.observe(position)) return;
    // The walk names files from the newest listing an open brought, not the one it started with; the
    // listing is let go once no walk runs (a held one per followed folder, 10,000 of them, would be
    // memory outside the mount's budget).
    const stream = state.stream;
    try {
      await this.walk(stream, (from, direction, n) => (state.listing?.filesFrom(from, direction, n) ?? []).map((f) => ({ path: childPath(dir, f.name), meta: f.meta })));
    } finally {
      if (!stream.walking) state.listing = null;
    }
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
   * Fetches what `stream`'s reader will reach and no walk has dealt with yet, in order (`targetsAfter`
   * names the files after a position). One walk per stream at a time: opens meanwhile move the stream,
   * and the walk goes on to where it reaches then. (Each open used to walk the whole distance ahead
   * again, a lookup per file: 32 per open at the default distance, for files already on their way.) A
   * budget that says stop ends the walk, and the next open's walk starts again from there; a jump of the
   * reader makes it plan again from the reader's new place.
   */
  private async walk(stream: ReadStream, targetsAfter: (from: number, direction: 1 | -1, n: number) => WalkTarget[]): Promise<void> {
    if (stream.walking) return;
    stream.walking = true;
    try {
      for (let plan = stream.unplanned(); plan; plan = stream.unplanned()) {
        const epoch = stream.epoch;
        const targets = targetsAfter(plan.from, plan.direction, plan.distance);
        if (targets.length === 0) return;
        let position = plan.from;
        for (const target of targets) {
          position += plan.direction;
          if (!(await this.turn())) return;
          if (stream.epoch !== epoch) break;
          if (!(await this.fetchOne(target))) return;
          // A jump while it started: the position belongs to the old stream.
          if (stream.epoch !== epoch) break;
          stream.dealtWith(position);
        }
      }
    } finally {
      stream.walking = false;
    }
  }

  /** Starts the download of the target's file unless it is fetched, on its way or absent; false when a budget says stop. */
  private async fetchOne(target: WalkTarget): Promise<boolean> {
    const meta = target.meta ?? (await this.listed(target.path));
    if (!meta) {
      this.deps.metrics.inc('prefetch_fill_skipped');
      return true;
    }
    if (meta.size === 0 || this.deps.store.has(meta)) return true;
    return this.startFetch(meta);
  }

  /** Waits until fewer than --prefetch-max-parallel-downloads prefetches are in flight; false once closed. */
  private async turn(): Promise<boolean> {
    while (this.inFlight >= this.deps.config.maxParallel && !this.closed) await new Promise<void>((r) => this.slotWaiters.push(r));
    return !this.closed;
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

  /**
   * Starts one file's download if the budgets allow: its first blocks, or `only` these (an inner chunk
   * of a shard); false when they do not (stop this round).
   */
  private startFetch(meta: ObjectMeta, only?: number[]): boolean {
    const { blocks, disk, store, config, metrics } = this.deps;
    // Not kept by the disk cache (--file-cache-exclude-regex): nothing would keep what was fetched.
    if (blocks.excluded(meta)) return true;
    const blockCount = Math.min(config.maxBlocksPerFile, Math.ceil(meta.size / blocks.blockSize));
    const candidates = only ?? Array.from({ length: blockCount }, (_, i) => i);
    const missing = candidates.filter((i) => !blocks.cached(meta, i));
    const bytes = missing.reduce((n, i) => n + Math.min(blocks.blockSize, meta.size - i * blocks.blockSize), 0);
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

}


