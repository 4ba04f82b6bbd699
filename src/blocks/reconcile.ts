import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import type { BlockIndex, BlockRow } from './block-index.js';

/**
 * After an unclean stop: rows whose file is gone are dropped, and files no row names (written, not yet
 * indexed, when the process died) are deleted. Files and rows newer than `startedAt` belong to this run.
 * Returns the rows dropped (the caller's counts follow them). Yields between fan-out folders, so FUSE
 * requests go on meanwhile; throws once `closed()` says the cache was closed.
 */
export async function reconcileBlocks(
  index: BlockIndex,
  blocksDir: string,
  startedAt: number,
  closed: () => boolean,
): Promise<{ dropped: BlockRow[]; deletedFiles: number }> {
  let deletedFiles = 0;
  const onDisk = new Set<string>();
  for (const fan of await fsp.readdir(blocksDir).catch(() => [] as string[])) {
    if (closed()) throw new Error('closed before reconciliation finished');
    for (const name of await fsp.readdir(join(blocksDir, fan)).catch(() => [] as string[])) {
      if (index.has(name)) {
        onDisk.add(name);
        continue;
      }
      const p = join(blocksDir, fan, name);
      const st = await fsp.stat(p).catch(() => null);
      if (st && st.mtimeMs < startedAt) {
        await fsp.rm(p, { force: true });
        deletedFiles++;
      }
    }
    await new Promise((r) => setImmediate(r)); // let FUSE requests through between folders
  }
  if (closed()) throw new Error('closed before reconciliation finished');
  const missing: BlockRow[] = [];
  for (const row of index.rows()) if (!onDisk.has(row.key) && row.lastAccess < startedAt) missing.push(row);
  const dropped: BlockRow[] = [];
  for (const row of missing) {
    if (index.has(row.key)) {
      index.delete([row.key]);
      dropped.push(row);
    }
  }
  return { dropped, deletedFiles };
}
