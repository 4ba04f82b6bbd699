import { constants as fsConstants, promises as fsp } from 'node:fs';
import { unlink } from 'node:fs/promises';
import { DIRECT_ALIGN } from '../blocks/block-files.js';
import type { BlockSource } from '../blocks/block-source.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import { MemoryChunk } from './memory-chunk.js';
import type { UploadBuffers } from './upload-buffers.js';

/** Bytes of the file lent from memory (until released). */
export interface HeldBytes {
  readonly bytes: Buffer;
  release(): void;
}

/** What an upload reads a file's bytes from. */
export interface UploadSource {
  /** `into.length` bytes at `pos` (zeros past the end, as a sparse file reads). */
  read(pos: number, into: Buffer): Promise<void>;
  /** Bytes [from, to) where they are still in memory, without a copy; null otherwise. */
  borrow(from: number, to: number): HeldBytes | null;
}

/** A streamed file keeps its bytes in memory only from this size on: small files stay on the plain path. */
const MEMORY_FROM_BYTES = 1024 * 1024;

export interface StagedMemory {
  buffers: UploadBuffers;
  /**
   * Called when bytes have waited in memory for `idleMs` without an append; expected to spill() them in
   * turn with the file's changes: a writer that pauses (a log, a job between epochs) must not keep chunks
   * of the memory budget from readers.
   */
  whenIdle: () => void;
  idleMs?: number;
}

const MEMORY_IDLE_MS = 5000;

/**
 * A file's whole bytes in the temp dir, while it is open for writing: what reads of it answer from, what
 * uploads send (again, after a lost session), and what goes into the block cache once uploaded.
 *
 * A streamed file (a new file written in order) keeps its newest bytes in memory, a chunk of the upload's
 * size at a time: the upload sends a chunk from there, and a full chunk goes to the staged file with
 * O_DIRECT. Written through the page cache instead, the staged copy's write and read back were the bulk
 * of a streamed GiB's CPU (perf: 37% + 11% of the daemon's cycles). Memory is authoritative for the
 * ranges it holds: any write that is not an append, and any truncate, first spills it to the file.
 */
export class StagedCopy implements UploadSource {
  /** The chunk appends go into. */
  private tail: MemoryChunk | null = null;
  /** Full chunks, written (or being written) to the file, kept until the upload has sent them. */
  private readonly full: MemoryChunk[] = [];
  /** The same file opened with O_DIRECT, once first wanted: null when the file system refuses the flag. */
  private direct: Promise<fsp.FileHandle | null> | null = null;
  /**
   * Bytes held only in memory could not be written to the file: from then on the staged copy lacks them,
   * so every change, read and upload fails (EIO) rather than send a file with a hole in it.
   */
  private diskFailure: Error | null = null;
  private lastAppend = 0;
  private idleTimer: NodeJS.Timeout | null = null;
  /**
   * Chunks went to the file with O_DIRECT: its bytes are then mostly not in the page cache, and the block
   * cache reads them with O_DIRECT too. Otherwise they are (a small file, say), and an O_DIRECT read
   * would first force them to disk: a disk write per small file that deleting the copy would have saved.
   */
  private wroteDirect = false;
  /** The upload has sent the bytes below this: written chunks below it may go. */
  private uploadedTo = 0;
  /**
   * Set by a write that is not an append (or a truncate) while bytes were in memory: the file's bytes
   * go through the page cache from then on, as gcsfuse falls back to staging. Each such write would
   * otherwise put a chunk on disk and the next append read it back.
   */
  private memoryOff = false;

  private constructor(
    readonly path: string,
    readonly handle: fsp.FileHandle,
    private readonly memory: StagedMemory | null,
  ) {}

  static async create(staging: { create(): Promise<{ path: string; handle: fsp.FileHandle }> }, memory: StagedMemory | null = null): Promise<StagedCopy> {
    const { path, handle } = await staging.create();
    return new StagedCopy(path, handle, memory);
  }

  /** Bytes of the file held in memory now. */
  get memoryBytes(): number {
    return this.full.reduce((n, c) => n + c.length, 0) + (this.tail?.length ?? 0);
  }

  /** The object's bytes, block by block through the block cache (which keeps them too). */
  async fill(source: ObjectMeta, blocks: BlockSource): Promise<void> {
    const bs = blocks.blockSize;
    for (let i = 0; i * bs < source.size; i++) {
      const block = await blocks.get(source, i);
      try {
        await this.write(i * bs, block.bytes);
      } finally {
        block.release();
      }
    }
  }

