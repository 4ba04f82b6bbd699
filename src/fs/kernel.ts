import { accessSync, constants } from 'node:fs';
import { requireAddon } from '../native-addon.js';
import { delimiter, join } from 'node:path';

/**
 * The project's N-API addon over libfuse3's low-level API (native/): a receive thread
 * per mount hands each request here, and the handlers answer through the reply functions when ready.
 */

/** A request the kernel waits on; answered exactly once through one of the reply functions. */
export type FuseRequest = { readonly __fuseRequest: unique symbol };
/** A live session of the addon. */
export type SessionHandle = { readonly __fuseSession: unique symbol };
/** An open file's native side (which of its blocks are on disk), from nativeFile(). */
export type NativeFile = { readonly __nativeFile: unique symbol };

/** [ino, mode, nlink, uid, gid, size, mtimeMs] */
export type Attr = [number, number, number, number, number, number, number];

/** Request codes; keep in step with enum op_code in native/mount.h. */
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
  READDIRPLUS: 11,
  /** Not a request: the kernel has dropped inode `ino`'s attributes and pages (after invalidateInode). */
  INVALIDATED: 12,
  // writes: ops-writes.ts
  CREATE: 13,
  WRITE: 14,
  FLUSH: 15,
  FSYNC: 16,
  SETATTR: 17,
  UNLINK: 18,
  MKDIR: 19,
  RMDIR: 20,
  RENAME: 21,
  MKNOD: 22,
  READLINK: 23,
  SYMLINK: 24,
  EXITED: 100,
} as const;

/**
 * Why the native path gave a read back (the `reason` of an OP.READ); keep in step with enum br_reason in
 * native/block_reads.h. 0: a plain read. MISSING, SHORT and CORRUPT name a damaged block file (`name` is
 * its key); BUSY says nothing about the block (no block memory was free, or its registration was gone),
 * nor does UNAVAILABLE (its file could not be read just now: no descriptor or memory to spare), nor
 * NOT_LANDED (a block it waited for did not reach the disk, or the wait ended: a download failed, the
 * cache had no room, the session ended).
 */
export const FALLBACK = { NONE: 0, MISSING: 1, SHORT: 2, CORRUPT: 3, BUSY: 4, UNAVAILABLE: 5, NOT_LANDED: 6 } as const;

/** Flags for replyOpen and replyCreate. FLUSH: the kernel sends FLUSH at each close(2) (files open for writing). */
export const OPEN_FLAGS = { KEEP_CACHE: 1, CACHE_READDIR: 2, DIRECT_IO: 4, FLUSH: 8 } as const;

/** The kernel's FUSE_SET_ATTR_* bits of a SETATTR (which values it changes). */
export const SET_ATTR = { MODE: 1, UID: 2, GID: 4, SIZE: 8, ATIME: 16, MTIME: 32, ATIME_NOW: 128, MTIME_NOW: 256, CTIME: 1024 } as const;

export interface MountTuning {
  maxBackground: number;
  congestionThreshold: number;
  parallelDirops: boolean;
  /**
   * The addon answers the release of a handle opened read-only whose number is below this (a read
   * handle), and of every folder, then tells the listener without a request, with its next one. 0: none.
   */
  readHandlesBelow: number;
}

/**
 * `name` is the entry a request names (lookup, create, unlink...), or for a read the native path gave
 * back, the key of the damaged block file (`reason`, a FALLBACK code, says what was wrong with it).
 * `name2` is a rename's new name or a symlink's target; `data` a write's bytes, or a setattr's values
 * as five float64s: [mode, uid, gid, atimeMs, mtimeMs] (-1: now).
 */
export type RequestListener = (
  op: number,
  req: FuseRequest | undefined,
  ino: number,
  a: number,
  b: number,
  c: number,
  name: string | undefined,
  reason: number,
  name2?: string,
  data?: Buffer,
) => void;

