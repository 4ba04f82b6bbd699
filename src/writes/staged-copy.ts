import type { promises as fsp } from 'node:fs';
import { unlink } from 'node:fs/promises';
import type { BlockSource } from '../blocks/block-source.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import { readFully } from './file-upload.js';
import type { StagingDir } from './staging.js';

/**
 * A file's whole bytes in the temp dir, while it is open for writing: what reads of it answer from, what
 * uploads send (again, after a lost session), and what goes into the block cache once uploaded.
 */
export class StagedCopy {
  private constructor(
    readonly path: string,
    readonly handle: fsp.FileHandle,
  ) {}

  static async create(staging: StagingDir): Promise<StagedCopy> {
    const { path, handle } = await staging.create();
    return new StagedCopy(path, handle);
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

  async write(pos: number, data: Buffer): Promise<void> {
    let done = 0;
    while (done < data.length) done += (await this.handle.write(data, done, data.length - done, pos + done)).bytesWritten;
  }

  /** `into.length` bytes at `pos` (zeros past the end, as a sparse file reads). */
  read(pos: number, into: Buffer): Promise<void> {
    return readFully(this.handle, into, pos);
  }

  truncate(size: number): Promise<void> {
    return this.handle.truncate(size);
  }

  /** Closes and deletes the file. */
  async remove(): Promise<void> {
    await this.handle.close().catch(() => undefined);
    await unlink(this.path).catch(() => undefined);
  }
}
