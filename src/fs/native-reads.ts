import { usableCpus } from '../machine-share.js';
import type { BlockData } from '../blocks/block-buffers.js';
import type { BlockRow } from '../blocks/block-index.js';
import type { BlockSource } from '../blocks/block-source.js';
import type { DiskCache } from '../blocks/disk-cache.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { MemoryBudget } from '../memory/memory-budget.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import { FALLBACK, type FuseAddon, type FuseRequest, type NativeFile } from './kernel.js';

/**
 * Blocks registered with the native side at a time, from the block a read asks for: a sequential reader
 * comes back to JavaScript once per this many blocks (64 MiB at 4 MiB blocks), a random one once per
 * block it has not touched yet.
 */
const WINDOW_BLOCKS = 16;
/** Memory for blocks being answered from, and read ahead for sequential readers (a cap, not a reservation). */
export const NATIVE_MEMORY_BYTES = 128 * 1024 * 1024;
const MIN_SLOTS = 4;
/** Block memory unused this long goes back to the system. */
const IDLE_SECS = 30;
/**
 * Blocks kept lent to the addon after they land (past this many, those a read has used go first, then
 * the oldest: endOldLoans): a reader's later reads of a block just landed are answered from its memory too, not from the file read back and checked again (measured: a
 * third of a cold sequential GiB's blocks were read back when each loan ended at its landing). At most
 * an eighth of the memory budget, and given back whenever a read waits for memory.
 */
const LANDED_LOANS = 8;
const LANDED_LOANS_SHARE = 1 / 8;
/** A landed loan no newer one has pushed out is ended after this long (the reader has moved on or stopped). */
const LOAN_MS = 2000;

const DAMAGE: Record<number, { counter: 'block_cache_missing' | 'block_cache_short' | 'block_cache_corrupt'; why: string }> = {
  [FALLBACK.MISSING]: { counter: 'block_cache_missing', why: 'native read: block file unreadable' },
  [FALLBACK.SHORT]: { counter: 'block_cache_short', why: 'native read: block file shorter than its block' },
  [FALLBACK.CORRUPT]: { counter: 'block_cache_corrupt', why: 'native read: block file fails its CRC32C' },
};

/**
 * The JavaScript half of the native read path (native/block_reads.c): tells the addon which blocks of an
 * open file are on disk (key and CRC32C from the block index), so reads of them are answered by native
 * workers, which read the whole block file, check its CRC32C and reply from that memory. What it gives
 * back for a damaged block is dropped here, and the read goes the JavaScript way (GCS).
 */
export class NativeReads {
  /** Keys of blocks on their way to disk registered with the addon, each told once when it lands. */
  private readonly landing = new Set<string>();
  /** Blocks lent to the addon (their reads answered from this memory), by block file key. */
  private readonly lent = new Map<string, BlockData>();
  /** Of those, the ones landed, oldest first, with when: ended LANDED_LOANS later, or after LOAN_MS. */
  private readonly landedLoans = new Map<string, number>();
  /** Lent blocks that did not reach the disk: the addon hears so when their loan ends (endLoan). */
  private readonly notLanded = new Set<string>();
  private loanTimer: NodeJS.Timeout | null = null;
  private readonly maxLandedLoans: number;

  private constructor(
    private readonly fuse: FuseAddon,
    private readonly blocks: BlockSource,
    private readonly disk: DiskCache,
    private readonly metrics: Metrics,
    memory: MemoryBudget | undefined,
  ) {
    this.maxLandedLoans = memory ? Math.max(0, Math.min(LANDED_LOANS, Math.floor((memory.limit * LANDED_LOANS_SHARE) / blocks.blockSize))) : LANDED_LOANS;
    // A read waiting for memory comes first: the landed loans go (their reads then read the file).
    memory?.addReclaimer((_level, short) => {
      for (const key of [...this.landedLoans.keys()]) {
        if (!short()) return;
        this.endLoan(key);
      }
    });
  }

