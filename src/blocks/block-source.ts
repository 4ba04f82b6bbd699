import { crc32c } from '../crc32c.js';
import { GcsError } from '../gcs/errors.js';
import type { ObjectClient, ObjectMeta, RangeHash, ReadPriority } from '../gcs/object-client.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import { slice, unpooled, type BlockBuffers, type BlockData } from './block-buffers.js';
import type { BlockRow } from './block-index.js';
import { blockFileKey } from './block-key.js';
import { BlockLanding } from './block-landing.js';
import type { CacheFilter } from './cache-filter.js';
import type { BlockKey, DiskCache } from './disk-cache.js';
import type { DownloadScheduler, Priority, Ticket } from './download-scheduler.js';
import { RecentBlocks } from './recent-blocks.js';

/** A whole object that keeps failing its checksum is not going to get better by asking forever. */
const CORRUPT_ATTEMPTS = 3;

/**
 * A guess (readahead, prefetch) skipped because the memory budget is short: not a failure of the block.
 * A reader that joined the guess meanwhile loads the block again, as demand.
 */
export class MemoryShortError extends Error {
  constructor() {
    super('memory budget short: readahead or prefetch skipped');
  }
}

/** How a load gets its memory: waiting in turn (a read, `gcsmount warm`), or only if there is room now. */
export type MemoryWait = 'wait' | 'skip';

export interface BlockSourceDeps {
  client: ObjectClient;
  disk: DiskCache | null;
  scheduler: DownloadScheduler;
  /** Where blocks are downloaded and read from disk into; its block size is the block size. */
  buffers: BlockBuffers;
  /**
   * Objects up to this size are fetched whole, in one GET, on their first read: a Zarr chunk is read
   * whole, once, through a fresh handle, so ramping a readahead window per handle would only cost more
   * requests (and GCS counts requests per bucket). The download is checked against the object's CRC32C.
   */
  wholeObjectThreshold: number;
  log: Logger;
  metrics: Metrics;
  /** Blocks fetched ahead of any open (src/prefetch) and held in memory when there is no disk cache. */
  prefetched?: PrefetchedBlocks;
  /** Which objects the disk cache keeps (--file-cache-include-regex / -exclude-regex); null: all. */
  cacheFilter?: CacheFilter | null;
}

/** Where load() looks before the disk cache: a block of exactly this generation, or null. */
export interface PrefetchedBlocks {
  /** The caller's own reference to the block, which the store no longer holds. */
  take(meta: ObjectMeta, index: number): BlockData | null;
  /** A reader's get() joined the block's load in flight (maybe a prefetch's): the reader has it from there. */
  joined(meta: ObjectMeta, index: number): void;
}

interface Pending {
  /** Resolves with the load's own reference: waiters take theirs from it. */
  promise: Promise<BlockData>;
  ticket: Ticket | null;
  /** The download's place in the request-rate queue: raised with the ticket when a reader waits on it. */
  rate: ReadPriority;
  /**
   * A reader waits on it. A whole object's download is promoted as soon as it is queued: one still
   * waiting for memory had no ticket, and a promotion asked for then was lost (the read waited in the
   * prefetch queue behind every demand and readahead download). A block's own is not (see load()).
   */
  demanded: boolean;
  /** The whole object's load this block is a slice of: waiting on the block is waiting on that. */
  whole: Pending | null;
}

/** A reader waits on `p`: it goes ahead of guesses, now or (a whole object's download) once it is queued. */
function demand(p: Pending): void {
  p.demanded = true;
  p.ticket?.promote();
  p.rate.priority = 'urgent';
  if (p.whole) demand(p.whole);
}

function queued(p: Pending, ticket: Ticket): void {
  p.ticket = ticket;
  if (p.demanded) ticket.promote();
}

/**
 * Blocks of followed shards kept in memory after their readers let go (see RecentBlocks): a quarter of
 * the memory budget, at most 1 GiB. 16 blocks were too few for 16 readers of shards, who drift apart
 * as their processes start (a warm epoch still loaded each block two to three times from disk); an
 * eighth (340 MiB at the 2-core bench machine's default budget) was too few for a shuffled loader of a
 * 422 MB array, whose warm epoch read 101-129 blocks back from disk (1 with a quarter: 2.33-2.60 s ->
 * 1.97-2.19 s). Only followed shards' blocks are kept, the budget takes them back first when a read
 * waits, and idle ones go after 10 s.
 */
