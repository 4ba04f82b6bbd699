import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { preparePrivateSubdir } from '../private-dir.js';

/**
 * Where the control sockets live: a folder of gcsmount's own, owner-only, inside a folder that may hold
 * other things (and is never changed): /run/gcsmount for root (the systemd case), $XDG_RUNTIME_DIR/gcsmount
 * or a per-user folder in /tmp otherwise; GCSMOUNT_RUNTIME_DIR=DIR puts it in DIR/gcsmount.
 */
function runtimeLocation(env: NodeJS.ProcessEnv): { parent: string; name: string } {
  if (env.GCSMOUNT_RUNTIME_DIR) return { parent: env.GCSMOUNT_RUNTIME_DIR, name: 'gcsmount' };
  const uid = process.getuid?.() ?? 0;
  if (uid === 0) return { parent: '/run', name: 'gcsmount' };
  return env.XDG_RUNTIME_DIR ? { parent: env.XDG_RUNTIME_DIR, name: 'gcsmount' } : { parent: tmpdir(), name: `gcsmount-${uid}` };
}

export function runtimeDir(env: NodeJS.ProcessEnv = process.env): string {
  const { parent, name } = runtimeLocation(env);
  return join(parent, name);
}

/**
 * A mountpoint as the kernel's mount table names it (what the daemon mounts on: realpath): absolute,
 * every symlink resolved, so a client given a symlink finds the same socket. Resolved by hand, parent
 * first and then the last component with readlink, because neither touches the mount itself: realpath
 * would stat the mount's root, which fails on a dead mount (ENOTCONN) and waits on a wedged daemon.
 */
export async function canonicalMountPoint(path: string, hops = 0): Promise<string> {
  const abs = resolve(path);
  if (abs === '/') return abs;
  let parent: string;
  try {
    parent = await fsp.realpath(dirname(abs));
  } catch {
    return abs;
  }
  const joined = join(parent, basename(abs));
  // 40 is Linux's own limit on symlinks followed in one lookup (ELOOP).
  if (hops < 40) {
    const link = await fsp.readlink(joined).catch(() => null);
    if (link !== null) return canonicalMountPoint(resolve(parent, link), hops + 1);
  }
  return joined;
}

/** A mount point's name in the runtime dir (a short hash: socket paths are limited to 108 bytes). */
async function mountId(path: string): Promise<string> {
  return createHash('sha256').update(await canonicalMountPoint(path)).digest('hex').slice(0, 16);
}

/** The control socket of the mount at `path`. */
export async function controlSocketFor(path: string, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  return join(runtimeDir(env), `${await mountId(path)}.sock`);
}

/** The file whose lock a daemon holds while it mounts on `path`: two starts on one mount point take turns. */
export async function startLockFor(path: string, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  return join(runtimeDir(env), `${await mountId(path)}.start`);
}

/**
 * Makes the runtime dir (0700) in its parent, which is left as it is, refusing one another user owns,
 * a symlink in its place, or a parent reached through a symlink in a world-writable folder (the /tmp
 * fallback is where someone else could have made it first): a PrivateDirError of one line.
 */
export async function ensureRuntimeDir(env: NodeJS.ProcessEnv = process.env): Promise<string> {
  const { parent, name } = runtimeLocation(env);
  return preparePrivateSubdir(parent, name, { create: true, what: 'runtime dir' });
}

export async function allSockets(env: NodeJS.ProcessEnv = process.env): Promise<string[]> {
  const dir = runtimeDir(env);
  const names = await fsp.readdir(dir).catch(() => [] as string[]);
  return names.filter((n) => n.endsWith('.sock')).map((n) => join(dir, n));
}