  /**
   * `data` at `pos`; `append` says the write extends a streamed file at its end, whose bytes may then
   * stay in memory until a chunk is full.
   */
  async write(pos: number, data: Buffer, append = false): Promise<void> {
    this.checkDisk();
    if (!append && this.holdsMemory()) {
      this.memoryOff = true;
      await this.spill();
    } else if (this.tail && pos !== this.tail.end) {
      await this.spill();
    }
    let done = 0;
    try {
      while (append && done < data.length) {
        const tail = this.tail ?? (await this.startTail(pos + done));
        if (!tail) break;
        const n = Math.min(data.length - done, tail.bytes.length - tail.length);
        data.copy(tail.bytes, tail.length, done, done + n);
        tail.length += n;
        done += n;
        if (tail.full) this.seal();
      }
    } catch (err) {
      // Part of this write may sit in memory past the size the caller keeps: nothing after is trusted.
      this.broken(err);
      this.checkDisk();
    }
    if (done > 0) this.watchIdle();
    if (done < data.length) await writeAll(this.handle, data.subarray(done), pos + done);
  }

  /** `into.length` bytes at `pos` (zeros past the end, as a sparse file reads). */
  async read(pos: number, into: Buffer): Promise<void> {
    this.checkDisk();
    const end = pos + into.length;
    // Held before the file is read: a chunk whose write lands meanwhile cannot go while its bytes are wanted.
    const held = this.chunks()
      .filter((c) => c.start < end && c.end > pos)
      .map((c) => ({ chunk: c.retain(), end: c.end }));
    try {
      await readFully(this.handle, into, pos);
      for (const { chunk, end: chunkEnd } of held) {
        const from = Math.max(pos, chunk.start);
        const to = Math.min(end, chunkEnd);
        chunk.bytes.copy(into, from - pos, from - chunk.start, to - chunk.start);
      }
    } finally {
      for (const { chunk } of held) chunk.release();
    }
  }

  borrow(from: number, to: number): HeldBytes | null {
    const chunk = this.chunks().find((c) => c.start <= from && to <= c.end);
    if (!chunk) return null;
    chunk.retain();
    let given = false;
    return {
      bytes: chunk.bytes.subarray(from - chunk.start, to - chunk.start),
      release: () => {
        if (given) return;
        given = true;
        chunk.release();
      },
    };
  }

  /** The upload has sent bytes up to `upTo`: chunks below it go once the file holds their bytes. */
  sent(upTo: number): void {
    this.uploadedTo = Math.max(this.uploadedTo, upTo);
    this.prune();
  }

  /**
   * For the block cache: `into.length` bytes at `pos`, with O_DIRECT where the memory allows
   * (`directCapacity` aligned bytes at `into`'s start): the streamed bytes are not in the page cache, and
   * a buffered read would fetch them into it only to copy them out.
   */
  async readForCache(pos: number, into: Buffer, directCapacity: number): Promise<void> {
    this.checkDisk();
    const padded = Math.ceil(into.length / DIRECT_ALIGN) * DIRECT_ALIGN;
    const direct = !this.wroteDirect || this.holdsMemory() || pos % DIRECT_ALIGN !== 0 || directCapacity < padded ? null : await this.directHandle();
    if (direct) {
      try {
        const view = Buffer.from(into.buffer, into.byteOffset, padded);
        let done = 0;
        while (done < into.length) {
          const { bytesRead } = await direct.read(view, done, padded - done, pos + done);
          if (bytesRead === 0) break;
          done += bytesRead;
        }
        if (done < into.length) into.fill(0, done);
        return;
      } catch {
        // EINVAL from an unaligned short read, say: the plain read below is always right.
      }
    }
    await this.read(pos, into);
  }

  /**
   * Every byte held in memory written to the file, and the memory given back. The chunks stay visible to
   * reads and the upload until the file holds their bytes.
   */
  async spill(): Promise<void> {
    if (this.tail && this.tail.length > 0) this.seal();
    this.tail?.release();
    this.tail = null;
    await this.dropFull();
    this.checkDisk();
  }

  async truncate(size: number): Promise<void> {
    if (this.holdsMemory()) {
      this.memoryOff = true;
      await this.spill();
    }
    await this.handle.truncate(size);
  }

  /** Closes and deletes the file (what memory holds is not written: the file goes). */
  async remove(): Promise<void> {
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = null;
    this.tail?.release();
    this.tail = null;
    // Their writes use the descriptors closed below.
    await this.dropFull();
    await this.handle.close().catch(() => undefined);
    await (await this.direct)?.close().catch(() => undefined);
    await unlink(this.path).catch(() => undefined);
  }