const RECENT_SHARE = 1 / 4;
const RECENT_MAX_BYTES = 1024 * 2 ** 20;

/**
 * Where every open file gets its blocks: the disk cache when it has them, otherwise GCS through the
 * download scheduler. One load per block at a time: readers of a block in flight wait on the same
 * load, whichever file they opened, and a reader that waits on a queued readahead promotes it.
 * Every caller of get() receives its own reference to the block and must release it.
 */
export class BlockSource {
  readonly blockSize: number;
  private readonly blocks = new Map<string, Pending>();
  private readonly wholes = new Map<string, Pending>();
  /** Loads of byte ranges kept apart from blocks (getRange). */
  private readonly ranges = new Map<string, Pending>();
  /** Blocks on their way to disk: served from there meanwhile, so a read right after a fetch never misses. */
  private readonly toDisk: BlockLanding;
  private readonly recent: RecentBlocks;

  constructor(private readonly deps: BlockSourceDeps) {
    this.blockSize = deps.buffers.blockSize;
    this.toDisk = new BlockLanding(deps);
    this.recent = new RecentBlocks(Math.min(RECENT_MAX_BYTES, Math.floor(deps.buffers.budget.limit * RECENT_SHARE)), deps.buffers.budget, this.blockSize);
    deps.metrics.setGauge('memory_recent_blocks_bytes', () => this.recent.bytes);
    deps.metrics.setGauge('downloads_in_flight', () => deps.scheduler.inFlight);
    deps.metrics.setGauge('downloads_queued', () => deps.scheduler.queued);
    deps.metrics.setGauge('block_buffers_in_use', () => deps.buffers.inUse);
    deps.metrics.setGauge('memory_block_buffers_resident_bytes', () => deps.buffers.residentBytes);
  }

  /**
   * Block `index` of the object; the caller owns one reference to it and releases it when done. Memory:
   * demand waits for it; readahead and prefetch are refused (MemoryShortError) when the budget is short,
   * unless `memory` says to wait (`gcsmount warm`, which must finish).
   */
  get(meta: ObjectMeta, index: number, priority: Priority = 'demand', memory: MemoryWait = priority === 'demand' ? 'wait' : 'skip', keepRecent = false): Promise<BlockData> {
    const id = blockId(meta, index);
    if (priority !== 'prefetch' && this.blocks.has(id)) this.deps.prefetched?.joined(meta, index);
    const got = this.shared(this.blocks, id, priority, (pending) => this.load(meta, index, priority, memory, pending, keepRecent)).then((b) => b.retain());
    if (memory === 'skip') return got;
    // Joined a guess that was then skipped for memory: load it again, this time waiting for memory.
    return got.catch((err: unknown) => {
      if (err instanceof MemoryShortError) return this.get(meta, index, priority, memory, keepRecent);
      throw err;
    });
  }

  /**
   * Bytes [offset, offset + length) of the object alone, kept in the disk cache as an entry of their own
   * (keyed by offset and length, not by block), for the caller to release; or null when a block holding
   * any of them is here or on its way (read that instead: the same bytes are never downloaded twice), or
   * there is no disk cache (nothing could keep them: a warm read would download them again). For the
   * small inner chunks of shards that a reader jumps between (ShardFollower.rangeFor).
   */
  getRange(meta: ObjectMeta, offset: number, length: number, priority: 'demand' | 'prefetch' = 'demand'): Promise<BlockData> | null {
    const disk = this.diskFor(meta);
    if (!disk || length <= 0 || length > this.blockSize) return null;
    for (let b = Math.floor(offset / this.blockSize); b <= Math.floor((offset + length - 1) / this.blockSize); b++) {
      const id = blockId(meta, b);
      if (this.blocks.has(id) || this.toDisk.has(id) || this.recent.has(id) || disk.lookup(this.diskKey(meta, b))) return null;
    }
    const id = rangeId(meta, offset, length);
    const load = (p: 'demand' | 'prefetch') => this.shared(this.ranges, id, p, (pending) => this.loadRange(disk, meta, offset, length, p, pending)).then((b) => b.retain());
    if (priority === 'prefetch') return load('prefetch');
    // Joined a guess that was then skipped for memory: load it again, this time waiting for memory.
    return load('demand').catch((err: unknown) => {
      if (err instanceof MemoryShortError) return load('demand');
      throw err;
    });
  }

