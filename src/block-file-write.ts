import { optionalAddon } from './native-addon.js';

/**
 * A block file written whole and renamed into place by the addon's writeBlockFile (native/block_write.c),
 * from whichever thread calls it: the main thread (blocks/block-files.ts) or a download worker
 * (gcs/range-worker.ts), which writes the block files of the bodies it received so that their completions
 * wake the worker, not the main thread. Below both, so neither imports the other.
 */

type NativeWrite = (tmp: string, final: string | null, buffer: Buffer, count: number, length: number, direct: boolean, mode: number, done: (code: string | null, stage: string) => void) => void;
const nativeWrite = optionalAddon().writeBlockFile as NativeWrite | undefined;

/** How far a failed block file write got ("rename": the file was written whole). */
export type BlockWriteStage = 'open' | 'write' | 'rename';

/** A block file write that failed: `stage` says how far it got. */
export class BlockWriteError extends Error {
  constructor(
    readonly code: string,
    readonly stage: BlockWriteStage,
    path: string,
  ) {
    super(`${code}: ${stage} ${path}`);
  }
}

/** Whether the addon that writes block files in one job loaded. */
export const hasNativeBlockWrite = nativeWrite !== undefined;

/**
 * `count` bytes of `data` as a new file `tmp` (O_DIRECT when `direct`: `count` is then the length padded
 * to the alignment, cut back to `length`), renamed to `final`, in one job on a libuv pool thread; its
 * completion comes back to the calling thread. Rejects with a BlockWriteError; throws when the addon is
 * missing (see hasNativeBlockWrite).
 */
export function writeBlockFileNative(tmp: string, final: string, data: Buffer, count: number, length: number, direct: boolean, mode: number): Promise<void> {
  if (!nativeWrite) return Promise.reject(new Error('the addon\'s writeBlockFile did not load'));
  return new Promise((resolve, reject) => {
    nativeWrite(tmp, final, data, count, length, direct, mode, (code, stage) => {
      if (code === null) resolve();
      else reject(new BlockWriteError(code, stage as BlockWriteStage, stage === 'rename' ? final : tmp));
    });
  });
}

/**
 * Where block files can be written off the main thread: `data` lies in shared memory, and the write's
 * outcome comes back as writeBlockFileNative's; null when it cannot be taken (not shared memory, no
 * worker): the caller writes it itself.
 */
export type BlockFileWriter = (tmp: string, final: string, data: Buffer, count: number, length: number, direct: boolean, mode: number) => Promise<void> | null;
