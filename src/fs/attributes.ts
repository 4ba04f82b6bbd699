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

export const S_IFREG = 0o100000;
export const S_IFDIR = 0o040000;
export const S_IFLNK = 0o120000;

/** The attributes the kernel is given for inode `ino` showing `entry`. */
export function statFor(ino: number, entry: Entry, policy: AttributePolicy): Attr {
  if (entry.kind === 'dir') return [ino, S_IFDIR | policy.dirMode, 2, policy.uid, policy.gid, 4096, entry.mtimeMs ?? policy.mountTimeMs];
  const { meta } = entry;
  if (meta.symlinkTarget !== undefined) {
    // A link's size is its target's length in bytes (POSIX); its permission bits are never checked.
    const size = meta.symlinkTarget === null ? meta.size : Buffer.byteLength(meta.symlinkTarget);
    return [ino, S_IFLNK | 0o777, 1, policy.uid, policy.gid, size, meta.updatedMs];
  }
  return [ino, S_IFREG | policy.fileMode, 1, policy.uid, policy.gid, meta.size, meta.updatedMs];
}

/** The file type bits of `entry`, as a listing's d_type shows them. */
export function typeOf(entry: Entry): number {
  if (entry.kind === 'dir') return S_IFDIR;
  return entry.meta.symlinkTarget !== undefined ? S_IFLNK : S_IFREG;
}