  private async loadRange(disk: DiskCache, meta: ObjectMeta, offset: number, length: number, priority: 'demand' | 'prefetch', pending: Pending): Promise<BlockData> {
    const { metrics } = this.deps;
    const id = rangeId(meta, offset, length);
    const key = this.rangeKey(meta, offset, length);
    const beingWritten = this.toDisk.take(id);
    const row = beingWritten ? null : disk.lookup(key);
    const cached = beingWritten ?? (row ? await this.fromDisk(disk, row, length, priority, priority === 'demand' ? 'wait' : 'skip') : null);
    if (cached) {
      metrics.inc('block_cache_hits');
      metrics.inc('block_cache_hit_bytes', cached.bytes.length);
      return cached;
    }
    metrics.inc('block_cache_misses');
    metrics.inc('block_range_fetches');
    const lease = await this.leaseFor(length, priority, priority === 'demand' ? 'wait' : 'skip');
    const { result, ticket } = this.deps.scheduler.run(fileId(meta), priority, () => this.fetch(meta, offset, offset + length, pending.rate, lease));
    pending.ticket = ticket;
    const { block, crc32c } = await result;
    this.toDisk.keep(id, key, block, crc32c, null);
    return block;
  }

  /** See BlockLanding.preloadAhead (set by the native read path). */
  set preloadAhead(f: ((row: BlockRow) => void) | null) {
    this.toDisk.preloadAhead = f;
  }

  /** See BlockLanding.lendAhead (set by the native read path). */
  set lendAhead(f: ((fileKey: string, block: BlockData) => void) | null) {
    this.toDisk.lendAhead = f;
  }

  /** Lets go of the blocks kept in memory (the mount is stopping). */
  close(): void {
    this.recent.close();
  }

  /** Whether a guess of `bytes` would get memory now (a prefetch round asks before it starts a file). */
  hasMemoryFor(bytes: number, use: 'readahead' | 'prefetch'): boolean {
    return this.deps.buffers.budget.admits(bytes, use);
  }

  /** True when block `index` is kept in memory after a read (RecentBlocks): a read of it costs no disk read here. */
  inMemory(meta: ObjectMeta, index: number): boolean {
    return this.recent.has(blockId(meta, index));
  }

  /**
   * Block `index` while it is being written to disk, for a moment's use (a loan takes a reference of its
   * own), or null.
   */
  beingWritten(meta: ObjectMeta, index: number): BlockData | null {
    return this.toDisk.peek(blockId(meta, index));
  }

  /** True when block `index` is on disk (or on its way there): nothing to fetch ahead. */
  cached(meta: ObjectMeta, index: number): boolean {
    return this.toDisk.has(blockId(meta, index)) || (this.diskFor(meta)?.lookup(this.diskKey(meta, index)) ?? null) !== null;
  }

  /**
   * Block `index` when it is on its way to the disk cache (downloading, or being written): its block
   * file's key, and a promise of its index row once it is there (null if it does not get there: a failed
   * download, no room, no disk write). Null when it is not on its way (on disk already, or not asked for).
   */
  coming(meta: ObjectMeta, index: number): { key: string; landed: Promise<BlockRow | null> } | null {
    if (!this.diskFor(meta)) return null;
    const id = blockId(meta, index);
    const writing = this.toDisk.has(id);
    const loading = writing ? null : (this.blocks.get(id) ?? (this.fetchedWhole(meta) ? this.wholes.get(fileId(meta)) : undefined));
    if (!loading && !writing) return null;
    const key = this.diskKey(meta, index);
    return { key: blockFileKey(key), landed: this.toDisk.landing(id, key, loading?.promise ?? null) };
  }