export interface NativeReadsConfig {
  /** The block folder (blocks-v2): block file KEY is dir/KEY[0:2]/KEY. */
  dir: string;
  blockSize: number;
  /** Blocks held in memory at most (allocated when first needed, freed when idle). */
  slots: number;
  /** Threads reading block files and answering reads. */
  workers: number;
  /** Read block files with O_DIRECT (off, or refused by the file system: through the page cache). */
  direct: boolean;
}

export interface FuseAddon {
  mount(mountPoint: string, args: string[], onRequest: RequestListener, tuning: MountTuning): SessionHandle;
  replyErr(req: FuseRequest, errno: number): void;
  /**
   * attr null: a negative entry, cached by the kernel for entryTimeout. Returns 0, or -errno when the
   * kernel did not take the answer (the request was interrupted): then the lookup does not count.
   */
  replyEntry(req: FuseRequest, attr: Attr | null, entryTimeoutSec: number, attrTimeoutSec: number): number;
  replyAttr(req: FuseRequest, attr: Attr, attrTimeoutSec: number): void;
  /**
   * A file's open passes its native file (then the kernel's handle names it); a folder's does not.
   * Returns 0, or -errno when the kernel did not take the answer (no release will follow).
   */
  replyOpen(req: FuseRequest, fh: number, flags: number, file?: NativeFile): number;
  /** The kernel copies the first `length` bytes straight from the Buffer's memory. */
  replyBuf(req: FuseRequest, data: Buffer, length: number): void;
  /**
   * As replyBuf, the kernel copying on a libuv pool thread instead of this one; `sent` is called here once
   * it has (or refused) the bytes. Until then the Buffer's bytes must stay as they are.
   */
  replyBufLater(req: FuseRequest, data: Buffer, length: number, sent: () => void): void;
  /**
   * Sends entries from index `start` that fit in `size` bytes (entry i has offset i + 1, file type bits
   * types[i]); returns how many.
   */
  replyDir(req: FuseRequest, names: readonly string[], inos: readonly number[], types: readonly number[], start: number, size: number): number;
  /** A symbolic link's target. */
  replyReadlink(req: FuseRequest, target: string): void;
  /**
   * READDIRPLUS: sends the entries that fit in `size` bytes, names[i] at listing offset start + i + 1
   * with attributes attrs[7i .. 7i + 6] (an Attr each). Returns how many were sent, or -errno when the
   * kernel did not take the reply. The kernel holds one lookup of each inode it was sent, but for "."
   * and "..", and entries whose ino is negated: those go with their name, type and inode number only
   * (the kernel keeps the entry and attributes it holds).
   */
  replyDirPlus(req: FuseRequest, names: readonly string[], attrs: Float64Array, start: number, size: number, entryTimeoutSec: number, attrTimeoutSec: number): number;
  /**
   * Queues dropping the kernel's attributes and pages of inode `ino` (OP.INVALIDATED follows once the
   * kernel has); returns at once, false when the session has ended. A thread of the addon's sends it: the
   * kernel may wait in it for requests only the JavaScript thread answers.
   */
  invalidateInode(session: SessionHandle, ino: number): boolean;
  /** Queues dropping the kernel's entry for `name` in the folder `parentIno`; as invalidateInode. */
  invalidateEntry(session: SessionHandle, parentIno: number, name: string): boolean;
  /** [bsize, frsize, blocks, bfree, bavail, files, ffree, favail, fsid, flag, namemax] */
  replyStatfs(req: FuseRequest, values: number[]): void;
  /**
   * A new file's entry and open (replyEntry + replyOpen). Returns 0, or -errno when the kernel did not
   * take it: then no FORGET and no RELEASE will come for it.
   */
  replyCreate(req: FuseRequest, attr: Attr, entryTimeoutSec: number, attrTimeoutSec: number, fh: number, flags: number, file?: NativeFile): number;
  /** `count` bytes of a WRITE were written. */
  replyWrite(req: FuseRequest, count: number): void;


