import { constants } from 'node:fs';
import { constants as osConstants } from 'node:os';
import type { Entry } from '../namespace/entry.js';
import { childPath } from '../namespace/paths.js';
import { MAX_SYMLINK_TARGET, SYMLINK_TARGET_KEY } from '../gcs/symlinks.js';
import type { WriteState } from '../writes/write-state.js';
import { writeErrno } from '../writes/write-error.js';
import type { Writes } from '../writes/writes.js';
import { statFor } from './attributes.js';
import { Errno } from './errno.js';
import { OPEN_FLAGS, SET_ATTR } from './kernel.js';
import type { Answer, OpContext } from './operations.js';

const O_ACCMODE = 3;
const E = osConstants.errno;
/** Errors of the staging disk a writer is told as they are (any other is EIO). */
const STAGING_DISK_CODES: ReadonlySet<string> = new Set(['ENOSPC', 'EDQUOT', 'EFBIG']);

/**
 * Handles of files open for writing (or open while a writer has them) are numbered from here, apart from
 * the read handles' numbers (HandleTable's, below 2^31): a read or a release names its family by its number.
 */
export const WRITE_FH_BASE = 2 ** 32;

interface WriteHandle {
  state: WriteState;
  writable: boolean;
  /** The inode it was opened on: what a GETATTR or SETATTR without a handle names once the path is gone. */
  ino: number;
}

/** Whether an open's flags change the file (write access, or O_TRUNC). */
export function opensForWriting(flags: number): boolean {
  return (flags & O_ACCMODE) !== constants.O_RDONLY || (flags & constants.O_TRUNC) !== 0;
}

/**
 * Files open for writing and the changes to names: CREATE, OPEN (for writing, or of a file a writer has
 * open), WRITE, FLUSH (close: the upload), FSYNC, SETATTR (truncate, mtime), UNLINK, MKDIR, RMDIR,
 * RENAME, MKNOD, SYMLINK. The work is the writes layer's (writes/); this answers the kernel and keeps the inode and
 * handle tables in step with what it did.
 */
export class WriteOps {
  private readonly files = new Map<number, WriteHandle>();
  private next = WRITE_FH_BASE;

  constructor(
    private readonly ctx: OpContext,
    private readonly writes: Writes,
  ) {}

  /**
   * A handle the kernel no longer has (released, or its open interrupted): the state loses it and nobody
   * waits (RELEASE is answered at once; a failed upload was reported at FLUSH and logged by close()).
   */
  private releaseDetached(state: WriteState): void {
    this.writes.release(state).catch((err: unknown) => this.ctx.deps.log.warn({ path: state.path, err: String(err) }, 'closing a file open for writing failed'));
  }

  static isWriteHandle(fh: number): boolean {
    return fh >= WRITE_FH_BASE;
  }

  /**
   * The file open for writing on inode `ino`, found through its handles: for an inode whose name went
   * (unlinked, replaced), whose fstat and futimens come without a handle.
   */
  stateOfInode(ino: number): WriteState | undefined {
    return this.handleOfInode(ino)?.state;
  }

  /** The file behind a handle of ours (an unlinked or replaced one included: it is the handle's, not the path's). */
  stateOfHandle(fh: number): WriteState | undefined {
    return this.files.get(fh)?.state;
  }

  create(a: Answer, parent: number, name: string, flags: number): void {
    const { inodes, deps } = this.ctx;
    const dir = inodes.path(parent);
    if (dir === undefined) return a.error(Errno.ESTALE);
    const path = childPath(dir, name);
    this.writes.entryOf(path).then(
      async (entry) => {
        if (entry && flags & constants.O_EXCL) return a.error(E.EEXIST);
        if (entry?.kind === 'dir') return a.error(Errno.EISDIR);
        const held = entry ? null : await this.writes.holdNewName(path, (flags & constants.O_EXCL) !== 0);
        const state = this.writes.open(path, entry?.kind === 'file' ? entry.meta : (held?.meta ?? null));
        if ((entry || held?.theirs) && flags & constants.O_TRUNC) await this.truncateOpened(state);
        this.ctx.handles.droppedFromKernel(path);
        const ino = inodes.lookedUp(path);
        const fh = this.add(state, true, ino);
        const attr = statFor(ino, { kind: 'file', meta: state.meta() }, deps.attributes);
        const node = inodes.node(ino)!;
        node.cachedGeneration = null;
        node.toldKind = 'file';
        node.toldGeneration = null;
        // No native file: the native path answers only blocks of a generation, and this file has none.
        if (!a.create(attr, deps.timeouts.entrySec, deps.timeouts.attrSec, fh, OPEN_FLAGS.FLUSH)) {
          inodes.forget(ino, 1);
          this.files.delete(fh);
          this.releaseDetached(state);
          return;
        }
        node.entryToldAt = performance.now();
      },
      (err) => this.failed(a, path, err),
    ).catch((err: unknown) => this.failed(a, path, err));
  }

