import type { UploadBuffer } from './upload-buffers.js';

/** A chunk of a streamed file in memory: the tail being written, or a full chunk on its way to disk and GCS. */
export class MemoryChunk {
  length = 0;
  /** The chunk's write to the staged file, once sealed (never rejects). */
  onDisk: Promise<void> = Promise.resolve();
  /** Its write has settled: the file holds its bytes (or the copy is broken). */
  written = false;
  /** The staged copy's, and one per read, borrow or disk write using the bytes: the buffer goes back after the last. */
  private refs = 1;

  constructor(
    readonly start: number,
    private readonly buffer: UploadBuffer,
  ) {}

  get bytes(): Buffer {
    return this.buffer.bytes;
  }

  get aligned(): boolean {
    return this.buffer.aligned;
  }

  get end(): number {
    return this.start + this.length;
  }

  get full(): boolean {
    return this.length === this.buffer.bytes.length;
  }

  retain(): this {
    this.refs++;
    return this;
  }

  release(): void {
    if (--this.refs === 0) this.buffer.release();
  }
}
