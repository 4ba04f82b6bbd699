import { accessSync, constants } from 'node:fs';
import { createRequire } from 'node:module';
import { delimiter, join } from 'node:path';

/**
 * The project's N-API addon over libfuse3's low-level API (native/gcsmount_fuse.c): a receive thread
 * per mount hands each request here, and the handlers answer through the reply functions when ready.
 */

/** A request the kernel waits on; answered exactly once through one of the reply functions. */
export type FuseRequest = { readonly __fuseRequest: unique symbol };
/** A live session of the addon. */
export type SessionHandle = { readonly __fuseSession: unique symbol };

/** [ino, mode, nlink, uid, gid, size, mtimeMs] */
export type Attr = [number, number, number, number, number, number, number];

/** Request codes; keep in step with enum op_code in native/gcsmount_fuse.c. */
export const OP = {
  LOOKUP: 1,
  FORGET: 2,
  GETATTR: 3,
  OPEN: 4,
  READ: 5,
  RELEASE: 6,
  OPENDIR: 7,
  READDIR: 8,
  RELEASEDIR: 9,
  STATFS: 10,
  EXITED: 100,
} as const;

/** Flags for replyOpen. */
export const OPEN_FLAGS = { KEEP_CACHE: 1, CACHE_READDIR: 2, DIRECT_IO: 4 } as const;

export interface MountTuning {
  maxBackground: number;
  congestionThreshold: number;
  parallelDirops: boolean;
}

export type RequestListener = (op: number, req: FuseRequest | undefined, ino: number, a: number, b: number, c: number, name: string | undefined) => void;

export interface FuseAddon {
  mount(mountPoint: string, args: string[], onRequest: RequestListener, tuning: MountTuning): SessionHandle;
  replyErr(req: FuseRequest, errno: number): void;
  /**
   * attr null: a negative entry, cached by the kernel for entryTimeout. Returns 0, or -errno when the
   * kernel did not take the answer (the request was interrupted): then the lookup does not count.
   */
  replyEntry(req: FuseRequest, attr: Attr | null, entryTimeoutSec: number, attrTimeoutSec: number): number;
  replyAttr(req: FuseRequest, attr: Attr, attrTimeoutSec: number): void;
  replyOpen(req: FuseRequest, fh: number, flags: number): void;
  /** The kernel copies the first `length` bytes straight from the Buffer's memory. */
  replyBuf(req: FuseRequest, data: Buffer, length: number): void;
  /** Sends entries from index `start` that fit in `size` bytes (entry i has offset i + 1); returns how many. */
  replyDir(req: FuseRequest, names: readonly string[], inos: readonly number[], isDir: readonly boolean[], start: number, size: number): number;
  /** [bsize, frsize, blocks, bfree, bavail, files, ffree, favail, fsid, flag, namemax] */
  replyStatfs(req: FuseRequest, values: number[]): void;
}

/** The FUSE layer cannot run on this machine: what to install or fix, in one line. */
export class FuseUnavailableError extends Error {
  override readonly name = 'FuseUnavailableError';
}

const ADDON_PATH = '../../native/build/Release/gcsmount_fuse.node';

let addon: FuseAddon | null = null;

function onPath(cmd: string): boolean {
  for (const dir of (process.env.PATH ?? '/usr/bin:/bin').split(delimiter)) {
    try {
      accessSync(join(dir, cmd), constants.X_OK);
      return true;
    } catch {
      // next
    }
  }
  return false;
}

/**
 * Loads the addon and checks what mounting needs, before anything is mounted: the addon (built by
 * `npm ci`), libfuse3, /dev/fuse, and fusermount3 when not root (root mounts with mount(2) itself).
 */
export function loadFuse(): FuseAddon {
  if (addon) return addon;
  try {
    accessSync('/dev/fuse', constants.R_OK | constants.W_OK);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new FuseUnavailableError(
      code === 'ENOENT'
        ? '/dev/fuse does not exist: load the fuse kernel module (modprobe fuse) or, in a container, pass --device /dev/fuse'
        : `/dev/fuse cannot be opened (${code}): run as root or give this user access to /dev/fuse`,
    );
  }
  if (process.getuid?.() !== 0 && !onPath('fusermount3')) throw new FuseUnavailableError('fusermount3 is not installed: install the fuse3 package (apt-get install fuse3)');
  try {
    addon = createRequire(import.meta.url)(ADDON_PATH) as FuseAddon;
  } catch (err) {
    const msg = (err as Error).message.split('\n')[0]!;
    if (/libfuse3\.so/.test(msg)) throw new FuseUnavailableError('libfuse3 is not installed: install the fuse3 package (apt-get install fuse3)');
    throw new FuseUnavailableError(`the FUSE addon cannot be loaded (${msg}); run npm ci with libfuse3-dev installed (scripts/setup.sh)`);
  }
  return addon;
}
