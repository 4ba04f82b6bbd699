// Stats for a store read afresh on every request: a path that is gone (or that no file system could
// hold) is an absent object or folder, not an error.
import type { BigIntStats } from 'node:fs';
import { promises as fsp } from 'node:fs';

export async function statOrNull(p: string): Promise<BigIntStats | null> {
  try {
    return await fsp.stat(p, { bigint: true });
  } catch (e) {
    if (isMissing(e)) return null;
    throw e;
  }
}

export function isMissing(e: unknown): boolean {
  const code = (e as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ENOTDIR' || code === 'EISDIR' || code === 'ENAMETOOLONG' || code === 'ELOOP';
}
