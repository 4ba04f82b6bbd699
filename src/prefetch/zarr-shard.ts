/**
 * Zarr v3's sharding_indexed codec, as far as the prefetcher needs it: where a shard's index lies and
 * how big it is (from the codec's configuration alone, so it can be fetched before anyone reads it),
 * what the index says (each inner chunk's byte range), and the two orders a reader walks inner chunks
 * in (C order over the whole array's inner grid, as dask does with inner-chunk tasks, and shard by
 * shard, as a reader of whole shards does). Pure: no I/O.
 */

/** Bytes of one index entry: offset and length, little-endian uint64 each. */
const ENTRY_BYTES = 16;
/** An entry of all ones: the inner chunk is empty (fill value), nothing is stored for it. */
const EMPTY = 0xffffffffffffffffn;

export interface Sharding {
  /** Inner chunks per shard, per dimension. */
  perShard: number[];
  /** Inner chunks of the whole array, per dimension (edge shards hold empty entries beyond it). */
  innerGrid: number[];
  /** Where the index is in each shard. */
  indexAt: 'start' | 'end';
  /** Bytes of the index: 16 per inner chunk, plus 4 when the index codecs end with crc32c. */
  indexBytes: number;
}

/** One inner chunk's place: which shard (its chunk indices) and its entry in that shard's index. */
export interface InnerChunk {
  shard: number[];
  entry: number;
}

/** A shard's parsed index: per entry (C order over the shard's inner chunks), its byte range, or null when empty. */
export type ShardIndex = ({ offset: number; nbytes: number } | null)[];

/**
 * The sharding of a v3 array from its `codecs` (the one sharding_indexed codec, which zarr requires to be
 * the only array-to-bytes codec), or null when it is not sharded or its index is not one we can size:
 * index codecs other than bytes (little-endian) and crc32c would make its length unknown until read.
 */
export function parseSharding(shape: number[], shardShape: number[], codecs: unknown): Sharding | null {
  if (!Array.isArray(codecs)) return null;
  const codec = codecs.find((c) => (c as { name?: unknown } | null)?.name === 'sharding_indexed') as { configuration?: Record<string, unknown> } | undefined;
  const cfg = codec?.configuration;
  if (!cfg) return null;
  const inner = cfg.chunk_shape;
  if (!Array.isArray(inner) || inner.length !== shape.length || !inner.every((n) => Number.isSafeInteger(n) && n > 0)) return null;
  const perShard = shardShape.map((s, i) => s / (inner[i] as number));
  if (!perShard.every((n) => Number.isSafeInteger(n) && n > 0)) return null;
  const location = cfg.index_location ?? 'end';
  if (location !== 'start' && location !== 'end') return null;
  const overhead = indexCodecOverhead(cfg.index_codecs);
  if (overhead === null) return null;
  const entries = perShard.reduce((a, b) => a * b, 1);
  return {
    perShard,
    innerGrid: shape.map((n, i) => Math.ceil(n / (inner[i] as number))),
    indexAt: location,
    indexBytes: entries * ENTRY_BYTES + overhead,
  };
}

/** Bytes the index codecs add to the raw index; null for a codec whose output length we cannot know. */
function indexCodecOverhead(codecs: unknown): number | null {
  // zarr's default index codecs: bytes (little-endian) then crc32c.
  if (codecs === undefined) return 4;
  if (!Array.isArray(codecs)) return null;
  let overhead = 0;
  for (const c of codecs as { name?: unknown; configuration?: { endian?: unknown } }[]) {
    if (c?.name === 'bytes' && (c.configuration?.endian ?? 'little') === 'little') continue;
    if (c?.name === 'crc32c') {
      overhead += 4;
      continue;
    }
    return null;
  }
  return overhead;
}

/** The byte range [start, end) of a shard of `size` bytes that holds its index. */
export function indexRange(s: Sharding, size: number): { start: number; end: number } | null {
  if (size < s.indexBytes) return null;
  return s.indexAt === 'end' ? { start: size - s.indexBytes, end: size } : { start: 0, end: s.indexBytes };
}

/** The index's entries from its bytes (the checksum, if any, is left to zarr: a bad one costs only a guess). */
export function parseShardIndex(s: Sharding, bytes: Buffer, shardSize: number): ShardIndex | null {
  const entries = (s.indexBytes - (s.indexBytes % ENTRY_BYTES)) / ENTRY_BYTES;
  if (bytes.length < entries * ENTRY_BYTES) return null;
  const out: ShardIndex = [];
  for (let i = 0; i < entries; i++) {
    const offset = bytes.readBigUInt64LE(i * ENTRY_BYTES);
    const nbytes = bytes.readBigUInt64LE(i * ENTRY_BYTES + 8);
    if (offset === EMPTY && nbytes === EMPTY) {
      out.push(null);
      continue;
    }
    if (offset + nbytes > BigInt(shardSize)) return null;
    out.push({ offset: Number(offset), nbytes: Number(nbytes) });
  }
  return out;
}

/** The entry of the index whose inner chunk holds byte `pos` of the shard, or -1 (the index, a gap). */
export function entryAt(index: ShardIndex, pos: number): number {
  for (let i = 0; i < index.length; i++) {
    const e = index[i];
    if (e && pos >= e.offset && pos < e.offset + e.nbytes) return i;
  }
  return -1;
}

/** A reader's walk over inner chunks: position <-> inner chunk. */
export interface InnerOrder {
  total: number;
  positionOf(c: InnerChunk): number;
  chunkAt(position: number): InnerChunk;
}

/** C order over the whole array's inner grid: the last dimension fastest, crossing shard boundaries. */
export function arrayOrder(s: Sharding): InnerOrder {
  return {
    total: product(s.innerGrid),
    positionOf: (c) => linear(s.innerGrid, globalOf(s, c)),
    chunkAt: (p) => {
      const g = unlinear(s.innerGrid, p);
      return { shard: g.map((x, i) => Math.floor(x / s.perShard[i]!)), entry: linear(s.perShard, g.map((x, i) => x % s.perShard[i]!)) };
    },
  };
}

/** Shard by shard in C order of the shard grid, and C order of inner chunks within each. */
export function shardOrder(s: Sharding, shardGrid: number[]): InnerOrder {
  const per = product(s.perShard);
  return {
    total: product(shardGrid) * per,
    positionOf: (c) => linear(shardGrid, c.shard) * per + c.entry,
    chunkAt: (p) => ({ shard: unlinear(shardGrid, Math.floor(p / per)), entry: p % per }),
  };
}

/** Whether the inner chunk lies within the array (an edge shard's entries past it are always empty). */
export function insideArray(s: Sharding, c: InnerChunk): boolean {
  return globalOf(s, c).every((g, i) => g < s.innerGrid[i]!);
}

function globalOf(s: Sharding, c: InnerChunk): number[] {
  const local = unlinear(s.perShard, c.entry);
  return local.map((l, i) => c.shard[i]! * s.perShard[i]! + l);
}

function product(v: number[]): number {
  return v.reduce((a, b) => a * b, 1);
}

function linear(grid: number[], idx: number[]): number {
  let n = 0;
  for (let i = 0; i < grid.length; i++) n = n * grid[i]! + Math.min(idx[i]!, grid[i]! - 1);
  return n;
}

function unlinear(grid: number[], p: number): number[] {
  const out = new Array<number>(grid.length);
  for (let i = grid.length - 1; i >= 0; i--) {
    out[i] = p % grid[i]!;
    p = Math.floor(p / grid[i]!);
  }
  return out;
}