  /** Starts the native workers over the disk cache's block folder; null (said once) if they cannot run. */
  static start(deps: { fuse: FuseAddon; blocks: BlockSource; disk: DiskCache; metrics: Metrics; log: Logger; memory?: MemoryBudget }): NativeReads | null {
    const { fuse, blocks, disk, metrics, log, memory } = deps;
    const started = fuse.startNativeReads({
      dir: disk.blocksDir,
      blockSize: blocks.blockSize,
      slots: Math.max(MIN_SLOTS, Math.floor(NATIVE_MEMORY_BYTES / blocks.blockSize)),
      // Workers mostly wait (on the disk, or for a block another one is loading); the copies scale with cores.
      workers: Math.min(16, Math.max(4, usableCpus())),
      direct: disk.direct,
    });
    if (!started) {
      log.warn({}, 'the native read path could not start: reads of cached blocks go through JavaScript');
      return null;
    }
    const stat = (i: number) => () => fuse.nativeStats()[i]!;
    metrics.addCounterSource('native_reads', stat(0));
    metrics.addCounterSource('native_read_bytes', stat(1));
    metrics.addCounterSource('native_read_ms', () => Math.round(fuse.nativeStats()[8]! / 1e6));
    metrics.addCounterSource('fuse_read_bytes', stat(1));
    metrics.addCounterSource('native_fallbacks', stat(2));
    metrics.addCounterSource('native_reads_waited', stat(9));
    metrics.addCounterSource('native_blocks_lent', stat(10));
    metrics.addCounterSource('native_block_loads', stat(3));
    metrics.addCounterSource('block_cache_hits', stat(6));
    metrics.addCounterSource('block_cache_hit_bytes', stat(7));
    metrics.setGauge('native_block_buffers', stat(5));
    disk.addAccessSource(() => fuse.nativeMaintain(IDLE_SECS));
    // A prefetched chunk file is opened and read soon after it lands: read from disk only then, each
    // read waited for the disk (a cold Zarr round: 2.3 ms on average per native read, 1,500 reads).
    blocks.preloadAhead = (row) => {
      if (fuse.preloadBlock(row.key, row.crc32c, row.size)) metrics.inc('native_preloads');
    };
    const reads = new NativeReads(fuse, blocks, disk, metrics, memory);
    blocks.lendAhead = (key, block) => reads.lend(key, block);
    return reads;
  }

  /**
   * Registers the blocks from `first` on (`max` of them at most, up to the first that is neither, or that
   * JavaScript holds in memory) that are on disk or on their way there (a read of one waits in the addon
   * until it lands: a prefetched chunk file is often opened while it downloads, a sequential reader reads
   * what its handle fetched ahead); returns how many.
   */
  register(file: NativeFile, meta: ObjectMeta, first: number, max = WINDOW_BLOCKS, held?: (index: number) => BlockData | null): number {
    const bs = this.blocks.blockSize;
    // Blocks land in any order: a run on disk is registered in one call, each block on its way on its own.
    let keys: string[] = [];
    let crcs: number[] = [];
    // Of those on disk, the ones whose bytes the reader's handle still holds (its readahead), in order.
    let inMemory: [string, BlockData][] = [];
    const flush = (end: number): void => {
      if (keys.length > 0) this.fuse.addBlocks(file, end - keys.length, keys, crcs);
      keys = [];
      crcs = [];
      this.lendLanded(inMemory);
      inMemory = [];
    };
    let i = first;
    for (; i < first + max && i * bs < meta.size; i++) {
      // A block kept in memory after a read (a followed shard's: RecentBlocks) is answered from there by
      // JavaScript: the native side would read it back from disk and check it, into memory of its own
      // (a followed shard's page-cache misses in a shuffled loader's cold epoch: 270-340 such loads, 2.97-3.90
      // s against 2.52-3.15).
      if (this.blocks.inMemory(meta, i)) break;
      const row = this.blocks.diskRow(meta, i);
      if (row) {
        keys.push(row.key);
        crcs.push(row.crc32c);
        const data = held?.(i);
        if (data && data.bytes.length === row.size) inMemory.push([row.key, data]);
        continue;
      }
      flush(i);
      const coming = this.blocks.coming(meta, i);
      if (!coming || !this.fuse.expectBlock(file, i, coming.key)) break;
      // The block a read starts at (an open's first read, or this read's own) is waited on in the addon:
      // its download must not wait behind the mount's other downloads as the guess it may have been.
      if (i === first) this.blocks.promote(meta, i);
      this.tellLanding(coming.key, coming.landed);
      // Downloaded and being written (its lend at download came before any read expected it): lent now,
      // or its reads would wait for the file and read it back; the handle's bytes, or the write's (a
      // prefetched chunk file opened while its block file is written, whose landing a download worker
      // tells with its next reply).
      const data = held?.(i) ?? this.blocks.beingWritten(meta, i);
      if (data && data.bytes.length === Math.min(meta.size, (i + 1) * bs) - i * bs) this.lend(coming.key, data);
    }
    flush(i);
    return i - first;
  }

  /**
   * Lends a block on its way to disk to the addon, when reads there expect it (the addon says): they are
   * answered from this memory at once. The loan ends a while after the block's landing is told (every
   * block the addon expects has its landing told): reads after that read the file.
   */
  lend(key: string, block: BlockData): void {
    if (this.lent.has(key) || !this.fuse.lendBlock(key, block.bytes)) return;
    this.lent.set(key, block.retain());
  }

