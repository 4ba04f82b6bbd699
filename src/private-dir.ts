import { chmodSync, lstatSync, mkdirSync, readlinkSync, statSync } from 'node:fs';
import { dirname, isAbsolute, join, resolve, sep } from 'node:path';

/**
 * Directories that hold a daemon's private state (the block cache with its object names, the control
 * sockets): a folder of its own, owned by this user, 0700, and not reached through a symlink another user
 * could have planted, inside a folder a user names (which is never changed).
 * A leaf module (node:fs only), so both blocks/ and observe/ can use it.
 */
export class PrivateDirError extends Error {
  override readonly name = 'PrivateDirError';
}

export interface PrivateDirRequest {
  /**
   * Create what is missing (gcsmount's own folder 0700, the ones above it 0755 at most) and leave its
   * own folder 0700: what an owner (a daemon) does. Without it the folders are only checked (the cache
   * tools, which must not change the mode of a folder someone merely asked about).
   */
  create: boolean;
  /** How the one-line messages name the folder: 'cache dir', 'runtime dir'. */
  what: string;
}

/** Linux follows at most 40 symlinks in one path; so do we, and a loop ends here too. */
const MAX_SYMLINKS = 40;

const code = (err: unknown): string => (err as NodeJS.ErrnoException).code ?? String(err);

/**
 * The real path of `path`, walked one component at a time (never Node's recursive mkdir, which spins
 * forever on /proc) and made when missing if asked (0755 at most, never chmod'ed afterwards), refusing a
 * symlink that sits in a world-writable folder (anyone could have put it there: /tmp/cache -> a folder
 * the attacker reads). A folder a user gave us, which may hold other things: only checked. Every refusal
 * is a PrivateDirError of one line.
 */
export function resolveFolder(path: string, req: PrivateDirRequest): string {
  return guarded(path, req, () => walk(path, req, 0o755));
}

/**
 * The folder `name` inside `parent`, the one place gcsmount keeps its state in a folder a user gave it
 * (`--cache-dir /tmp`, a shared SSD, $HOME hold other things): `parent` is walked as resolveFolder
 * walks a path (made 0755 when missing) but never chmod'ed and never checked for its owner; `name` is
 * made 0700 when asked, must be a real folder (never a symlink: gcsmount makes none there) and must be
 * ours. Returns its real path.
 */
export function preparePrivateSubdir(parent: string, name: string, req: PrivateDirRequest): string {
  const shown = join(parent, name);
  return guarded(shown, req, () => {
    // Failures on the way name the folder the user gave; those of the subfolder name the subfolder.
    const sub = join(walk(parent, req, 0o755), name);
    if (req.create) {
      try {
        mkdirSync(sub, { mode: 0o700 });
      } catch (err) {
        if (code(err) !== 'EEXIST') throw new PrivateDirError(`${req.what} ${shown} cannot be used: ${code(err)} creating it`);
      }
    }
    let st;
    try {
      st = lstatSync(sub);
    } catch (err) {
      if (code(err) === 'ENOENT') throw new PrivateDirError(`${req.what} ${shown} does not exist`);
      throw err;
    }
    if (!st.isDirectory()) throw new PrivateDirError(`${req.what} ${shown} is not a folder (${st.isSymbolicLink() ? 'a symlink' : 'a file'}); gcsmount makes it itself, so it will not use what is there`);
    return claim(sub, shown, req);
  });
}

function guarded(shown: string, req: PrivateDirRequest, body: () => string): string {
  try {
    return body();
  } catch (err) {
    if (err instanceof PrivateDirError) throw err;
    throw new PrivateDirError(`${req.what} ${shown} cannot be used: ${code(err)}`);
  }
}

/** Resolves `path` component by component, making what is missing when asked (its last part `lastMode`). */
function walk(path: string, req: PrivateDirRequest, lastMode: number, shown = path): string {
  const given = resolve(path);
  const fail = (why: string): never => {
    throw new PrivateDirError(`${req.what} ${shown} ${why}`);
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
      if (!req.create) fail(next === given ? 'does not exist' : `cannot be used: ${next} does not exist`);
      try {
        // Folders above it as `mkdir -p` would make them, but never group- or world-writable (umask 000).
        mkdirSync(next, { mode: pending.length === 0 ? lastMode : 0o755 });
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
  return cur;
}

/** Refuses a folder another user owns; an owner (`create`) leaves it 0700. */
function claim(dir: string, shown: string, req: PrivateDirRequest): string {
  const fail = (why: string): never => {
    throw new PrivateDirError(`${req.what} ${shown} ${why}`);
  };
  const st = statSync(dir);
  const uid = process.getuid?.() ?? 0;
  if (st.uid !== uid) fail(`belongs to uid ${st.uid}, not to this user (uid ${uid}); refusing to keep private files there`);
  try {
    // Whatever the umask, and whoever made it: the cache names objects, the sockets answer for the mount.
    if (req.create && (st.mode & 0o777) !== 0o700) chmodSync(dir, 0o700);
  } catch (err) {
    fail(`cannot be used: ${code(err)} making it private`);
  }
  return dir;
}
