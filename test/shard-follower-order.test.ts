import { describe, expect, it } from 'vitest';
import type { BlockSource } from '../src/blocks/block-source.js';
import type { ObjectMeta } from '../src/gcs/object-client.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';
import type { PrefetchStore } from '../src/prefetch/prefetch-store.js';
import { ShardFollower } from '../src/prefetch/shard-follower.js';
import { parseArrayMetadata } from '../src/prefetch/zarr-layout.js';

/**
 * A 1-d Zarr v3 array `arr` of `count` shards of `perShard` inner chunks of `inner` bytes, its index at
 * the end (offset, length per entry): its layout, one shard's bytes (all alike) and the shards' metadata.
 */
function shardedArray(count: number, perShard: number, inner: number) {
  const doc = JSON.stringify({
    zarr_format: 3,
    node_type: 'array',
    shape: [count * perShard],
    chunk_grid: { name: 'regular', configuration: { chunk_shape: [perShard] } },
    codecs: [{ name: 'sharding_indexed', configuration: { chunk_shape: [1], index_codecs: [{ name: 'bytes', configuration: { endian: 'little' } }] } }],
  });
  const layout = parseArrayMetadata('zarr.json', doc)!;
  expect(layout.sharding).toBeDefined();
  const index = Buffer.alloc(perShard * 16);
  for (let e = 0; e < perShard; e++) {
    index.writeBigUInt64LE(BigInt(e * inner), e * 16);
    index.writeBigUInt64LE(BigInt(inner), e * 16 + 8);
  }
  const shardBytes = Buffer.concat([Buffer.alloc(perShard * inner), index]);
  const shards = Array.from({ length: count }, (_, s): ObjectMeta => ({ name: `arr/c/${s}`, size: shardBytes.length, generation: '1', metageneration: '1', updatedMs: 0, crc32c: null }));
  return { layout, shardBytes, shards };
}

/** A follower of the array `shards` over `blocks`, no disk and no download-slot limit, `start` told of each file it starts. */
function followerOver(blocks: BlockSource, shards: ObjectMeta[], start: (meta: ObjectMeta) => boolean): ShardFollower {
  return new ShardFollower({
    blocks,
    store: { holdsInMemory: false } as unknown as PrefetchStore,
    metrics: new Metrics(),
    log: silentLogger,
    file: async (path: string) => shards[Number(path.slice('/arr/c/'.length))] ?? null,
    turn: async () => true,
    start,
  });
}

/**
 * A crowd of 16 readers walks a 1-d sharded array in C order (reader k reads inner chunks k, k + 16, ...)
 * and the shard follower fetches ahead of it. The blocks must be asked for in the order the crowd will
 * reach them: rounds started per read and run side by side let a far shard's blocks take the download
 * slots before the near one's, and the crowd then waited on the near one.
 */