  /**
   * Lends blocks just registered as on disk whose downloaded bytes a handle still holds (the bytes their
   * rows' CRC32C was taken of), as landed loans: the reads that follow are answered from that memory,
   * not from the file read back and checked again (a cold sequential GiB read back a third of its
   * blocks so: those its readahead had landed before its reads reached them). Only as many as the landed
   * loans keep, the first ones, read soonest: a loan pushed out at once would be work for nothing.
   */
  private lendLanded(blocks: [string, BlockData][]): void {
    const room = Math.min(blocks.length, this.maxLandedLoans);
    // Newest last: the loans ended first when there are too many are the oldest, so the last of the run goes first.
    for (let j = room - 1; j >= 0; j--) {
      const [key, block] = blocks[j]!;
      if (this.lent.has(key) || !this.fuse.lendBlock(key, block.bytes, true)) continue;
      this.lent.set(key, block.retain());
      this.metrics.inc('native_landed_lent');
      this.landedLoan(key);
    }
  }

  /** Tells the addon once when block file `key` lands (or does not): every expectBlock needs it. */
  private tellLanding(key: string, landed: Promise<BlockRow | null>): void {
    if (this.landing.has(key)) return;
    this.landing.add(key);
    // A new landing of the block tells the addon itself.
    this.notLanded.delete(key);
    const tell = (row: BlockRow | null): void => {
      this.landing.delete(key);
      // Not on disk (no room, a failed write) but lent: its reads are answered from the loan until it
      // ends. Told at once, the addon dropped the block, gave back every read of it that came after,
      // and the handle, holding it no longer, fetched it again (a 16 MiB disk under 16 writes in flight:
      // 16-17 fetches for a 13-block file in about one run in twelve).
      if (!row && this.lent.has(key)) this.notLanded.add(key);
      else this.fuse.blockLanded(key, row?.crc32c ?? 0, row?.size ?? 0);
      if (this.lent.has(key)) this.landedLoan(key);
    };
    landed.then(tell, () => tell(null));
  }

  /** A lent block has landed: its loan ends later (LANDED_LOANS, LOAN_MS), and older ones now. */
  private landedLoan(key: string): void {
    this.landedLoans.set(key, Date.now());
    this.endOldLoans();
  }

  private endOldLoans(): void {
    const cutoff = Date.now() - LOAN_MS;
    for (const [k, at] of this.landedLoans) {
      if (at > cutoff) break;
      this.endLoan(k);
    }
    // Too many: those a read has been answered from go first, oldest first, then the oldest. Oldest first
    // alone ended a sequential reader's next blocks, landed but not read yet, and they were read back
    // from their files (up to 38 of a cold GiB's 256 blocks).
    if (this.landedLoans.size > this.maxLandedLoans) {
      for (const k of [...this.landedLoans.keys()]) {
        if (this.landedLoans.size <= this.maxLandedLoans) break;
        if (this.fuse.loanServed(k)) this.endLoan(k);
      }
    }
    for (const k of [...this.landedLoans.keys()]) {
      if (this.landedLoans.size <= this.maxLandedLoans) break;
      this.endLoan(k);
    }
    if (this.landedLoans.size > 0 && !this.loanTimer) {
      this.loanTimer = setTimeout(() => {
        this.loanTimer = null;
        this.endOldLoans();
      }, LOAN_MS);
      this.loanTimer.unref();
    }
  }

  private endLoan(key: string): void {
    this.landedLoans.delete(key);
    const block = this.lent.get(key);
    if (!block) return;
    this.lent.delete(key);
    // Waits for the replies being sent from it: afterwards nothing reads this memory.
    this.fuse.revokeBlock(key);
    block.release();
    if (this.notLanded.delete(key)) this.fuse.blockLanded(key, 0, 0);
  }

  /**
   * Hands the read to the native side when every block it spans is on disk (registering a window from
   * its first block). Returns the end of the registered run (the reader skips to it), or 0 when the read
   * is still the caller's.
   */
  handOff(req: FuseRequest, ino: number, file: NativeFile, meta: ObjectMeta, pos: number, size: number, max = WINDOW_BLOCKS, held?: (index: number) => BlockData | null): number {
    const end = Math.min(meta.size, pos + size);
    if (pos >= end) return 0;
    const bs = this.blocks.blockSize;
    const first = Math.floor(pos / bs);
    const n = this.register(file, meta, first, max, held);
    if (first + n <= Math.floor((end - 1) / bs)) return 0;
    return this.fuse.readNative(req, ino, file, pos, size) ? Math.min(meta.size, (first + n) * bs) : 0;
  }

  /**
   * The native side gave a read back for `reason` (a FALLBACK code), `key` the block file it found
   * damaged, if any: that one goes, and is fetched again. A file it could not read just now stays.
   */
  gaveBack(key: string | undefined, reason: number): void {
    if (reason === FALLBACK.UNAVAILABLE) this.metrics.inc('block_cache_unavailable');
    const d = DAMAGE[reason];
    if (d && key) void this.disk.dropDamaged(key, d.counter, d.why);
  }
}
