// Where a written object's file goes, how it gets there atomically, and what is tidied when one goes.
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { statOrNull } from './file-stat.js';
import { SIDE_DIR } from './names.js';

/** True when `name` can be a regular file: no parent is a file and the path itself is not a folder. */
export async function fileSlotFree(bucketDir: string, name: string): Promise<boolean> {
  const parts = name.split('/');
  let p = bucketDir;
  for (let i = 0; i < parts.length; i++) {
    p = path.join(p, parts[i]!);
    const st = await statOrNull(p);
    if (!st) return true;
    if (i < parts.length - 1 ? !st.isDirectory() : !st.isFile()) return false;
  }
  return true;
}

export async function moveInto(tmp: string, dest: string): Promise<void> {
  try {
    await fsp.rename(tmp, dest);
  } catch (e) {
    // A symlinked sub-folder may sit on another file system: copy next to the target, then rename.
    if ((e as NodeJS.ErrnoException).code !== 'EXDEV') throw e;
    const near = path.join(path.dirname(dest), `${SIDE_DIR}-tmp-${randomBytes(8).toString('hex')}`);
    await fsp.copyFile(tmp, near);
    const st = await fsp.stat(tmp);
    await fsp.utimes(near, st.atime, st.mtime);
    await fsp.rename(near, dest);
    await fsp.rm(tmp, { force: true });
  }
}

/** Removes the folders a deleted object leaves empty, up to (not including) `stop`: in GCS a folder is only a prefix of some name. */
export async function pruneEmptyParents(dir: string, stop: string): Promise<void> {
  while (dir.startsWith(stop + path.sep)) {
    try {
      await fsp.rmdir(dir);
    } catch {
      return;
    }
    dir = path.dirname(dir);
  }
}