  /**
   * A reader waits on block `index` without asking this source for it (a read parked in the addon for a
   * block on its way, a shard's read waiting on its index's load): the block's load, or the whole
   * object's it is part of, goes ahead of guesses. A queued prefetch otherwise waited behind every demand
   * and readahead download of the mount (a native read for up to its 10 s limit). Starts nothing.
   */
  promote(meta: ObjectMeta, index: number): void {
    const p = this.blocks.get(blockId(meta, index)) ?? (this.fetchedWhole(meta) ? this.wholes.get(fileId(meta)) : undefined);
    if (p) demand(p);
  }

  /** promote() for a range loaded apart from its blocks (getRange: a shard's index fetched alone). */
  promoteRange(meta: ObjectMeta, offset: number, length: number): void {
    const p = this.ranges.get(rangeId(meta, offset, length));
    if (p) demand(p);
  }

  /**
   * There is a disk cache, and it does not keep this object (--file-cache-exclude-regex, or outside
   * --file-cache-include-regex): its blocks are read as without a cache dir, and fetching them ahead of
   * an open would fetch them for nothing (the prefetcher's blocks wait in memory only without a disk).
   */
  excluded(meta: ObjectMeta): boolean {
    return this.deps.disk !== null && this.diskFor(meta) === null;
  }

  /** The disk cache, when it keeps this object. */
  private diskFor(meta: ObjectMeta): DiskCache | null {
    const { disk, cacheFilter } = this.deps;
    return disk && (!cacheFilter || cacheFilter(meta.name)) ? disk : null;
  }

  /** Whether the object's blocks are fetched in one download (see wholeObjectThreshold). */
  private fetchedWhole(meta: ObjectMeta): boolean {
    return meta.size > this.blockSize && meta.size <= this.deps.wholeObjectThreshold;
  }

  /**
   * The index row of block `index` when it is on disk with the length it must have (the native read path
   * registers these; a block of the wrong length is left to a JavaScript read, which drops it).
   */
  diskRow(meta: ObjectMeta, index: number): BlockRow | null {
    const row = this.diskFor(meta)?.lookup(this.diskKey(meta, index));
    return row && row.size === Math.min(meta.size, (index + 1) * this.blockSize) - index * this.blockSize ? row : null;
  }

  /** Whether every block of this generation is on disk with the length it must have (diskRow for each). */
  allOnDisk(meta: ObjectMeta): boolean {
    const n = Math.ceil(meta.size / this.blockSize);
    for (let i = 0; i < n; i++) if (!this.diskRow(meta, i)) return false;
    return true;
  }

  private shared(map: Map<string, Pending>, key: string, priority: Priority, work: (p: Pending) => Promise<BlockData>): Promise<BlockData> {
    const existing = map.get(key);
    if (existing) {
      this.deps.metrics.inc('block_shared_waits');
      if (priority === 'demand') demand(existing);
      return existing.promise;
    }
    const pending: Pending = { promise: Promise.resolve(unpooled(Buffer.alloc(0))), ticket: null, rate: { priority: priority === 'demand' ? 'urgent' : 'background' }, demanded: false, whole: null };
    const loaded = work(pending);
    pending.promise = loaded.finally(() => map.delete(key));
    // The load's own reference goes in a later macrotask: every waiter's retain() is a reaction to this
    // promise, so all of them run (as microtasks) before it, and nobody can find the load after that.
    loaded.then(
      (b) => setImmediate(() => b.release()),
      () => undefined,
    );
    map.set(key, pending);
    return pending.promise;
  }