describe('ShardFollower: a crowd of readers through a sharded array', () => {
  it('asks for the blocks ahead shard after shard in the order the readers reach them, each once, as far as the whole array', async () => {
    const SHARDS = 8;
    const PER_SHARD = 48;
    const INNER = 1000;
    const BLOCK = 4096;
    const { layout, shardBytes, shards } = shardedArray(SHARDS, PER_SHARD, INNER);
    const shardOf = (meta: ObjectMeta) => Number(meta.name.slice('arr/c/'.length));

    const asked: { shard: number; block: number }[] = [];
    let inFlight = 0;
    const waiting: (() => void)[] = [];
    const blocks = {
      blockSize: BLOCK,
      get: async (_meta: ObjectMeta, b: number) => {
        // The index's block comes after a turn of the event loop, as a download would.
        await new Promise((r) => setImmediate(r));
        const bytes = shardBytes.subarray(b * BLOCK, Math.min(shardBytes.length, (b + 1) * BLOCK));
        return { bytes, release: () => undefined, retain() { return this; } };
      },
      cached: () => false,
      excluded: () => false,
      // No disk cache: no inner chunk is fetched alone.
      getRange: () => null,
    } as unknown as BlockSource;
    const metrics = new Metrics();
    const follower = new ShardFollower({
      blocks,
      store: { holdsInMemory: false } as unknown as PrefetchStore,
      metrics,
      log: silentLogger,
      file: async (path: string) => {
        await new Promise((r) => setImmediate(r));
        const s = Number(path.slice('/arr/c/'.length));
        return shards[s] ?? null;
      },
      // Four download slots: each start holds one for a few turns of the event loop.
      turn: async () => {
        while (inFlight >= 4) await new Promise<void>((r) => waiting.push(r));
        return true;
      },
      start: (meta, wanted) => {
        for (const b of wanted) asked.push({ shard: shardOf(meta), block: b });
        inFlight++;
        setTimeout(() => {
          inFlight--;
          waiting.shift()?.();
        }, 1);
        return true;
      },
    });
    const array = ShardFollower.array('/arr', layout, layout.sharding!, 32);

    let seed = 3;
    const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const opened = new Set<number>();
    const total = SHARDS * PER_SHARD;
    for (let wave = 0; wave * 16 < total / 2; wave++) {
      const positions = Array.from({ length: 16 }, (_, k) => wave * 16 + k);
      for (let i = positions.length - 1; i > 0; i--) {
        const k = Math.floor(rand() * (i + 1));
        [positions[i], positions[k]] = [positions[k]!, positions[i]!];
      }
      for (const p of positions) {
        const s = Math.floor(p / PER_SHARD);
        if (!opened.has(s)) {
          opened.add(s);
          follower.shardOpened(array, [s], shards[s]!);
        }
        follower.read(shards[s]!, (p % PER_SHARD) * INNER);
        await new Promise((r) => setImmediate(r));
      }
    }
    // Let the walk run out.
    for (let i = 0; i < 200; i++) await new Promise((r) => setTimeout(r, 1));

    const order = asked.map((a) => a.shard * 1000 + a.block);
    // Each block once, and shard after shard in the order the readers reach them (within a shard a
    // stream that starts again from the crowd's front may ask for a block behind it later).
    expect(new Set(order).size).toBe(order.length);
    const byShard = asked.map((a) => a.shard);
    expect(byShard).toEqual([...byShard].sort((a, b) => a - b));
    // Read half the array; the walk reached its end (16 readers x 32 inner chunks each is past it).
    expect(Math.max(...asked.map((a) => a.shard))).toBe(SHARDS - 1);
  });
});

describe('ShardFollower: a shard the walk reached first, then its reader', () => {
  it("promotes the shard index's load the walk queued as a guess once the reader opens that shard", async () => {
    const PER_SHARD = 8;
    const INNER = 1000;
    const BLOCK = 4096;
    const { layout, shardBytes, shards } = shardedArray(4, PER_SHARD, INNER);
    const indexBlock = Math.floor((PER_SHARD * INNER) / BLOCK);
    const guesses: string[] = [];
    const promoted: string[] = [];
    const blocks = {
      blockSize: BLOCK,
      get: (meta: ObjectMeta, b: number, priority: string) => {
        const bytes = shardBytes.subarray(b * BLOCK, Math.min(shardBytes.length, (b + 1) * BLOCK));
        const data = { bytes, release: () => undefined, retain() { return this; } };
        // Shard 0's blocks come; a guess for another shard stays queued behind the mount's other downloads.
        if (meta.name === 'arr/c/0' || priority !== 'prefetch') return Promise.resolve(data);
        guesses.push(`${meta.name}#${b}`);
        return new Promise(() => undefined);
      },
      promote: (meta: ObjectMeta, b: number) => promoted.push(`${meta.name}#${b}`),
      promoteRange: (meta: ObjectMeta, offset: number, length: number) => promoted.push(`${meta.name}@${offset}+${length}`),
      cached: () => false,
      excluded: () => false,
      getRange: () => null,
    } as unknown as BlockSource;
    const follower = followerOver(blocks, shards, () => true);
    const array = ShardFollower.array('/arr', layout, layout.sharding!, 16);
    follower.shardOpened(array, [0], shards[0]!);
    for (let p = 0; p < PER_SHARD; p++) {
      follower.read(shards[0]!, p * INNER);
      for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
    }
    expect(guesses).toContain(`arr/c/1#${indexBlock}`);
    expect(promoted).toEqual([]);
    follower.shardOpened(array, [1], shards[1]!);
    // Its blocks, and the index's bytes by themselves (loaded so by a young stream): whichever is queued goes ahead.
    expect(promoted).toEqual([`arr/c/1#${indexBlock}`, `arr/c/1@${PER_SHARD * INNER}+${shards[1]!.size - PER_SHARD * INNER}`]);
  });

  it('asks nothing ahead of shards the disk cache does not keep (--file-cache-exclude-regex), their indexes neither', async () => {
    const { layout, shardBytes, shards } = shardedArray(4, 8, 1000);
    const asked: string[] = [];
    const blocks = {
      blockSize: 4096,
      get: (meta: ObjectMeta, b: number, priority: string) => {
        if (priority === 'prefetch') asked.push(`${meta.name}#${b}`);
        const bytes = shardBytes.subarray(b * 4096, Math.min(shardBytes.length, (b + 1) * 4096));
        return Promise.resolve({ bytes, release: () => undefined, retain() { return this; } });
      },
      excluded: (meta: ObjectMeta) => meta.name !== 'arr/c/0',
      promote: () => undefined,
      promoteRange: () => undefined,
      cached: () => false,
      getRange: () => null,
    } as unknown as BlockSource;
    const started: string[] = [];
    const follower = followerOver(blocks, shards, (meta) => {
      started.push(meta.name);
      return true;
    });
    const array = ShardFollower.array('/arr', layout, layout.sharding!, 16);
    follower.shardOpened(array, [0], shards[0]!);
    for (let p = 0; p < 8; p++) {
      follower.read(shards[0]!, p * 1000);
      for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
    }
    expect(asked.filter((a) => !a.startsWith('arr/c/0#'))).toEqual([]);
    expect(started.filter((n) => n !== 'arr/c/0')).toEqual([]);
  });
});