  /** An open for writing, or any open of a file a writer has open (its reads must see the staged bytes). */
  open(a: Answer, ino: number, flags: number): void {
    const { inodes } = this.ctx;
    const path = inodes.path(ino);
    if (path === undefined) return a.error(Errno.ESTALE);
    const writable = opensForWriting(flags);
    this.writes.entryOf(path).then(
      async (entry) => {
        if (!entry) return a.error(Errno.ENOENT);
        if (entry.kind === 'dir') return a.error(Errno.EISDIR);
        const state = this.writes.open(path, entry.meta);
        if (flags & constants.O_TRUNC) await this.truncateOpened(state);
        this.ctx.handles.droppedFromKernel(path);
        const fh = this.add(state, writable, ino);
        const node = inodes.node(ino);
        if (node) node.cachedGeneration = null;
        if (!a.open(fh, writable ? OPEN_FLAGS.FLUSH : 0)) {
          this.files.delete(fh);
          this.releaseDetached(state);
        }
      },
      (err) => this.failed(a, path, err),
    ).catch((err: unknown) => this.failed(a, path, err));
  }

  read(a: Answer, fh: number, pos: number, size: number): void {
    const h = this.files.get(fh);
    if (!h) return a.error(Errno.EBADF);
    h.state.read(pos, size).then(
      async (bytes) => {
        if (bytes) return a.buf(bytes, bytes.length);
        // Nothing written yet: the object's bytes, from the generation the file was opened on.
        const source = h.state.cleanSource;
        if (!source || pos >= source.size) return a.buf(Buffer.alloc(0), 0);
        const out = Buffer.allocUnsafe(Math.min(size, source.size - pos));
        const bs = this.ctx.deps.blocks.blockSize;
        for (let done = 0; done < out.length; ) {
          const at = pos + done;
          const block = await this.ctx.deps.blocks.get(source, Math.floor(at / bs));
          try {
            done += block.bytes.copy(out, done, at % bs, Math.min(block.bytes.length, (at % bs) + out.length - done));
          } finally {
            block.release();
          }
        }
        this.ctx.deps.metrics.inc('fuse_read_bytes', out.length);
        a.buf(out, out.length);
      },
      (err) => this.failed(a, h.state.path, err),
    ).catch((err: unknown) => this.failed(a, h.state.path, err));
  }

  write(a: Answer, fh: number, pos: number, data: Buffer | undefined): void {
    const h = this.files.get(fh);
    if (!h || !h.writable) return a.error(Errno.EBADF);
    if (!data) return a.error(Errno.EIO);
    h.state.write(pos, data).then(
      (n) => a.write(n),
      (err) => this.failed(a, h.state.path, err),
    );
  }

  /** close(2) of a handle: the file is uploaded (if it changed) and its errors reported here, as gcsfuse does. */
  flush(a: Answer, fh: number): void {
    const h = this.files.get(fh);
    if (!h) return a.error(Errno.EBADF);
    if (!h.writable) return a.ok();
    h.state.flush().then(
      () => a.ok(),
      (err) => this.failed(a, h.state.path, err),
    );
  }

  fsync(a: Answer, fh: number): void {
    const h = this.files.get(fh);
    // A read handle's file has nothing of ours to make durable.
    if (!h || !h.writable) return a.ok();
    h.state.sync().then(
      () => a.ok(),
      (err) => this.failed(a, h.state.path, err),
    );
  }

  release(a: Answer, fh: number): void {
    const h = this.files.get(fh);
    this.files.delete(fh);
    a.ok();
    if (h) this.releaseDetached(h.state);
  }

