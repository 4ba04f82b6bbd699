import { blockId, fileId, type BlockSource } from '../blocks/block-source.js';
import type { Priority } from '../blocks/download-scheduler.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import { childPath } from '../namespace/paths.js';
import { remember } from './array-finder.js';
import type { PrefetchStore } from './prefetch-store.js';
import { ReadStream } from './read-stream.js';
import { keyOfIndices, type ZarrLayout } from './zarr-layout.js';
import { arrayOrder, entryAt, indexRange, insideArray, parseShardIndex, shardOrder, type InnerOrder, type ShardIndex, type Sharding } from './zarr-shard.js';


/** A stream reaching at most this many inner chunks ahead has just started: it may be a shuffled reader's chance. */
const YOUNG_STREAM = 4;
/**
 * Inner chunks (and indexes) up to this share of a block are fetched alone for a reader that jumps: a
 * shuffled reader of a few 128 KiB chunks in 4 MiB blocks fetched nearly every block. Larger ones go by
 * blocks: for 1.1 MB chunks (a quarter block) the ranges cost a shuffled loader's full epoch 3.5 times
 * the requests (367 against 106) and more time (2.5 against 2.1 s, `npm run bench -- zarr-v3`).
 */
const ALONE_SHARE = 1 / 8;
/** Reads of a shard kept while its index loads: enough for a stream to see where the reader goes. */
const EARLY_READS = 16;
/** Opens of a shard read through the page cache this far apart are a new pass over it (a later epoch). */
const PASS_GAP_MS = 30_000;
/** Opens of a shard a zarr reader makes per inner chunk it reads: one to read the index, one the chunk. */
const OPENS_PER_CHUNK = 2;
/** Bytes of a shard: an inner chunk's, or its index's. */
export interface ByteRange {
  offset: number;
  nbytes: number;
}

export interface ShardFollowerDeps {
  blocks: BlockSource;
  store: PrefetchStore;
  metrics: Metrics;
  log: Logger;
  /** The file at a path, from the folder's names (a lookup), or null: a missing shard is all fill value. */
  file(path: string): Promise<ObjectMeta | null>;
  /** Waits for one of the prefetch download slots; false once the prefetcher is closed. */
  turn(): Promise<boolean>;
  /** Starts fetching blocks of a file within the budgets; false when a budget says stop. */
  start(meta: ObjectMeta, blocks: number[]): boolean;
}

/** One way of walking the inner chunks, with the stream that says whether the reader walks it. */
interface Walk {
  order: InnerOrder;
  stream: ReadStream;
  /** How far, in the walk's direction, the indexes of the shards ahead were asked for (indexesAhead). */
  indexedTo: { position: number; direction: 1 | -1 } | null;
}

export interface ShardedArray {
  root: string;
  layout: ZarrLayout;
  sharding: Sharding;
  walks: Walk[];
}

/**
 * Follows readers through the inner chunks of sharded Zarr v3 arrays. zarr reads a shard's index, then
 * each inner chunk by range, opening the shard again for each: an open says nothing about where the
 * reader is, so progress is taken from the reads themselves (offset -> inner chunk, by the index; for a
 * shard read through the page cache, whose reads do not show it, from the count of its opens), and
 * inner chunks are fetched ahead (the blocks that hold them) in the order the reader walks, across
 * shards. Each shard's index is read once (sized from the codec, so before the reader asks) and kept.
 */
export class ShardFollower {
  /** Index per shard generation: loading or loaded (null: unreadable, not followed). */
  private readonly indexes = new Map<string, Promise<ShardIndex | null>>();
  /** The same, once here: reads look it up synchronously. */
  private readonly parsed = new Map<string, ShardIndex>();
  /** Reads of a followed shard that came before its index, in order (the last EARLY_READS). */
  private readonly early = new Map<string, number[]>();
  /** Shards opened, per generation: their array and chunk indices, for their reads. */
  private readonly opened = new Map<string, { array: ShardedArray; shard: number[] }>();
  /** Blocks asked for already: a later round of an overlapping stream does not ask again. */
  private readonly asked = new Map<string, true>();
  /** Opens of shards read through the page cache, per generation: how many in this pass, and when the last. */
  private readonly passes = new Map<string, { opens: number; at: number }>();
  /** Per shard generation read through the page cache, per walk: its inner chunks' positions, lowest first. */
  private readonly shardPositions = new Map<string, number[][]>();