  // ---------------------------------------------------------------- inside

  private watchIdle(): void {
    this.lastAppend = Date.now();
    const idleMs = this.memory!.idleMs ?? MEMORY_IDLE_MS;
    this.idleTimer ??= setTimeout(() => this.idleCheck(idleMs), idleMs).unref();
  }

  private idleCheck(idleMs: number): void {
    this.idleTimer = null;
    if (this.memoryBytes === 0) return;
    const idle = Date.now() - this.lastAppend;
    if (idle >= idleMs) this.memory!.whenIdle();
    else this.idleTimer = setTimeout(() => this.idleCheck(idleMs), idleMs - idle).unref();
  }

  private holdsMemory(): boolean {
    return this.tail !== null || this.full.length > 0;
  }

  /** A chunk out of the list, its reference given back (once, whoever gets there first). */
  private drop(chunk: MemoryChunk): void {
    const at = this.full.indexOf(chunk);
    if (at < 0) return;
    this.full.splice(at, 1);
    chunk.release();
  }

  /** Once every sealed chunk's write has settled, each goes. */
  private async dropFull(): Promise<void> {
    const pending = [...this.full];
    await Promise.all(pending.map((c) => c.onDisk));
    for (const c of pending) this.drop(c);
  }

  /** Chunks the file holds and the upload has sent are needed no more. */
  private prune(): void {
    for (const c of [...this.full]) if (c.written && c.end <= this.uploadedTo) this.drop(c);
  }

  private chunks(): MemoryChunk[] {
    return this.tail ? [...this.full, this.tail] : this.full;
  }

  private checkDisk(): void {
    if (this.diskFailure) throw this.diskFailure;
  }

  private broken(err: unknown): void {
    this.diskFailure ??= new Error(`the staged copy ${this.path} lost bytes held in memory: ${err instanceof Error ? err.message : String(err)}`);
  }

  /** Memory for the chunk holding `pos`, its earlier bytes read from the file; null to write through the page cache. */
  private async startTail(pos: number): Promise<MemoryChunk | null> {
    if (!this.memory || this.memoryOff || pos < MEMORY_FROM_BYTES) return null;
    const buffer = this.memory.buffers.tryTakeChunk();
    if (!buffer) return null;
    const start = pos - (pos % buffer.bytes.length);
    const tail = new MemoryChunk(start, buffer);
    try {
      if (pos > start) await this.read(start, buffer.bytes.subarray(0, pos - start));
    } catch (err) {
      tail.release();
      throw err;
    }
    tail.length = pos - start;
    this.tail = tail;
    return tail;
  }

  /** The tail to the file in the background (the upload may send it from memory meanwhile). */
  private seal(): void {
    const chunk = this.tail!;
    this.tail = null;
    this.full.push(chunk);
    chunk.retain();
    chunk.onDisk = this.writeChunk(chunk)
      .catch((err: unknown) => this.broken(err))
      .finally(() => {
        chunk.written = true;
        chunk.release();
        this.prune();
      });
  }

  private async writeChunk(chunk: MemoryChunk): Promise<void> {
    const bytes = chunk.bytes.subarray(0, chunk.length);
    const direct = chunk.aligned && chunk.start % DIRECT_ALIGN === 0 && chunk.length % DIRECT_ALIGN === 0 ? await this.directHandle() : null;
    if (direct) {
      try {
        await writeAll(direct, bytes, chunk.start);
        this.wroteDirect = true;
        return;
      } catch {
        // A short O_DIRECT write leaves the rest unaligned (EINVAL): the plain write below redoes it all.
      }
    }
    await writeAll(this.handle, bytes, chunk.start);
  }

  private directHandle(): Promise<fsp.FileHandle | null> {
    this.direct ??= fsp.open(this.path, fsConstants.O_RDWR | fsConstants.O_DIRECT).catch(() => null);
    return this.direct;
  }
}

async function writeAll(file: fsp.FileHandle, data: Buffer, pos: number): Promise<void> {
  let done = 0;
  while (done < data.length) done += (await file.write(data, done, data.length - done, pos + done)).bytesWritten;
}

/** Reads `into.length` bytes at `pos`, zeros past the file's end (bytes there may still be only in memory). */
async function readFully(file: fsp.FileHandle, into: Buffer, pos: number): Promise<void> {
  let done = 0;
  while (done < into.length) {
    const { bytesRead } = await file.read(into, done, into.length - done, pos + done);
    if (bytesRead === 0) {
      into.fill(0, done); // a hole past the end: zeros, as a read of a sparse file gives
      return;
    }
    done += bytesRead;
  }
}
