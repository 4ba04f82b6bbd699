import { chmodSync, constants as fsConstants, lstatSync, mkdirSync, promises as fsp } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { BlockWriteError, hasNativeBlockWrite, writeBlockFileNative } from '../block-file-write.js';
import type { Logger } from '../observe/logger.js';

export { BlockWriteError };

/**
 * Block files on disk: reading one whole, writing one with or without O_DIRECT, the cache's own folders.
 * What the disk cache does with them (the index, failures) is disk-cache.ts and, for writes, block-writer.ts;
 * eviction is eviction.ts.
 */

/** O_DIRECT wants the memory, the offset and the length aligned to the device's block; 4 KiB covers 512 and 4K devices. */
export const DIRECT_ALIGN = 4096;

/** Owner-only, whatever the umask: block files hold object bytes, the index object names. */
export const FILE_MODE = 0o600;
export const DIR_MODE = 0o700;

/**
 * The block as a new file `tmp`, renamed to `final`, in one job on a libuv pool thread (the addon's
 * writeBlockFile: open, write, truncate, close, rename; through fs.promises five round trips, each
 * costing the JS thread a promise, a FileHandle and a woken pool thread). With `direct`, `count` is the
 * length padded to DIRECT_ALIGN, written with O_DIRECT and cut back to `length`. Without the addon, the
 * same through fs.promises (and with `viaAddon` false). Rejects with a BlockWriteError.
 */
export async function writeAndRename(tmp: string, final: string, data: Buffer, count: number, length: number, direct: boolean, viaAddon = true): Promise<void> {
  if (!hasNativeBlockWrite || !viaAddon) {
    try {
      if (direct) {
        const outcome = await writeDirect(tmp, Buffer.from(data.buffer, data.byteOffset, count), length);
        if (outcome !== 'written') throw Object.assign(new Error(outcome), { code: 'EINVAL', stage: outcome === 'refused' ? 'open' : 'write' });
      } else await writeFully(tmp, data.subarray(0, length));
    } catch (err) {
      const e = err as NodeJS.ErrnoException & { stage?: 'open' | 'write' };
      throw new BlockWriteError(e.code ?? 'EIO', e.stage ?? 'write', tmp);
    }
    await fsp.rename(tmp, final).catch((err: NodeJS.ErrnoException) => {
      throw new BlockWriteError(err.code ?? 'EIO', 'rename', final);
    });
    return;
  }
  return writeBlockFileNative(tmp, final, data, count, length, direct, FILE_MODE);
}

/** Folders of older layouts: never read again, removed in the background to give their space back. */
const OLD_LAYOUT_DIRS = ['blocks-v1'];

/** A folder of the cache's own layout, 0700, and a real folder (not a symlink someone put there). */
export function ensureLayoutDir(path: string): void {
  try {
    mkdirSync(path, { mode: DIR_MODE });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  const st = lstatSync(path);
  if (!st.isDirectory()) throw Object.assign(new Error(`${path} is not a directory`), { code: 'ENOTDIR' });
  if ((st.mode & 0o777) !== DIR_MODE) chmodSync(path, DIR_MODE);
}

/**
 * Up to `into.length` bytes from the start of the file; the count tells a short file. One read call per
 * block instead of readFile's stat-and-chunks, and into a reused buffer rather than a fresh one.
 */
export async function readFully(path: string, into: Buffer): Promise<number> {
  const fh = await fsp.open(path, 'r');
  try {
    let got = 0;
    while (got < into.length) {
      const { bytesRead } = await fh.read(into, got, into.length - got, got);
      if (bytesRead === 0) break;
      got += bytesRead;
    }
    return got;
  } finally {
    await fh.close();
  }
}

/** Why an O_DIRECT write did not happen: the file system refuses the flag, or this one write failed. */
export type DirectOutcome = 'written' | 'refused' | 'failed';

/**
 * The block as a new file written with O_DIRECT, past the page cache: `padded` is the block's memory
 * rounded up to DIRECT_ALIGN, and the file is cut back to `length` after. EINVAL at open is the file
 * system refusing O_DIRECT; EINVAL later (a short write leaves the next one unaligned) is this block's.
 */
export async function writeDirect(path: string, padded: Buffer, length: number): Promise<DirectOutcome> {
  const { O_WRONLY, O_CREAT, O_TRUNC, O_DIRECT } = fsConstants;
  let fh: FileHandle;
  try {
    fh = await fsp.open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, FILE_MODE);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EINVAL') return 'refused';
    throw err;
  }
  try {
    let done = 0;
    while (done < padded.length) done += (await fh.write(padded, done, padded.length - done, done)).bytesWritten;
    if (padded.length !== length) await fh.truncate(length);
    return 'written';
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EINVAL') return 'failed';
    throw err;
  } finally {
    await fh.close();
  }
}

/** The whole buffer as a new file, in as few write calls as the kernel allows (writeFile writes 512 KiB at a time). */
export async function writeFully(path: string, data: Buffer): Promise<void> {
  const fh = await fsp.open(path, 'w', FILE_MODE);
  try {
    let done = 0;
    while (done < data.length) done += (await fh.write(data, done, data.length - done, done)).bytesWritten;
  } finally {
    await fh.close();
  }
}

/** Deletes the block folders of older layouts, logging what it freed; a failure is logged, not thrown. */
export async function removeOldLayouts(dir: string, log: Logger): Promise<void> {
  for (const name of OLD_LAYOUT_DIRS) {
    const old = join(dir, name);
    if (!(await fsp.stat(old).catch(() => null))) continue;
    try {
      await fsp.rm(old, { recursive: true, force: true });
      log.info({ removed: old }, 'removed the block cache of an older layout version');
    } catch (err) {
      log.warn({ dir: old, err: (err as Error).message }, 'cannot remove the block cache of an older layout version');
    }
  }
}