  constructor(private readonly deps: ShardFollowerDeps) {}

  static array(root: string, layout: ZarrLayout, sharding: Sharding, maxAhead: number): ShardedArray {
    // Two walks: C order over the array's inner chunks (dask tasks of inner-chunk size cross shards) and
    // shard by shard (a reader of whole shards). Each has its own stream; whichever the reader follows
    // runs ahead, the other keeps seeing jumps and asks for nothing.
    const orders = [arrayOrder(sharding), shardOrder(sharding, layout.grid)];
    // A 1-d array walks both the same way: one stream is enough.
    const walks = (layout.grid.length <= 1 ? orders.slice(0, 1) : orders).map((order) => ({ order, stream: new ReadStream(maxAhead), indexedTo: null }));
    return { root, layout, sharding, walks };
  }

  /** A shard was opened: its reads are followed from now, and its index is loaded (the reader wants it first). */
  shardOpened(array: ShardedArray, shard: number[], meta: ObjectMeta): void {
    remember(this.opened, fileId(meta), { array, shard });
    // A reader that jumps about reads the index alone, as it does its inner chunks (rangeFor).
    void this.indexOf(array.sharding, meta, 'demand', array.walks.every((w) => w.stream.distanceAhead <= YOUNG_STREAM));
  }

  /** Whether this shard generation was opened and is followed. */
  follows(meta: ObjectMeta): boolean {
    return this.opened.has(fileId(meta));
  }

  /**
   * The byte range to fetch alone for a read of `size` bytes at `pos` of a followed shard, or null (read
   * it by blocks): the inner chunk (or the index) the read lies in, when that is at most ALONE_SHARE of a
   * block and no walk of its array is past its start (YOUNG_STREAM). A reader that jumps from inner chunk
   * to inner chunk (a shuffled loader) would otherwise fetch a whole block for each small chunk it reads:
   * a fifth of the 128 KiB chunks read means nearly every 4 MiB block fetched. A walking reader reads the
   * blocks whole anyway.
   */
  rangeFor(meta: ObjectMeta, pos: number, size: number): ByteRange | Promise<ByteRange | null> | null {
    const id = fileId(meta);
    const shard = this.opened.get(id);
    if (!shard) return null;
    const index = this.parsed.get(id);
    if (!index) {
      // The reader reads the index itself and goes on before ours arrives: its read waits for ours
      // (as it would for the block), or it would fetch a whole block for a small chunk.
      const loading = this.indexes.get(id);
      if (loading) this.promoteIndex(shard.array.sharding, meta);
      return loading ? loading.then((loaded) => (loaded && this.parsed.has(id) ? (this.rangeFor(meta, pos, size) as ByteRange | null) : null)) : null;
    }
    const indexAt = indexRange(shard.array.sharding, meta.size);
    let range: ByteRange | null;
    if (indexAt && pos >= indexAt.start && pos < indexAt.end) range = { offset: indexAt.start, nbytes: indexAt.end - indexAt.start };
    else range = index[entryAt(index, pos)] ?? null;
    if (!range || pos + size > range.offset + range.nbytes || range.nbytes > this.deps.blocks.blockSize * ALONE_SHARE) return null;
    // A stream past its start: the reader walks, and blocks (its next chunks with them) are on their way.
    if (shard.array.walks.some((w) => w.stream.distanceAhead > YOUNG_STREAM)) return null;
    return range;
  }