  /** SETATTR: size (truncate) and mtime change the file; mode, owner and atime are accepted and not kept (gcsfuse's rule). */
  setattr(a: Answer, ino: number, fhPlusOne: number, toSet: number, size: number, values: Buffer | undefined): void {
    const { inodes, deps } = this.ctx;
    const path = inodes.path(ino);
    if (path === undefined) return a.error(Errno.ESTALE);
    const mtime = values && values.length >= 40 ? values.readDoubleLE(32) : -1;
    // futimens(2) comes without a handle: on an inode whose name went, the file is its open handles'.
    const handle = fhPlusOne > 0 ? this.files.get(fhPlusOne - 1) : inodes.detached(ino) ? this.handleOfInode(ino) : undefined;
    const work = async (): Promise<Entry | null> => {
      // futimens(2) of a file open only for reading whose name went: nothing of ours to stamp (its
      // object is gone or another file's now), and the name must not be touched: the file's own
      // attributes are the answer. A truncate always comes with a write handle (ftruncate) or a name.
      if (!handle && inodes.detached(ino)) {
        const meta = this.ctx.readMetaOfInode(ino);
        return meta ? { kind: 'file', meta } : null;
      }
      if (toSet & SET_ATTR.SIZE) {
        const open = handle?.state ?? this.writes.stateOf(path);
        if (handle) await handle.state.truncate(size);
        else if (open) {
          // truncate(2) by name: done when it returns, as on a disk, though the file is open here.
          await open.truncate(size);
          await open.flush();
        } else {
          const entry = await this.writes.entryOf(path);
          if (!entry) throw Object.assign(new Error(`${path} does not exist`), { errno: Errno.ENOENT });
          if (entry.kind === 'dir') throw Object.assign(new Error(`${path} is a folder`), { errno: Errno.EISDIR });
          // truncate(2) of a file nobody has open: changed and uploaded now (no close will come).
          const state = this.writes.open(path, entry.meta);
          try {
            await state.truncate(size);
            await state.flush();
          } finally {
            await this.writes.release(state);
          }
        }
      }
      if (toSet & (SET_ATTR.MTIME | SET_ATTR.MTIME_NOW)) {
        const ms = toSet & SET_ATTR.MTIME_NOW || mtime < 0 ? Date.now() : mtime;
        if (handle) handle.state.setMtime(ms);
        else await this.writes.setMtime(path, ms);
      }
      // An open file answers for itself: its name may be another file's by now (unlinked, replaced).
      if (handle) return { kind: 'file', meta: handle.state.meta() };
      return this.writes.entryOf(path);
    };
    work().then(
      (entry) => {
        if (!entry) return a.error(Errno.ENOENT);
        a.attr(statFor(ino, entry, deps.attributes), deps.timeouts.attrSec);
      },
      (err) => this.failed(a, path, err),
    );
  }

  unlink(a: Answer, parent: number, name: string): void {
    this.change(a, parent, name, async (path) => {
      await this.writes.removeFile(path);
      this.forgetPath(path);
    });
  }

  rmdir(a: Answer, parent: number, name: string): void {
    this.change(a, parent, name, async (path) => {
      await this.writes.removeDir(path);
      this.forgetPath(path);
    });
  }

  mkdir(a: Answer, parent: number, name: string): void {
    const { inodes, deps } = this.ctx;
    const dir = inodes.path(parent);
    if (dir === undefined) return a.error(Errno.ESTALE);
    const path = childPath(dir, name);
    this.writes.makeDir(path).then(
      (entry) => {
        const ino = inodes.lookedUp(path);
        this.ctx.told(ino, path, entry);
        if (!a.entry(statFor(ino, entry, deps.attributes), deps.timeouts.entrySec, deps.timeouts.attrSec)) inodes.forget(ino, 1);
        else inodes.node(ino)!.entryToldAt = performance.now();
      },
      (err) => this.failed(a, path, err),
    );
  }

  /** mknod(2): a regular file is an empty object made now (gcsfuse's rule); anything else (a FIFO, a device) is ENOTSUP. */
  mknod(a: Answer, parent: number, name: string, mode: number): void {
    if ((mode & constants.S_IFMT) !== constants.S_IFREG) return a.error(E.ENOTSUP);
    this.makeEmpty(a, parent, name);
  }

