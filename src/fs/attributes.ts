import type { Entry } from '../namespace/entry.js';
import type { Attr } from './kernel.js';

/** Ownership and permission bits presented for every inode (gcsfuse's --uid, --gid, --file-mode, --dir-mode). */
export interface AttributePolicy {
  uid: number;
  gid: number;
  fileMode: number;
  dirMode: number;
  /** Shown as the time of directories that have no placeholder object to take a time from. */
  mountTimeMs: number;
}

const S_IFREG = 0o100000;
const S_IFDIR = 0o040000;

/** The attributes the kernel is given for inode `ino` showing `entry`. */
export function statFor(ino: number, entry: Entry, policy: AttributePolicy): Attr {
  if (entry.kind === 'dir') return [ino, S_IFDIR | policy.dirMode, 2, policy.uid, policy.gid, 4096, entry.mtimeMs ?? policy.mountTimeMs];
  return [ino, S_IFREG | policy.fileMode, 1, policy.uid, policy.gid, entry.meta.size, entry.meta.updatedMs];
}