  /**
   * An open of a followed shard all on disk, read through the page cache: its reads do not show where its
   * reader is (hits in the kernel's cache never reach us, and its readahead reads neighbours in file
   * order), so its opens stand for them. zarr opens a shard twice per inner chunk it reads (its index,
   * then the chunk): the n-th pair of opens in a pass counts as a read of the shard's n-th inner chunk in
   * each walk's order, so a walking reader, or a crowd splitting a walk, moves the walk through the shard
   * at its pace and on into the shards after it, which may still be to fetch. A pass ends once its opens
   * have covered every inner chunk, or after PASS_GAP_MS without one. The index and chunk opens of one
   * read fall on one position, so a shuffled reader starts a stream only when two of its reads in a row
   * are of one shard; a reader of whole shards (one open each) moves no stream here, and its prefetch
   * starts again from its reads of the first shard not on disk.
   */
  openedThroughPageCache(meta: ObjectMeta): void {
    const id = fileId(meta);
    const shard = this.opened.get(id);
    if (!shard) return;
    let positions = this.shardPositions.get(id);
    if (!positions) {
      positions = shard.array.walks.map((w) => positionsOf(shard.array.sharding, w.order, shard.shard));
      remember(this.shardPositions, id, positions);
    }
    const chunks = positions[0]?.length ?? 0;
    if (chunks === 0) return;
    const now = performance.now();
    const pass = this.passes.get(id);
    let opens = pass && now - pass.at < PASS_GAP_MS ? pass.opens : 0;
    if (opens >= chunks * OPENS_PER_CHUNK) opens = 0;
    remember(this.passes, id, { opens: opens + 1, at: now });
    const nth = Math.floor(opens / OPENS_PER_CHUNK);
    shard.array.walks.forEach((walk, i) => {
      const position = positions[i]?.[nth];
      if (position === undefined || !walk.stream.observe(position)) return;
      this.walk(shard.array, walk).catch((err: unknown) => this.deps.log.debug({ err: String(err) }, 'shard prefetch failed'));
    });
  }

  /** A read at `pos` of an open file: if it is an inner chunk of a followed shard, the walk moves. */
  read(meta: ObjectMeta, pos: number): void {
    const id = fileId(meta);
    const shard = this.opened.get(id);
    if (!shard) return;
    const index = this.parsed.get(id);
    if (!index) {
      // The reader read the index itself and went on before ours arrived: these reads say where it is,
      // and are followed once the index is here (a reader of a few chunks would otherwise leave no trace).
      const early = this.early.get(id) ?? [];
      early.push(pos);
      if (early.length > EARLY_READS) early.shift();
      remember(this.early, id, early);
      return;
    }
    const entry = entryAt(index, pos);
    if (entry < 0) return;
    for (const walk of shard.array.walks) {
      if (!walk.stream.observe(walk.order.positionOf({ shard: shard.shard, entry }))) continue;
      this.walk(shard.array, walk).catch((err: unknown) => this.deps.log.debug({ err: String(err) }, 'shard prefetch failed'));
    }
  }

  /**
   * Fetches the inner chunks `walk`'s reader will reach and no walk has dealt with yet, in order, one walk
   * per stream at a time (as the prefetcher walks folders and arrays): reads meanwhile move the stream
   * and the walk goes on to where it reaches then. A round per read, as before, ran side by side with
   * the rounds of earlier reads, so a far shard could take the download slots before the near one.
   */
  private async walk(array: ShardedArray, walk: Walk): Promise<void> {
    const { stream, order } = walk;
    if (stream.walking) return;
    stream.walking = true;
    try {
      for (let plan = stream.unplanned(); plan; plan = stream.unplanned()) {
        const epoch = stream.epoch;
        let position = plan.from;
        for (let i = 0; i < plan.distance; i++) {
          position += plan.direction;
          if (position < 0 || position >= order.total) return;
          if (!(await this.deps.turn())) return;
          if (stream.epoch !== epoch) break;
          this.indexesAhead(array, walk, position, plan.direction, stream.distanceAhead);
          if (!(await this.fetchPosition(array, order, position, stream.distanceAhead))) return;
          // A jump while it started: the position belongs to the old stream.
          if (stream.epoch !== epoch) break;
          stream.dealtWith(position);
        }
      }
    } finally {
      stream.walking = false;
    }
  }