  /** symlink(2): an empty object whose metadata holds the target, as gcsfuse makes links. */
  symlink(a: Answer, parent: number, name: string, target: string): void {
    if (Buffer.byteLength(target) > MAX_SYMLINK_TARGET) return a.error(E.ENAMETOOLONG);
    this.makeEmpty(a, parent, name, { [SYMLINK_TARGET_KEY]: target });
  }

  private makeEmpty(a: Answer, parent: number, name: string, metadata?: Record<string, string>): void {
    const { inodes, deps } = this.ctx;
    const dir = inodes.path(parent);
    if (dir === undefined) return a.error(Errno.ESTALE);
    const path = childPath(dir, name);
    this.writes.makeFile(path, metadata).then(
      (entry) => {
        const ino = inodes.lookedUp(path);
        this.ctx.told(ino, path, entry);
        if (!a.entry(statFor(ino, entry, deps.attributes), deps.timeouts.entrySec, deps.timeouts.attrSec)) inodes.forget(ino, 1);
        else inodes.node(ino)!.entryToldAt = performance.now();
      },
      (err) => this.failed(a, path, err),
    );
  }

  rename(a: Answer, parent: number, name: string, newParent: number, newName: string | undefined, flags: number): void {
    const { inodes, handles } = this.ctx;
    const fromDir = inodes.path(parent);
    const toDir = inodes.path(newParent);
    if (fromDir === undefined || toDir === undefined || newName === undefined) return a.error(Errno.ESTALE);
    if (flags & 2) return a.error(E.EINVAL); // RENAME_EXCHANGE: GCS has no atomic swap
    const from = childPath(fromDir, name);
    const to = childPath(toDir, newName);
    if (to === from) return a.ok();
    if (to.startsWith(`${from}/`)) return a.error(E.EINVAL);
    this.writes.rename(from, to, flags).then(
      () => {
        inodes.rename(from, to);
        handles.droppedFromKernel(from);
        handles.droppedFromKernel(to);
        a.ok();
      },
      (err) => this.failed(a, from, err),
    );
  }

  // ---------------------------------------------------------------- inside

  private handleOfInode(ino: number): WriteHandle | undefined {
    for (const h of this.files.values()) if (h.ino === ino) return h;
    return undefined;
  }

  private add(state: WriteState, writable: boolean, ino: number): number {
    const fh = this.next++;
    this.files.set(fh, { state, writable, ino });
    return fh;
  }

  /**
   * O_TRUNC of a file just opened (a handle counted): a refused truncate (ESTALE) fails the open, and
   * the handle it counted goes with it. Left counted, the file never had its last close: the path
   * answered ESTALE to every open until the daemon stopped.
   */
  private async truncateOpened(state: WriteState): Promise<void> {
    try {
      await state.truncate(0);
    } catch (err) {
      this.releaseDetached(state);
      throw err;
    }
  }

  private change(a: Answer, parent: number, name: string, work: (path: string) => Promise<void>): void {
    const dir = this.ctx.inodes.path(parent);
    if (dir === undefined) return a.error(Errno.ESTALE);
    const path = childPath(dir, name);
    work(path).then(
      () => a.ok(),
      (err) => this.failed(a, path, err),
    );
  }

  /** The name is gone: its inode stays the kernel's (open files), but the path names nothing now. */
  private forgetPath(path: string): void {
    this.ctx.inodes.detach(path);
    this.ctx.handles.droppedFromKernel(path);
  }

  private failed(a: Answer, path: string, err: unknown): void {
    const given = (err as { errno?: unknown }).errno;
    const code = (err as { code?: unknown }).code;
    // Our own refusals carry the kernel's errno. Node's fs errors carry libuv's (negative: libfuse turned
    // -28 into ERANGE) and their name in `code`: the staged copy's disk says ENOSPC or EDQUOT as itself.
    const errno = typeof given === 'number' && given > 0 ? given : typeof code === 'string' && STAGING_DISK_CODES.has(code) ? E[code as keyof typeof E] : E[writeErrno(err) as keyof typeof E];
    this.ctx.fail(a, path, err, errno);
  }
}