  /** `keepRecent`: the block stays in memory a while after its readers let go (RecentBlocks). */
  private async load(meta: ObjectMeta, index: number, priority: Priority, memory: MemoryWait, pending: Pending, keepRecent: boolean): Promise<BlockData> {
    const { metrics } = this.deps;
    const disk = this.diskFor(meta);
    const id = blockId(meta, index);
    const beingWritten = this.toDisk.take(id);
    if (beingWritten) {
      metrics.inc('block_cache_hits');
      metrics.inc('block_cache_hit_bytes', beingWritten.bytes.length);
      return beingWritten;
    }
    const kept = this.deps.prefetched?.take(meta, index);
    if (kept) return kept;
    const recent = this.recent.take(id);
    if (recent) {
      metrics.inc('block_memory_hits');
      return recent;
    }
    const start = index * this.blockSize;
    const end = Math.min(meta.size, start + this.blockSize);
    if (disk) {
      // Only a block the index holds is worth a buffer.
      const row = disk.lookup(this.diskKey(meta, index));
      const cached = row ? await this.fromDisk(disk, row, end - start, priority, memory) : null;
      if (cached) {
        metrics.inc('block_cache_hits');
        metrics.inc('block_cache_hit_bytes', cached.bytes.length);
        if (keepRecent) this.recent.keep(id, cached);
        return cached;
      }
      metrics.inc('block_cache_misses');
    }
    if (this.fetchedWhole(meta)) {
      const whole = this.shared(this.wholes, fileId(meta), priority, (p) => this.loadWhole(meta, priority, memory, p));
      // The whole object's download is this block's too: a reader waiting on the block promotes it.
      const shared = this.wholes.get(fileId(meta));
      if (shared) {
        pending.whole = shared;
        pending.rate = shared.rate;
        if (pending.demanded) demand(shared);
      }
      // A view that holds a reference of its own to the whole object's buffer: taken in the reaction to
      // the load, before its own reference goes (a later macrotask; see shared()).
      const data = await whole;
      return slice(data.retain(), start, end);
    }
    // Memory first, then a download slot: a read waiting for memory holds no slot others could use.
    const lease = await this.leaseFor(end - start, priority, memory);
    const { result, ticket } = this.deps.scheduler.run(fileId(meta), priority, () => this.fetch(meta, start, end, pending.rate, lease));
    // A block's own promotion before it is queued is not kept: a readahead a reader caught up with early
    // then ran ahead of the others, and on a disk with room for two blocks those landed before being read
    // were evicted and fetched again (the small-disk test's 13 fetches became 16-18).
    pending.ticket = ticket;
    const { block, crc32c } = await result;
    this.stored(meta, index, block, crc32c, priority === 'prefetch' ? pending.rate : null);
    if (keepRecent) this.recent.keep(id, block);
    return block;
  }

  /** A buffer from the memory budget: waiting in turn, or refused at once (MemoryShortError). */
  private leaseFor(length: number, priority: Priority, memory: MemoryWait): BlockData | Promise<BlockData> {
    if (memory === 'wait') return this.deps.buffers.leaseWhenFree(length);
    const lease = this.deps.buffers.tryLease(length, priority === 'demand' ? 'demand' : priority);
    if (lease) return lease;
    throw new MemoryShortError();
  }

  private async fromDisk(disk: DiskCache, row: BlockRow, length: number, priority: Priority, memory: MemoryWait): Promise<BlockData | null> {
    const lease = await this.leaseFor(length, priority, memory);
    let found = false;
    try {
      found = (await disk.readRow(row, lease.bytes)) !== null;
      return found ? lease : null;
    } finally {
      if (!found) lease.release();
    }
  }

  private async loadWhole(meta: ObjectMeta, priority: Priority, memory: MemoryWait, pending: Pending): Promise<BlockData> {
    const lease = await this.leaseFor(meta.size, priority, memory);
    const { result, ticket } = this.deps.scheduler.run(fileId(meta), priority, () => this.fetch(meta, 0, meta.size, pending.rate, lease));
    queued(pending, ticket);
    const { block: data } = await result;
    for (let i = 0; i * this.blockSize < meta.size; i++) {
      const part = slice(data.retain(), i * this.blockSize, Math.min(meta.size, (i + 1) * this.blockSize));
      this.stored(meta, i, part, null);
      part.release();
    }
    return data;
  }

  /** A downloaded block: counted, and written to disk in the background (BlockLanding.keep). */
  private stored(meta: ObjectMeta, index: number, block: BlockData, crc32c: number | null, prefetch: ReadPriority | null = null): void {
    if (!this.diskFor(meta)) return;
    this.toDisk.keep(blockId(meta, index), this.diskKey(meta, index), block, crc32c, prefetch);
  }