  /** Starts the native read path: once per process, later calls change nothing. False if it cannot run. */
  startNativeReads(cfg: NativeReadsConfig): boolean;
  /** The native side of the open file `fh`, before its open is answered. */
  nativeFile(fh: number, size: number, blockSize: number): NativeFile;
  /** Block first + i of the file is block file keys[i], whose bytes have CRC32C crcs[i]. */
  addBlocks(file: NativeFile, first: number, keys: readonly string[], crcs: readonly number[]): void;
  /**
   * Hands a read to the native path. True: it answers the request; false: a block the read spans is not
   * registered, and the request is still the caller's to answer.
   */
  readNative(req: FuseRequest, ino: number, file: NativeFile, pos: number, size: number): boolean;
  /**
   * Block `block` of the file is block file `key`, still on its way to disk: a read of it waits in the
   * addon (holding no thread) until blockLanded(key). True when registered: blockLanded(key) must follow.
   */
  expectBlock(file: NativeFile, block: number, key: string): boolean;
  /**
   * Block file `key` is on disk with this CRC32C and length (length 0: it will not be): the reads waiting
   * for it are answered natively (or, when it did not land, given back with FALLBACK.NOT_LANDED).
   */
  blockLanded(key: string, crc: number, length: number): void;
  /**
   * Lends `bytes`, the whole and checked block file `key` on its way to disk, when reads in the addon
   * expect it: they are answered from this memory. `landed`: the block is on disk and registered, and
   * `bytes` are what its CRC32C was taken of; lent whether or not a read waits for it. True when lent:
   * `bytes` must then stay unchanged until revokeBlock(key) returns.
   */
  lendBlock(key: string, bytes: Buffer, landed?: boolean): boolean;
  /** Ends a loan: waits for the replies being sent from it; nothing reads the memory afterwards. */
  revokeBlock(key: string): void;
  /** Whether block file `key` is lent and a read has been answered from it. */
  loanServed(key: string): boolean;
  /**
   * Since the process started: [reads, readBytes, fallbacks, blockLoads, blockLoadBytes, blocksInMemory,
   * blockHits, blockHitBytes, readNs, waited, lent] (hits: loaded blocks a read was answered from;
   * waited: reads that waited for a block on its way to disk; lent: such blocks answered from their
   * download's memory, lendBlock).
   */
  nativeStats(): number[];
  /**
   * Loads block file `key` into the native path's memory ahead of any read (a prefetched block), into
   * memory no unread block holds; whether it was queued.
   */
  preloadBlock(key: string, crc: number, length: number): boolean;
  /** Keys of the block files read since the last call (access times); frees block memory idle that long. */
  nativeMaintain(idleSecs: number): string[];
  /** A writer changes the open file's bytes: none of the blocks registered for it answers a read natively now. */
  dropBlocks(file: NativeFile): void;
  /**
   * The open file reads another generation now, of `size` bytes: its registered blocks are dropped, and
   * native reads are clamped to the new size rather than the one it was opened with.
   */
  setFileSize(file: NativeFile, size: number): void;
  /** The native CRC32C (hardware where the CPU has it). */
  crc32c(data: Buffer, crc?: number): number;
  /** Lifts the soft RLIMIT_NOFILE to the hard one; returns [soft, hard] in force after (-1: unlimited). */
  raiseFileLimit(): [number, number];
}

/** The FUSE layer cannot run on this machine: what to install or fix, in one line. */
export class FuseUnavailableError extends Error {
  override readonly name = 'FuseUnavailableError';
}

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
    addon = requireAddon() as FuseAddon;
  } catch (err) {
    const msg = (err as Error).message.split('\n')[0]!;
    if (/libfuse3\.so/.test(msg)) throw new FuseUnavailableError('libfuse3 is not installed: install the fuse3 package (apt-get install fuse3)');
    throw new FuseUnavailableError(`the FUSE addon cannot be loaded (${msg}); run npm ci with libfuse3-dev installed (scripts/setup.sh)`);
  }
  return addon;
}
