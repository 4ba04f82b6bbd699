import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { mountedPaths } from '../fs/mount.js';
import { canonicalMountPoint } from '../observe/runtime-dir.js';
import { EXIT, UserError } from './exit.js';

const run = promisify(execFile);

/** `gcsmount unmount MOUNTPOINT`: the daemon sees its mount go and exits on its own. */
export async function runUnmount(args: string[]): Promise<number> {
  if (args.length !== 1 || args[0]!.startsWith('-')) throw new UserError('usage: gcsmount unmount MOUNTPOINT', EXIT.usage);
  // The mount table names the real path; the user may give a symlink to it.
  const path = await canonicalMountPoint(args[0]!);
  if (!(await mountedPaths()).has(path)) throw new UserError(`${args[0]} is not mounted`, EXIT.mountPoint);
  try {
    await run('fusermount3', ['-u', path]);
  } catch (err) {
    const detail = ((err as { stderr?: string }).stderr ?? String(err)).trim().split('\n')[0];
    throw new UserError(`cannot unmount ${args[0]}: ${detail}`, EXIT.mountPoint);
  }
  return EXIT.ok;
}