  /**
   * Asks for the indexes of the shards a walking reader reaches within `distance` positions past
   * `position` (the walk fetches blocks up to `distance` ahead of the reader, so indexes go about twice
   * as far). Without them the walk, on reaching a shard, waited a round trip for its index before asking
   * for any of its blocks (the emulator's request log of the zarr-v3 bench's sharded round: index, then
   * the shard's blocks, shard after shard). The index's block is the reader's own soon after (it holds inner chunks
   * too), so a reader that stops leaves at most the index blocks of the shards within twice the distance.
   * Not for a young stream: a shuffled reader's chance neighbours must not fetch whole blocks.
   */
  private indexesAhead(array: ShardedArray, walk: Walk, position: number, direction: 1 | -1, distance: number): void {
    if (distance <= YOUNG_STREAM) return;
    const until = position + direction * distance;
    const done = walk.indexedTo;
    // Where the last call stopped, if it was this way and ahead of here: each position is looked at once.
    let p = done && done.direction === direction && (done.position - position) * direction > 0 ? done.position : position;
    walk.indexedTo = { position: until, direction };
    let last = '';
    for (p += direction; (until - p) * direction >= 0 && p >= 0 && p < walk.order.total; p += direction) {
      const chunk = walk.order.chunkAt(p);
      if (!insideArray(array.sharding, chunk)) continue;
      const key = chunk.shard.join('/');
      if (key === last) continue;
      last = key;
      void this.deps
        .file(childPath(array.root, keyOfIndices(array.layout, chunk.shard)))
        .then((meta) => {
          if (meta && !this.deps.blocks.excluded(meta)) return this.indexOf(array.sharding, meta, 'prefetch');
          return null;
        })
        .catch(() => undefined);
    }
  }

  /**
   * Starts the blocks of the inner chunk at `position` that are neither fetched nor asked for; false when
   * a budget says stop. `distance`: how far ahead the stream reaches. A young stream (YOUNG_STREAM) over
   * small inner chunks fetches each chunk alone, as a jumping reader's reads are (rangeFor): a shuffled
   * reader's two reads that happen to be neighbours start one, and its blocks would be waste; a walking
   * reader's stream soon reaches further and fetches blocks.
   */
  private async fetchPosition(array: ShardedArray, order: InnerOrder, position: number, distance: number): Promise<boolean> {
    const { metrics } = this.deps;
    const chunk = order.chunkAt(position);
    if (!insideArray(array.sharding, chunk)) return true;
    const meta = await this.deps.file(childPath(array.root, keyOfIndices(array.layout, chunk.shard)));
    // Not kept by the disk cache (--file-cache-exclude-regex): nothing of it is fetched ahead, its index neither.
    if (meta && this.deps.blocks.excluded(meta)) return true;
    const index = meta ? await this.indexOf(array.sharding, meta, 'prefetch', distance <= YOUNG_STREAM) : null;
    const range = index?.[chunk.entry];
    if (!meta || !range) {
      // A missing shard, or an empty inner chunk in one: fill value, nothing to fetch.
      if (!meta || index) metrics.inc('prefetch_fill_skipped');
      return true;
    }
    const bs = this.deps.blocks.blockSize;
    const alone = range.nbytes <= bs * ALONE_SHARE && distance <= YOUNG_STREAM ? this.deps.blocks.getRange(meta, range.offset, range.nbytes, 'prefetch') : null;
    if (alone) {
      // Skipped for memory, or failed: a guess; the reader's own read fetches it.
      alone.then(
        (data) => data.release(),
        () => undefined,
      );
      return true;
    }
    const wanted: number[] = [];
    for (let b = Math.floor(range.offset / bs); b <= Math.floor((range.offset + range.nbytes - 1) / bs); b++) {
      const id = blockId(meta, b);
      if (this.asked.has(id) || this.deps.blocks.cached(meta, b)) continue;
      wanted.push(b);
    }
    if (wanted.length === 0) return true;
    if (!this.deps.start(meta, wanted)) return false;
    for (const b of wanted) remember(this.asked, blockId(meta, b), true);
    return true;
  }

