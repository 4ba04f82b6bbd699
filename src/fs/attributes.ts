import type { FuseStat } from 'fuse-native';
import type { Entry } from '../namespace/entry.js';

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

export function statFor(entry: Entry, policy: AttributePolicy): FuseStat {
  if (entry.kind === 'dir') {
    const t = new Date(entry.mtimeMs ?? policy.mountTimeMs);
    return { mode: S_IFDIR | policy.dirMode, uid: policy.uid, gid: policy.gid, size: 4096, mtime: t, atime: t, ctime: t, nlink: 2 };
  }
  const { size, updatedMs } = entry.meta;
  const t = new Date(updatedMs);
  return { mode: S_IFREG | policy.fileMode, uid: policy.uid, gid: policy.gid, size, mtime: t, atime: t, ctime: t, nlink: 1, blocks: Math.ceil(size / 512) };
}
