import { IndexLockedError } from '../blocks/block-index.js';
import { DEFAULT_DISK_CACHE, DiskCache } from '../blocks/disk-cache.js';
import { silentLogger } from '../observe/logger.js';
import { PrivateDirError } from '../private-dir.js';
import { findCacheHome, NoCacheError } from '../blocks/cache-home.js';
import { Metrics } from '../observe/metrics.js';
import { EXIT, UserError } from './exit.js';
import { formatBytes } from './format.js';

const USAGE = 'usage: gcsmount cache info|verify|clear --cache-dir DIR [--json]';

function bytesAndExact(n: number): string {
  return n < 1024 ? `${n} B` : `${formatBytes(n)} (${n} bytes)`;
}

function parse(args: string[]): { action: 'info' | 'verify' | 'clear'; dir: string; json: boolean } {
  const [action, ...rest] = args;
  if (action !== 'info' && action !== 'verify' && action !== 'clear') throw new UserError(USAGE, EXIT.usage);
  let dir: string | undefined;
  let json = false;
  for (let i = 0; i < rest.length; i++) {
    const a = rest[i]!;
    if (a === '--json') json = true;
    else if (a === '--cache-dir' && rest[i + 1] !== undefined) dir = rest[++i];
    else if (a.startsWith('--cache-dir=')) dir = a.slice('--cache-dir='.length);
    else throw new UserError(`unexpected argument ${a}; ${USAGE}`, EXIT.usage);
  }
  if (!dir) throw new UserError(`--cache-dir is required; ${USAGE}`, EXIT.usage);
  return { action, dir, json };
}

/**
 * Opens the block cache of a stopped mount, reconciled. It takes the index's lock like a daemon does,
 * so under a live mount it refuses, with one line.
 */
async function openStoppedCache(dir: string): Promise<DiskCache> {
  let cache: DiskCache;
  try {
    // The same checks as a daemon's (ours, not through a planted symlink), then the lock before anything
    // else; a folder with no cache of ours is refused before anything is made in it.
    const home = findCacheHome(dir);
    cache = DiskCache.open({ dir: home, limit: { kind: 'unlimited' }, ...DEFAULT_DISK_CACHE }, silentLogger, new Metrics());
  } catch (err) {
    if (err instanceof PrivateDirError || err instanceof NoCacheError) throw new UserError(err.message, EXIT.cacheDir);
    if (err instanceof IndexLockedError) throw new UserError(`cache dir ${dir} is in use by a running gcsmount; stop it first, or run gcsmount stats MOUNTPOINT for its live figures`, EXIT.cacheDir);
    throw new UserError(`cache dir ${dir} cannot be opened: ${(err as Error).message}`, EXIT.cacheDir);
  }
  await cache.ready;
  return cache;
}

/** What the index of a stopped mount's cache says. */
export async function cacheInfo(dir: string): Promise<{ dir: string; bytes: number; blocks: number; objects: number }> {
  const cache = await openStoppedCache(dir);
  try {
    const { bytes, blocks, objects } = cache.info();
    return { dir, bytes, blocks, objects };
  } finally {
    cache.close();
  }
}

/**
 * `gcsmount cache info|verify|clear`: the block cache of a directory no daemon is using. They take the
 * index's lock like a daemon does, so none of them can run under a live mount.
 */
export async function runCache(args: string[]): Promise<number> {
  const { action, dir, json } = parse(args);
  const cache = await openStoppedCache(dir);
  try {
    let result: Record<string, unknown>;
    if (action === 'info') {
      const i = cache.info();
      result = { dir: i.dir, bytes: i.bytes, blocks: i.blocks, objects: i.objects };
      if (!json) {
        process.stdout.write(`cache dir  ${i.dir}\nsize       ${bytesAndExact(i.bytes)}\nblocks     ${i.blocks}\nobjects    ${i.objects}\n`);
      }
    } else if (action === 'verify') {
      const v = await cache.verify();
      result = { dir, checked: v.checked, dropped: v.bad };
      if (!json) process.stdout.write(`checked ${v.checked} blocks; dropped ${v.bad} that failed their check\n`);
    } else {
      const before = cache.info();
      await cache.clear();
      result = { dir, removedBlocks: before.blocks, removedBytes: before.bytes };
      if (!json) process.stdout.write(`removed ${before.blocks} blocks, ${bytesAndExact(before.bytes)}\n`);
    }
    if (json) process.stdout.write(`${JSON.stringify(result)}\n`);
    // The files of blocks verify dropped are unlinked in the background: a failure must be known at close.
    await cache.drain();
  } finally {
    cache.close();
  }
  return EXIT.ok;
}
