import type { ObjectMeta } from '../gcs/object-client.js';
import type { Entry } from '../namespace/entry.js';
import { childPath } from '../namespace/paths.js';
import { MAX_SYMLINK_TARGET } from '../gcs/symlinks.js';
import { statFor } from './attributes.js';
import { Errno, errnoFor } from './errno.js';
import type { Attr } from './kernel.js';
import type { Answer, OpContext } from './operations.js';
import { WriteOps } from './ops-writes.js';

/**
 * A bucket has no capacity: report a huge constant one, as gcsfuse does (1 PiB free, and inodes to
 * match), so `df` and tools that check for space before writing or copying are happy. A 1 MiB block
 * size (also the preferred I/O size gcsfuse reports) keeps the counts small.
 */
const STATFS = [
  2 ** 20, // bsize
  2 ** 20, // frsize
  2 ** 30, // blocks
  2 ** 30, // bfree
  2 ** 30, // bavail
  2 ** 30, // files
  2 ** 30, // ffree
  2 ** 30, // favail
  0, // fsid
  0, // flag: the kernel sets ST_RDONLY itself on a read-only mount
  255, // namemax
];

/** Names and attributes: LOOKUP, FORGET, GETATTR, READLINK and STATFS. */
export class EntryOps {
  constructor(private readonly ctx: OpContext) {}

  lookup(a: Answer, parent: number, name: string): void {
    const { inodes, handles, deps } = this.ctx;
    const { timeouts } = deps;
    const dir = inodes.path(parent);
    if (dir === undefined) return a.error(Errno.ESTALE);
    const path = childPath(dir, name);
    const answer = (entry: Entry | null): void => {
      if (!entry) {
        if (timeouts.negativeSec > 0) a.entry(null, timeouts.negativeSec, 0);
        else a.error(Errno.ENOENT);
        return;
      }
      const ino = inodes.lookedUp(path);
      // A handle opened while the lookup ran pins the path: answer with its generation, not the new one.
      const attr = this.shown(ino, path, entry);
      // An interrupted lookup the kernel no longer waited for holds no count: no FORGET will come for it.
      if (!a.entry(attr, timeouts.entrySec, timeouts.attrSec)) inodes.forget(ino, 1);
      else inodes.node(ino)!.entryToldAt = performance.now();
    };
    const writes = this.ctx.writes;
    const written = writes?.stateOf(path);
    if (written) return answer({ kind: 'file', meta: written.meta() });
    const pinned = handles.pinned(path);
    if (pinned) return answer({ kind: 'file', meta: pinned });
    this.ctx.entryOf(path).then(answer, (err) => this.ctx.fail(a, path, err, errnoFor(err)));
  }

  /** The kernel gives back `count` lookups of inode `ino` (FORGET takes no answer). */
  forget(ino: number, count: number): void {
    this.ctx.inodes.forget(ino, count);
  }

  getattr(a: Answer, ino: number, fhPlusOne: number): void {
    const { inodes, handles, deps } = this.ctx;
    const path = inodes.path(ino);
    if (path === undefined) return a.error(Errno.ESTALE);
    // A file open for writing shows its staged size and mtime; an fstat, its handle's file's.
    const fh = fhPlusOne - 1;
    const ofHandle = fhPlusOne > 0 ? (WriteOps.isWriteHandle(fh) ? this.ctx.writeOps?.stateOfHandle(fh) : this.ctx.orphanOf(fh)) : undefined;
    // fstat(2) comes without a handle: an inode whose name went (unlinked, replaced) is what its open
    // handles have, never what the path names now (nothing: ENOENT; or another file).
    const detached = inodes.detached(ino);
    const written = ofHandle ?? (detached ? this.ctx.writeOps?.stateOfInode(ino) : this.ctx.writes?.stateOf(path));
    if (written) return a.attr(statFor(ino, { kind: 'file', meta: written.meta() }, deps.attributes), deps.timeouts.attrSec);
    // An open file keeps showing the generation it pinned.
    const reader = fhPlusOne > 0 ? handles.get(fhPlusOne - 1) : undefined;
    if (reader) return a.attr(this.fileAttributes(ino, path, reader.meta), deps.timeouts.attrSec);
    if (detached) {
      const meta = this.ctx.readMetaOfInode(ino);
      return meta ? a.attr(statFor(ino, { kind: 'file', meta }, deps.attributes), deps.timeouts.attrSec) : a.error(Errno.ENOENT);
    }
    const pinned = handles.pinned(path);
    if (pinned) return a.attr(this.fileAttributes(ino, path, pinned), deps.timeouts.attrSec);
    this.attributesOf(ino, path).then(
      (attr) => (attr ? a.attr(attr, deps.timeouts.attrSec) : a.error(Errno.ENOENT)),
      (err) => this.ctx.fail(a, path, err, errnoFor(err)),
    );
  }

