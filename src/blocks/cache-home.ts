import { linkSync, lstatSync, renameSync, rmdirSync, unlinkSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import type { Logger } from '../observe/logger.js';
import { PrivateDirError, preparePrivateSubdir, resolveFolder } from '../private-dir.js';
import { holdIndexLock, IndexLockedError } from './block-index.js';
import { BLOCKS_DIR, INDEX_FILE } from './disk-cache.js';

/**
 * The folder of `--cache-dir DIR` that gcsmount owns: everything it keeps is in DIR/gcsmount-cache, and
 * nothing else in DIR is made, changed or deleted (gcsfuse keeps DIR/gcsfuse-file-cache the same way;
 * users pass /tmp, $HOME or a shared SSD).
 */
export const CACHE_SUBDIR = 'gcsmount-cache';

/** A folder the cache tools were pointed at holds no gcsmount cache: they refuse and touch nothing. */
export class NoCacheError extends Error {
  override readonly name = 'NoCacheError';
}

const WHAT = 'cache dir';
const code = (err: unknown): string => (err as NodeJS.ErrnoException).code ?? String(err);

/** Folders of the previous layout's blocks (v1 is still older: removed once it is in our folder). */
const LEGACY_FOLDERS = [BLOCKS_DIR, 'blocks-v1'];

/** What became of a cache of the previous layout (index.sqlite and blocks-v2/ straight in DIR). */
export type LegacyOutcome = { kind: 'none' } | { kind: 'moved' } | { kind: 'left'; why: string; locked: boolean };

function ownEntry(path: string, kind: 'file' | 'dir'): boolean {
  try {
    const st = lstatSync(path);
    return st.uid === (process.getuid?.() ?? 0) && (kind === 'file' ? st.isFile() : st.isDirectory());
  } catch {
    return false;
  }
}

function exists(path: string): boolean {
  try {
    lstatSync(path);
    return true;
  } catch {
    return false;
  }
}

/** DIR holds the previous layout: our index and our blocks folder, side by side, both ours. */
function hasLegacyCache(dir: string): boolean {
  return ownEntry(join(dir, INDEX_FILE), 'file') && ownEntry(join(dir, BLOCKS_DIR), 'dir');
}

/**
 * DIR is itself a cache folder of ours (`.../gcsmount-cache`, the folder the log names). It passes for a
 * cache of the previous layout (an index and a blocks folder, ours), and was moved into a folder inside
 * itself: the cache's blocks stranded where no daemon and no tool looks, and reported as a success.
 */
function refuseCacheHomeItself(dir: string): void {
  const path = resolve(dir);
  if (basename(path) === CACHE_SUBDIR && hasLegacyCache(path)) {
    throw new PrivateDirError(`${WHAT} ${dir} is gcsmount's own cache folder: give the folder that holds it (${dirname(path)}); nothing was changed`);
  }
}

/**
 * Moves a cache of the previous layout from `dir` into `home` (which must have no index yet), only
 * while no process holds its index (an older daemon may still be serving from it). The index is
 * hard-linked first (link never replaces a file, so a cache another process made meanwhile is never
 * overwritten, and the lock held on the old name holds the new one), then the blocks folder is
 * renamed, then the old name is unlinked. Any step that fails undoes the ones before it. DIR's `tmp/`
 * is left alone: in the previous layout it held only half-written blocks, but it may be anyone's.
 */
export function moveLegacyCache(dir: string, home: string): LegacyOutcome {
  if (!hasLegacyCache(dir)) return { kind: 'none' };
  const oldIndex = join(dir, INDEX_FILE);
  const newIndex = join(home, INDEX_FILE);
  if (exists(newIndex)) return { kind: 'left', why: `${home} holds a cache already`, locked: false };
  let lock;
  try {
    lock = holdIndexLock(oldIndex);
  } catch (err) {
    if (err instanceof IndexLockedError) return { kind: 'left', why: 'its index is in use by another process (an older gcsmount?)', locked: true };
    return { kind: 'left', why: `its index cannot be opened: ${code(err)}`, locked: false };
  }
  const moved: string[] = [];
  try {
    linkSync(oldIndex, newIndex);
    moved.push(INDEX_FILE);
    for (const folder of LEGACY_FOLDERS) {
      if (!ownEntry(join(dir, folder), 'dir')) continue;
      // The index is new here, so nothing of ours is in the way; anything that is makes this fail.
      if (exists(join(home, folder))) throw Object.assign(new Error(`${join(home, folder)} exists`), { code: 'EEXIST' });
      renameSync(join(dir, folder), join(home, folder));
      moved.push(folder);
    }
  } catch (err) {
    lock.release();
    for (const name of moved.reverse()) {
      try {
        if (name === INDEX_FILE) unlinkSync(newIndex);
        else renameSync(join(home, name), join(dir, name));
      } catch {
        // Left half-moved: the next start finds the index in home and reconciles what the rows name.
      }
    }
    return { kind: 'left', why: `moving it failed: ${code(err)}`, locked: false };
  }
  // Released while the old name still names the file, so SQLite removes the (checkpointed, empty) WAL.
  lock.release();
  try {
    unlinkSync(oldIndex);
    // The index's journal files, if any were left: an empty WAL (checkpointed above) and an older
    // SQLite's -shm, rebuilt on open. A WAL that holds anything is left alone.
    if (ownEntry(`${oldIndex}-wal`, 'file') && lstatSync(`${oldIndex}-wal`).size === 0) unlinkSync(`${oldIndex}-wal`);
    if (ownEntry(`${oldIndex}-shm`, 'file')) unlinkSync(`${oldIndex}-shm`);
  } catch {
    // A second name of the moved index, or a journal of it: clutter, never a second cache.
  }
  return { kind: 'moved' };
}

/**
 * The daemon's cache folder in `dir`: made (DIR as `mkdir -p` would, never chmod'ed; the folder 0700)
 * and checked, with a cache of the previous layout moved into it, or left where it is and said once.
 */
export function prepareCacheHome(dir: string, log: Logger): string {
  refuseCacheHomeItself(dir);
  const home = preparePrivateSubdir(dir, CACHE_SUBDIR, { create: true, what: WHAT });
  const base = dirname(home);
  const outcome = moveLegacyCache(base, home);
  if (outcome.kind === 'moved') {
    // The previous layout's tmp/ held only half-written blocks, but a folder of that name may be anyone's.
    const tmpLeft = exists(join(base, 'tmp')) ? join(base, 'tmp') : undefined;
    log.info({ from: base, to: home, tmpLeft }, 'moved the block cache of the previous layout into its own folder');
  }
  if (outcome.kind === 'left')
    log.warn(
      { dir: base, home, why: outcome.why },
      `left a block cache of the previous layout (${INDEX_FILE}, ${BLOCKS_DIR}/) where it is; this mount caches in ${home}. Remove them by hand once no older gcsmount uses them`,
    );
  return home;
}

/**
 * The cache folder of `dir` for the cache tools (`cache info|verify|clear`, `stats --cache-dir`), which
 * must not make one where there is none: NoCacheError when `dir` holds no gcsmount cache, with nothing
 * made or changed. A cache of the previous layout is moved first, as a daemon would (only gcsmount's
 * own files move); one in use is refused as in use (IndexLockedError).
 */
export function findCacheHome(dir: string): string {
  refuseCacheHomeItself(dir);
  const base = resolveFolder(dir, { create: false, what: WHAT });
  const home = join(base, CACHE_SUBDIR);
  if (!exists(home)) {
    if (!hasLegacyCache(base)) throw new NoCacheError(`${WHAT} ${dir} holds no gcsmount cache (no ${CACHE_SUBDIR}/ in it); nothing was changed`);
    preparePrivateSubdir(base, CACHE_SUBDIR, { create: true, what: WHAT });
    const outcome = moveLegacyCache(base, home);
    if (outcome.kind !== 'moved') {
      rmdirSync(home); // made just now, for the move that did not happen: empty
      if (outcome.kind === 'left' && outcome.locked) throw new IndexLockedError(`${join(base, INDEX_FILE)} is locked by another process`);
      throw new PrivateDirError(`${WHAT} ${dir} holds a cache of the previous layout that cannot be moved into ${home}: ${outcome.kind === 'left' ? outcome.why : 'it went away'}`);
    }
  }
  const checked = preparePrivateSubdir(base, CACHE_SUBDIR, { create: false, what: WHAT });
  if (!ownEntry(join(checked, INDEX_FILE), 'file')) throw new NoCacheError(`${WHAT} ${dir} holds no gcsmount cache (no ${CACHE_SUBDIR}/${INDEX_FILE}); nothing was changed`);
  return checked;
}
