import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { mountedTypes } from '../fs/mount.js';
import { canonicalMountPoint } from '../observe/runtime-dir.js';
import { EXIT, UserError } from './exit.js';

const run = promisify(execFile);

/** `gcsmount unmount MOUNTPOINT`: the daemon sees its mount go and exits on its own. */
export async function runUnmount(args: string[]): Promise<number> {
  if (args.length !== 1 || args[0]!.startsWith('-')) throw new UserError('usage: gcsmount unmount MOUNTPOINT', EXIT.usage);
  // The mount table names the real path; the user may give a symlink to it.
  const path = await canonicalMountPoint(args[0]!);
  const type = (await mountedTypes()).get(path);
  if (!type) throw new UserError(`${args[0]} is not mounted`, EXIT.mountPoint);
  // fusermount3 run as root unmounts whatever is there (its FUSE-only check is for other users): a
  // mistyped `sudo gcsmount unmount /boot` must not.
  if (type !== 'fuse.gcsmount') throw new UserError(`${args[0]} is not a gcsmount mount (it is ${type}); nothing was done`, EXIT.mountPoint);
  try {
    await run('fusermount3', ['-u', path]);
  } catch (err) {
    const detail = ((err as { stderr?: string }).stderr ?? String(err)).trim().split('\n')[0];
    throw new UserError(`cannot unmount ${args[0]}: ${detail}`, EXIT.mountPoint);
  }
  return EXIT.ok;
}