  /**
   * The shard's index, read once per generation through the block source (so the reader's own read of
   * it finds it there) and kept. Its place and size come from the codec: no read of the shard first.
   */
  private indexOf(sharding: Sharding, meta: ObjectMeta, priority: Priority, alone = false): Promise<ShardIndex | null> {
    const id = fileId(meta);
    const known = this.indexes.get(id);
    if (known) {
      // Asked for ahead of the reader, and now the reader is here: its load is no longer a guess.
      if (priority === 'demand' && !this.parsed.has(id)) this.promoteIndex(sharding, meta);
      return known;
    }
    // Whatever went wrong, no index: the shard is read by blocks and asked again by the next round.
    const loading = this.loadIndex(sharding, meta, priority, alone).catch(() => null).then((index) => {
      if (index) remember(this.parsed, id, index);
      else this.indexes.delete(id);
      const early = this.early.get(id);
      this.early.delete(id);
      if (index && early) for (const pos of early) this.read(meta, pos);
      return index;
    });
    remember(this.indexes, id, loading);
    return loading;
  }

  /** The blocks of a shard's index whose load a reader now waits on (see BlockSource.promote). */
  private promoteIndex(sharding: Sharding, meta: ObjectMeta): void {
    const range = indexRange(sharding, meta.size);
    if (!range) return;
    const bs = this.deps.blocks.blockSize;
    for (let b = Math.floor(range.start / bs); b <= Math.floor((range.end - 1) / bs); b++) this.deps.blocks.promote(meta, b);
    // Or the index's bytes alone (loadIndex's `alone`), whose load is not a block's.
    this.deps.blocks.promoteRange(meta, range.start, range.end - range.start);
  }

  /** `alone`: the index's bytes by themselves when they are at most ALONE_SHARE of a block (BlockSource.getRange), not its blocks. */
  private async loadIndex(sharding: Sharding, meta: ObjectMeta, priority: Priority, alone: boolean): Promise<ShardIndex | null> {
    const range = indexRange(sharding, meta.size);
    if (!range) return null;
    const { blocks, store } = this.deps;
    const bs = blocks.blockSize;
    const ranged = alone && range.end - range.start <= bs * ALONE_SHARE ? blocks.getRange(meta, range.start, range.end - range.start) : null;
    if (ranged) {
      let data;
      try {
        data = await ranged;
      } catch {
        return null;
      }
      try {
        return parseShardIndex(sharding, Buffer.from(data.bytes), meta.size);
      } finally {
        data.release();
      }
    }
    const parts: Buffer[] = [];
    try {
      for (let b = Math.floor(range.start / bs); b <= Math.floor((range.end - 1) / bs); b++) {
        const data = await blocks.get(meta, b, priority);
        try {
          const from = Math.max(range.start, b * bs) - b * bs;
          const to = Math.min(range.end, b * bs + data.bytes.length) - b * bs;
          parts.push(Buffer.from(data.bytes.subarray(from, to)));
          // Without a disk cache the block waits in memory for the reader's own read of the index.
          if (priority === 'prefetch' && store.holdsInMemory) {
            store.started(meta);
            store.arrived(meta, b, data.retain());
          }
        } finally {
          data.release();
        }
      }
    } catch {
      // Skipped for memory, or the download failed: asked again by the next round that needs it.
      return null;
    }
    return parseShardIndex(sharding, Buffer.concat(parts), meta.size);
  }
}

/** The positions of a shard's inner chunks (those inside the array) in a walk's order, lowest first. */
function positionsOf(sharding: Sharding, order: InnerOrder, shard: number[]): number[] {
  const entries = sharding.perShard.reduce((a, b) => a * b, 1);
  const out: number[] = [];
  for (let entry = 0; entry < entries; entry++) {
    const chunk = { shard, entry };
    if (insideArray(sharding, chunk)) out.push(order.positionOf(chunk));
  }
  return out.sort((a, b) => a - b);
}