  /**
   * An object this mount just wrote goes into the disk cache from the bytes it was written from (`read`
   * fills a block's buffer, with O_DIRECT where its first `directCapacity` bytes are aligned; `crcs`,
   * each block's CRC32C as uploaded, where known, for the index instead of hashing the bytes again),
   * so reading one's own output back costs no download. Block by block, each within the memory budget
   * (skipped when memory is short: a cache, not a promise).
   */
  async adoptWritten(meta: ObjectMeta, read: (pos: number, into: Buffer, directCapacity: number) => Promise<void>, crcs: ReadonlyMap<number, number> = new Map()): Promise<number> {
    const disk = this.diskFor(meta);
    if (!disk) return 0;
    let adopted = 0;
    for (let i = 0; i * this.blockSize < meta.size; i++) {
      const length = Math.min(this.blockSize, meta.size - i * this.blockSize);
      // A pooled buffer (aligned, with room for the padding): the block file is written with O_DIRECT,
      // not through the page cache, which here cost 1.5-2 CPU-s per GiB written.
      const lease = this.deps.buffers.tryLease(length, 'prefetch');
      if (!lease) break;
      try {
        await read(i * this.blockSize, lease.bytes, lease.directCapacity);
        await disk.write(this.diskKey(meta, i), lease.bytes, lease.directCapacity, crcs.get(i) ?? null);
        adopted++;
      } finally {
        lease.release();
      }
    }
    return adopted;
  }

  private diskKey(meta: ObjectMeta, index: number): BlockKey {
    return { bucket: this.deps.client.bucket, object: meta.name, generation: meta.generation, block: index, blockSize: this.blockSize };
  }

  /**
   * A range's cache key: its offset in place of a block number and minus its length in place of the block
   * size, so it can never be taken for a block (whose sizes are positive) nor for another range.
   */
  private rangeKey(meta: ObjectMeta, offset: number, length: number): BlockKey {
    return { bucket: this.deps.client.bucket, object: meta.name, generation: meta.generation, block: offset, blockSize: -length };
  }

  /**
   * A range of the object, into `lease` (whose reference becomes the result's); a download of the whole object is
   * checked against the object's CRC32C, which is returned then (the block cache's index keeps it, so
   * the bytes are not hashed twice: at 1-2 GB/s a hash pass is a good part of a cold read's CPU). A
   * range's own CRC32C is returned when a download worker computed it where the bytes landed (the block
   * cache's index keeps that instead of hashing the block again on the main thread); null otherwise.
   */
  private async fetch(meta: ObjectMeta, start: number, end: number, priority: ReadPriority, lease: BlockData): Promise<{ block: BlockData; crc32c: number | null }> {
    const whole = start === 0 && end === meta.size && meta.crc32c !== null;
    try {
      for (let attempt = 1; ; attempt++) {
        // A download worker hashes the object where its body landed, off the main thread.
        const hash: RangeHash = { crc32c: null };
        const data = await this.deps.client.readRange(meta, start, end, lease.bytes, priority, hash);
        if (!whole) return { block: lease, crc32c: hash.crc32c };
        const expected = Buffer.from(meta.crc32c!, 'base64').readUInt32BE(0);
        if ((hash.crc32c ?? crc32c(data)) === expected) return { block: lease, crc32c: expected };
        this.deps.metrics.inc('object_crc_mismatches');
        this.deps.log.warn({ object: meta.name, generation: meta.generation, attempt }, 'downloaded object fails its CRC32C; fetching it again');
        if (attempt >= CORRUPT_ATTEMPTS) throw new GcsError('CORRUPT', `${meta.name}#${meta.generation}: CRC32C mismatch after ${attempt} downloads`);
      }
    } catch (err) {
      lease.release();
      throw err;
    }
  }
}

export function fileId(meta: ObjectMeta): string {
  return `${meta.name}\0${meta.generation}`;
}

/** A byte range's id beside blockId's (which has three parts, this four). */
function rangeId(meta: ObjectMeta, offset: number, length: number): string {
  return `${meta.name}\0${meta.generation}\0${offset}\0${length}`;
}

export function blockId(meta: ObjectMeta, index: number): string {
  return `${meta.name}\0${meta.generation}\0${index}`;
}
