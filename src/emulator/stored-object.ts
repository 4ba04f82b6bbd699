// An object as the store holds it: a regular file, whose mtime in microseconds is its generation.
import type { BigIntStats } from 'node:fs';
import { promises as fsp, statSync } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import { isMissing, statOrNull } from './file-stat.js';

export interface StoredObject {
  bucket: string;
  name: string;
  /** The backing file. */
  path: string;
  ino: bigint;
  size: number;
  mtimeNs: bigint;
  /** The mtime in microseconds, as a decimal string. */
  generation: string;
}

export interface OpenedObject {
  obj: StoredObject;
  fh: FileHandle;
}

/** The object `name` whose file is `p`; null if `p` is not a regular file. */
export async function statObject(bucket: string, name: string, p: string): Promise<StoredObject | null> {
  const st = await statOrNull(p);
  return st && st.isFile() ? toObject(bucket, name, p, st) : null;
}

/**
 * The same as statObject, synchronously: a listing stats a thousand files per page, and an awaited
 * bigint stat costs about ten times a synchronous one in this process.
 */
export function statObjectSync(bucket: string, name: string, p: string): StoredObject | null {
  let st: BigIntStats | undefined;
  try {
    st = statSync(p, { bigint: true, throwIfNoEntry: false });
  } catch (e) {
    if (isMissing(e)) return null;
    throw e;
  }
  return st && st.isFile() ? toObject(bucket, name, p, st) : null;
}

/** Opens the file so headers, hashes and body all describe the same version; null if it is not a regular file. */
export async function openObject(bucket: string, name: string, p: string): Promise<OpenedObject | null> {
  let fh: FileHandle;
  try {
    fh = await fsp.open(p, 'r');
  } catch (e) {
    if (isMissing(e)) return null;
    throw e;
  }
  try {
    const st = await fh.stat({ bigint: true });
    if (!st.isFile()) {
      await fh.close();
      return null;
    }
    return { obj: toObject(bucket, name, p, st), fh };
  } catch (e) {
    await fh.close();
    throw e;
  }
}

/**
 * Generations must strictly increase on replace, but two writes in the same microsecond (or on a
 * coarse-timestamp file system) share an mtime. utimes takes double seconds, which only resolve about
 * a quarter microsecond at today's epoch, hence the margin and the re-check.
 */
export async function ensureNewer(file: string, oldGeneration: bigint | null): Promise<void> {
  if (oldGeneration === null) return;
  let st = await fsp.stat(file, { bigint: true });
  let step = 2n;
  while (st.mtimeNs / 1000n <= oldGeneration) {
    if (step > 100_000_000n) throw new Error(`cannot advance mtime of ${file} past generation ${oldGeneration}`);
    const secs = Number(oldGeneration + step) / 1e6;
    await fsp.utimes(file, secs, secs);
    st = await fsp.stat(file, { bigint: true });
    step *= 4n;
  }
}

/** The generation a file of this stat would have (a rename keeps the mtime, so the generation). */
export function generationOf(st: BigIntStats): string {
  return (st.mtimeNs / 1000n).toString();
}

function toObject(bucket: string, name: string, p: string, st: BigIntStats): StoredObject {
  return { bucket, name, path: p, ino: st.ino, size: Number(st.size), mtimeNs: st.mtimeNs, generation: generationOf(st) };
}
