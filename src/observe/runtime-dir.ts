import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { preparePrivateDir } from '../private-dir.js';

/**
 * Where the control sockets live: one per mount, owner-only. /run/gcsmount for root (the systemd case),
 * $XDG_RUNTIME_DIR/gcsmount or a per-user folder in /tmp otherwise; GCSMOUNT_RUNTIME_DIR overrides.
 */
export function runtimeDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.GCSMOUNT_RUNTIME_DIR) return env.GCSMOUNT_RUNTIME_DIR;
  const uid = process.getuid?.() ?? 0;
  if (uid === 0) return '/run/gcsmount';
  return env.XDG_RUNTIME_DIR ? join(env.XDG_RUNTIME_DIR, 'gcsmount') : join(tmpdir(), `gcsmount-${uid}`);
}

/** The control socket of the mount at `mountPoint` (a short hash: socket paths are limited to 108 bytes). */
export function socketPathFor(mountPoint: string, env: NodeJS.ProcessEnv = process.env): string {
  const id = createHash('sha256').update(resolve(mountPoint)).digest('hex').slice(0, 16);
  return join(runtimeDir(env), `${id}.sock`);
}

/**
 * Makes the runtime dir (0700), refusing one another user owns or one reached through a symlink in a
 * world-writable folder (the /tmp fallback is where someone else could have made it first): a
 * PrivateDirError of one line.
 */
export async function ensureRuntimeDir(env: NodeJS.ProcessEnv = process.env): Promise<string> {
  return preparePrivateDir(runtimeDir(env), { create: true, what: 'runtime dir' });
}

export async function allSockets(env: NodeJS.ProcessEnv = process.env): Promise<string[]> {
  const dir = runtimeDir(env);
  const names = await fsp.readdir(dir).catch(() => [] as string[]);
  return names.filter((n) => n.endsWith('.sock')).map((n) => join(dir, n));
}