  /**
   * A symbolic link's target: from its metadata, or for a link of the standard form, its object's
   * bytes (read once per READLINK; the kernel asks at each path walk through the link).
   */
  readlink(a: Answer, ino: number): void {
    const { inodes } = this.ctx;
    const path = inodes.path(ino);
    if (path === undefined) return a.error(Errno.ESTALE);
    this.ctx
      .entryOf(path)
      .then(async (entry) => {
        if (!entry) return a.error(Errno.ENOENT);
        if (entry.kind !== 'file' || entry.meta.symlinkTarget === undefined) return a.error(Errno.EINVAL);
        const { meta } = entry;
        if (meta.size > MAX_SYMLINK_TARGET && meta.symlinkTarget === null) return a.error(Errno.ENAMETOOLONG);
        const target = meta.symlinkTarget ?? (await this.bytesOf(meta));
        if (Buffer.byteLength(target) > MAX_SYMLINK_TARGET) return a.error(Errno.ENAMETOOLONG);
        a.readlink(target);
      })
      .catch((err) => this.ctx.fail(a, path, err, errnoFor(err)));
  }

  /** A small object's bytes as text, through the block cache (its first block holds them all). */
  private async bytesOf(meta: ObjectMeta): Promise<string> {
    if (meta.size === 0) return '';
    const block = await this.ctx.deps.blocks.get(meta, 0);
    try {
      return block.bytes.toString('utf8', 0, meta.size);
    } finally {
      block.release();
    }
  }

  statfs(a: Answer): void {
    a.statfs(STATFS);
  }

  /**
   * Every file size the kernel is told goes through here: the kernel clamps reads to it for the
   * attribute timeout, so the next open must read the generation it belongs to.
   */
  private fileAttributes(ino: number, path: string, meta: ObjectMeta): Attr {
    this.ctx.told(ino, path, { kind: 'file', meta });
    return statFor(ino, { kind: 'file', meta }, this.ctx.deps.attributes);
  }

  /** The attributes the kernel gets for `path` as inode `ino`: an open file's pinned generation wins. */
  private shown(ino: number, path: string, entry: Entry): Attr {
    const written = this.ctx.writes?.stateOf(path);
    if (written) {
      const mine: Entry = { kind: 'file', meta: written.meta() };
      this.ctx.told(ino, path, mine);
      return statFor(ino, mine, this.ctx.deps.attributes);
    }
    const pinned = entry.kind === 'file' ? this.ctx.handles.pinned(path) : undefined;
    if (pinned) return this.fileAttributes(ino, path, pinned);
    this.ctx.told(ino, path, entry);
    return statFor(ino, entry, this.ctx.deps.attributes);
  }

  /** A path's attributes as the kernel must see them: an open file's pinned generation wins. */
  private attributesOf(ino: number, path: string): Promise<Attr | null> {
    return this.ctx.entryOf(path).then((entry) => {
      if (!entry) return null;
      // A handle opened while the lookup ran pins the path: answer with its generation, not the new one.
      return this.shown(ino, path, entry);
    });
  }
}
