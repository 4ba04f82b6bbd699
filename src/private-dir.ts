import { chmodSync, lstatSync, mkdirSync, readlinkSync, statSync } from 'node:fs';
import { dirname, isAbsolute, join, resolve, sep } from 'node:path';

/**
 * Directories that hold a daemon's private state (the block cache with its object names, the control
 * sockets): owned by this user, 0700, and not reached through a symlink another user could have planted.
 * A leaf module (node:fs only), so both blocks/ and observe/ can use it.
 */
export class PrivateDirError extends Error {
  override readonly name = 'PrivateDirError';
}

export interface PrivateDirRequest {
  /**
   * Create what is missing (the last folder 0700, the ones above it 0755 at most) and leave the folder
   * 0700: what an owner (a daemon) does. Without it the folder is only checked (the cache tools, which
   * must not change the mode of a folder someone merely asked about).
   */
  create: boolean;
  /** How the one-line messages name the folder: 'cache dir', 'runtime dir'. */
  what: string;
}

/** Linux follows at most 40 symlinks in one path; so do we, and a loop ends here too. */
const MAX_SYMLINKS = 40;

const code = (err: unknown): string => (err as NodeJS.ErrnoException).code ?? String(err);

/**
 * Walks `path` one component at a time (never Node's recursive mkdir, which spins forever on /proc),
 * creating what is missing when asked, refusing a symlink that sits in a world-writable folder (anyone
 * could have put it there: /tmp/cache -> a folder the attacker reads) and a last folder owned by another
 * user. Returns its real path. Every refusal is a PrivateDirError of one line.
 */
export function preparePrivateDir(path: string, req: PrivateDirRequest): string {
  try {
    return walk(path, req);
  } catch (err) {
    if (err instanceof PrivateDirError) throw err;
    throw new PrivateDirError(`${req.what} ${path} cannot be used: ${code(err)}`);
  }
}

function walk(path: string, req: PrivateDirRequest): string {
  const given = resolve(path);
  const fail = (why: string): never => {
    throw new PrivateDirError(`${req.what} ${path} ${why}`);
  };
  const pending = given.split(sep).filter(Boolean);
  let cur = '/';
  let hops = 0;
  while (pending.length > 0) {
    const part = pending.shift()!;
    if (part === '.') continue;
    if (part === '..') {
      cur = dirname(cur);
      continue;
    }
    const next = join(cur, part);
    let st;
    try {
      st = lstatSync(next);
    } catch (err) {
      if (code(err) !== 'ENOENT') fail(`cannot be used: ${code(err)} on ${next}`);
      if (!req.create) fail('does not exist');
      try {
        // Folders above it as `mkdir -p` would make them, but never group- or world-writable (umask 000).
        mkdirSync(next, { mode: pending.length === 0 ? 0o700 : 0o755 });
      } catch (mkErr) {
        if (code(mkErr) !== 'EEXIST') fail(`cannot be used: ${code(mkErr)} creating ${next}`);
      }
      st = lstatSync(next);
    }
    if (st.isSymbolicLink()) {
      if (statSync(cur).mode & 0o002) fail(`is reached through the symlink ${next} in the world-writable ${cur}, which any user could have made; give its real path`);
      if (++hops > MAX_SYMLINKS) fail('cannot be used: ELOOP');
      const target = readlinkSync(next);
      pending.unshift(...target.split(sep).filter(Boolean));
      if (isAbsolute(target)) cur = '/';
      continue;
    }
    if (!st.isDirectory()) fail(`cannot be used: ${next} is not a directory`);
    cur = next;
  }
  const st = statSync(cur);
  const uid = process.getuid?.() ?? 0;
  if (st.uid !== uid) fail(`belongs to uid ${st.uid}, not to this user (uid ${uid}); refusing to keep private files there`);
  try {
    // Whatever the umask, and whoever made it: the cache names objects, the sockets answer for the mount.
    if (req.create && (st.mode & 0o777) !== 0o700) chmodSync(cur, 0o700);
  } catch (err) {
    fail(`cannot be used: ${code(err)} making it private`);
  }
  return cur;
}