/**
 * A block source over `shardBytes` (every shard alike) that answers at once, no disk, and notes the
 * shards whose index block (`perShard` inner chunks of `inner` bytes come before the index) is asked for.
 */
function indexWatchingBlocks(shardBytes: Buffer, perShard: number, inner: number, blockSize: number): { blocks: BlockSource; indexAsked: string[] } {
  const indexBlock = Math.floor((perShard * inner) / blockSize);
  const indexAsked: string[] = [];
  const blocks = {
    blockSize,
    get: (meta: ObjectMeta, b: number) => {
      if (b === indexBlock) indexAsked.push(meta.name);
      const bytes = shardBytes.subarray(b * blockSize, Math.min(shardBytes.length, (b + 1) * blockSize));
      return Promise.resolve({ bytes, release: () => undefined, retain() { return this; } });
    },
    promote: () => undefined,
    promoteRange: () => undefined,
    cached: () => false,
    excluded: () => false,
    getRange: () => null,
  } as unknown as BlockSource;
  return { blocks, indexAsked };
}

describe('ShardFollower: the indexes of the shards ahead', () => {
  it("asks for the next shard's index while the walk's blocks are still in this shard, so the walk never waits on it there", async () => {
    const PER_SHARD = 48;
    const INNER = 1000;
    const BLOCK = 4096;
    const { layout, shardBytes, shards } = shardedArray(4, PER_SHARD, INNER);
    const { blocks, indexAsked } = indexWatchingBlocks(shardBytes, PER_SHARD, INNER, BLOCK);
    const started: { shard: string; block: number }[] = [];
    const follower = followerOver(blocks, shards, (meta: ObjectMeta, wanted?: number[]) => {
      for (const block of wanted ?? []) started.push({ shard: meta.name, block });
      return true;
    });
    const array = ShardFollower.array('/arr', layout, layout.sharding!, 16);
    follower.shardOpened(array, [0], shards[0]!);
    // One reader through inner chunks 0-20: the stream reaches 16 ahead, so the walk's blocks go up to
    // inner chunk 36 of shard 0's 48; shard 1's index is asked for all the same.
    for (let p = 0; p <= 20; p++) {
      follower.read(shards[0]!, p * INNER);
      for (let i = 0; i < 10; i++) await new Promise((r) => setImmediate(r));
    }
    expect(started.length).toBeGreaterThan(0);
    expect(started.every((s) => s.shard === 'arr/c/0')).toBe(true);
    expect(indexAsked).toContain('arr/c/1');
    // Not further than the walk's reach again: shard 2 starts at inner chunk 96.
    expect(indexAsked).not.toContain('arr/c/2');
  });

  it('asks for no index ahead for a young stream (a shuffled reader\'s chance neighbours)', async () => {
    const PER_SHARD = 48;
    const { layout, shardBytes, shards } = shardedArray(4, PER_SHARD, 1000);
    const { blocks, indexAsked } = indexWatchingBlocks(shardBytes, PER_SHARD, 1000, 4096);
    const follower = followerOver(blocks, shards, () => true);
    const array = ShardFollower.array('/arr', layout, layout.sharding!, 16);
    follower.shardOpened(array, [0], shards[0]!);
    // Two neighbours near shard 0's end (a stream of distance 2: blocks up to 47, twice that reaches shard 1), then a jump.
    for (const p of [44, 45, 3]) {
      follower.read(shards[0]!, p * 1000);
      for (let i = 0; i < 10; i++) await new Promise((r) => setImmediate(r));
    }
    expect(indexAsked.filter((n) => n !== 'arr/c/0')).toEqual([]);
  });
});
