import type { BlockSource } from '../blocks/block-source.js';
import type { HandleReaderConfig } from '../blocks/handle-reader.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { Entry } from '../namespace/entry.js';
import type { Namespace } from '../namespace/namespace.js';
import type { Prefetcher } from '../prefetch/prefetcher.js';
import type { AttributePolicy } from './attributes.js';
import { nameTooLong } from '../namespace/names.js';
import { Errno } from './errno.js';
import { HandleTable, type ReportedSizesConfig } from './handles.js';
import { InodeTable, type InodeNode } from './inodes.js';
import { KernelCache } from './kernel-cache.js';
import { OP, type Attr, type FuseAddon, type FuseRequest, type NativeFile, type RequestListener } from './kernel.js';
import type { NativeReads } from './native-reads.js';
import { DirOps, type DirListing } from './ops-dirs.js';
import { EntryOps } from './ops-entries.js';
import { ReadOps } from './ops-reads.js';
import { WriteOps } from './ops-writes.js';
import type { Writes } from '../writes/writes.js';
import type { WriteState } from '../writes/write-state.js';

// The op table, by family: ops-entries.ts (lookup, forget, getattr, readlink, statfs), ops-reads.ts
// (open, read, release), ops-dirs.ts (opendir, readdir, readdirplus, releasedir), ops-writes.ts (create,
// write, flush, fsync, setattr, unlink, mkdir, rmdir, rename, mknod, symlink; opens for writing),
// assembled and dispatched here.

export interface KernelTimeouts {
  /** How long the kernel may keep a name -> inode entry, and an inode's attributes. */
  entrySec: number;
  attrSec: number;
  /** How long the kernel may remember that a name does not exist (0: not at all). */
  negativeSec: number;
  /**
   * How long the kernel may serve a folder's listing from its own cache (gcsfuse's
   * --kernel-list-cache-ttl-secs): 0 off, Infinity for ever.
   */
  listCacheMs: number;
}

/** Read replies at least this large are copied into the kernel by a pool thread (Answer.bufThen). */
export const LATER_REPLY_BYTES = 64 * 1024;

export interface OperationDeps {
  fuse: FuseAddon;
  namespace: Namespace;
  blocks: BlockSource;
  attributes: AttributePolicy;
  reader: HandleReaderConfig;
  /** How long, and for how many paths, the sizes told to the kernel are remembered. */
  reportedSizes: ReportedSizesConfig;
  timeouts: KernelTimeouts;
  log: Logger;
  metrics: Metrics;
  /** Told of every open, to fetch what the reader will open next; null when prefetch is off. */
  prefetcher?: Prefetcher | null;
  /** Answers reads of blocks on disk without JavaScript; null without a disk cache. */
  native?: NativeReads | null;
  /** The write side; null on a read-only mount (-o ro), where every change is EROFS. */
  writes?: Writes | null;
}

/**
 * One request's answer, timed from the kernel's request to our answer under the operation's name
 * (what `gcsmount stats` shows). The addon refuses a second answer, and answers EIO for a request
 * dropped unanswered; the handlers still answer every request exactly once, errors included.
 */
export class Answer {
  private readonly t0 = performance.now();
  constructor(
    private readonly fuse: FuseAddon,
    private readonly metrics: Metrics,
    readonly req: FuseRequest,
    readonly op: string,
  ) {}

  private done(failed: boolean): void {
    this.metrics.observeOp(this.op, performance.now() - this.t0, failed);
  }

  error(errno: number): void {
    this.fuse.replyErr(this.req, errno);
    this.done(true);
  }

  /** False when the kernel did not take the entry (the request was interrupted). */
  entry(attr: Attr | null, entrySec: number, attrSec: number): boolean {
    const taken = this.fuse.replyEntry(this.req, attr, entrySec, attrSec) === 0;
    this.done(false);
    return taken;
  }

  attr(attr: Attr, attrSec: number): void {
    this.fuse.replyAttr(this.req, attr, attrSec);
    this.done(false);
  }

  /** False when the kernel did not take the open (the request was interrupted): no release will come. */
  open(fh: number, flags: number, file?: NativeFile): boolean {
    const taken = this.fuse.replyOpen(this.req, fh, flags, file) === 0;
    this.done(false);
    return taken;
  }

  /** False when the kernel did not take it: no FORGET and no RELEASE will come. */
  create(attr: Attr, entrySec: number, attrSec: number, fh: number, flags: number): boolean {
    const taken = this.fuse.replyCreate(this.req, attr, entrySec, attrSec, fh, flags) === 0;
    this.done(false);
    return taken;
  }

  write(count: number): void {
    this.fuse.replyWrite(this.req, count);
    this.done(false);
  }

  buf(data: Buffer, length: number): void {
    this.fuse.replyBuf(this.req, data, length);
    this.done(false);
  }

  /**
   * A read's bytes, which `release` lets go of once the kernel has them. A large reply is copied by a pool
   * thread (the copy of a MiB cost this thread ~0.8 ms, most of a cold chunk file's cost here); a small one
   * at once, where queueing it would cost more than the copy.
   */
  bufThen(data: Buffer, length: number, release: () => void): void {
    if (length < LATER_REPLY_BYTES) {
      try {
        this.buf(data, length);
      } finally {
        release();
      }
      return;
    }
    try {
      this.fuse.replyBufLater(this.req, data, length, () => {
        this.done(false);
        release();
      });
    } catch (err) {
      release();
      throw err;
    }
  }

  dir(d: DirListing, start: number, size: number): void {
    this.fuse.replyDir(this.req, d.names, d.inos, d.types, start, size);
    this.done(false);
  }

  /** How many entries the kernel took (0 when it took no reply: the request was interrupted). */
  dirPlus(names: readonly string[], attrs: Float64Array, start: number, size: number, entrySec: number, attrSec: number): number {
    const sent = this.fuse.replyDirPlus(this.req, names, attrs, start, size, entrySec, attrSec);
    this.done(false);
    return Math.max(0, sent);
  }

  readlink(target: string): void {
    this.fuse.replyReadlink(this.req, target);
    this.done(false);
  }

  statfs(values: number[]): void {
    this.fuse.replyStatfs(this.req, values);
    this.done(false);
  }

  ok(): void {
    this.fuse.replyErr(this.req, 0);
    this.done(false);
  }
}

/**
 * What every family of handlers shares: the mount's dependencies, its open files and inodes, and the
 * two things each family must do the same way (log and answer a failure; record what the kernel was told).
 */
export interface OpContext {
  readonly deps: OperationDeps;
  readonly handles: HandleTable;
  readonly inodes: InodeTable;
  /** The write side (null: a read-only mount). */
  readonly writes: Writes | null;
  /** Its handlers: opens for writing, and reads of handles it holds, go there. */
  writeOps: WriteOps | null;
  /** The file a read handle reads instead of its object, once that went (unlinked, replaced): ReadOps'. */
  orphanOf: (fh: number) => WriteState | undefined;
  /** What read handles open on inode `ino` read: ReadOps'. */
  readMetaOfInode: (ino: number) => ObjectMeta | undefined;
  fail(a: Answer, path: string, err: unknown, errno: number): void;
  /** What is at `path` now: a file open for writing or a local change as this mount made it, else the namespace's answer. */
  entryOf(path: string): Promise<Entry | null>;
  /** Records what the kernel was told about inode `ino` (and for how long it may hold a file's size). */
  told(ino: number, path: string, entry: Entry, node?: InodeNode): void;
}

function createContext(deps: OperationDeps): OpContext {
  const { metrics, log } = deps;
  const handles = new HandleTable(deps.reportedSizes);
  const inodes = new InodeTable();
  const writes = deps.writes ?? null;
  return {
    deps,
    handles,
    inodes,
    writes,
    writeOps: null,
    orphanOf: () => undefined,
    readMetaOfInode: () => undefined,
    entryOf: (path) => (writes ? writes.entryOf(path) : deps.namespace.lookup(path)),
    fail: (a, path, err, errno) => {
      metrics.inc('fuse_errors');
      if (errno !== Errno.ENOENT) log.warn({ op: a.op, path, err: err instanceof Error ? err.message : String(err) }, `${a.op} failed`);
      a.error(errno);
    },
    told: (ino, path, entry, node = inodes.node(ino)) => {
      if (node) {
        node.toldKind = entry.kind;
        node.toldGeneration = entry.kind === 'file' ? entry.meta.generation : null;
      }
      // A file open for writing shows its staged size, which no generation's open may go by.
      if (entry.kind === 'file' && !writes?.stateOf(path)) handles.reportedToKernel(path, entry.meta);
    },
  };
}

/**
 * The handlers of a mount, by request. Each takes the inode the kernel names and answers
 * through its Answer; a write operation is a new OP code in the addon, a handler in its family's file
 * and a case in dispatcher().
 */
export interface Operations {
  onRequest: RequestListener;
  handles: HandleTable;
  inodes: InodeTable;
  /** Invalidates the kernel's caches as the namespace learns of changes; attach() it to the session once mounted. */
  kernelCache: KernelCache;
}

interface OpFamilies {
  entries: EntryOps;
  reads: ReadOps;
  dirs: DirOps;
  writes: WriteOps | null;
}

/** FUSE operations over libfuse3's inode API. */
export function createOperations(deps: OperationDeps): Operations {
  const ctx = createContext(deps);
  const { handles, inodes } = ctx;
  ctx.writeOps = ctx.writes ? new WriteOps(ctx, ctx.writes) : null;
  const families: OpFamilies = { entries: new EntryOps(ctx), reads: new ReadOps(ctx), dirs: new DirOps(ctx), writes: ctx.writeOps };
  if (ctx.writes) {
    const reads = families.reads;
    ctx.orphanOf = (fh) => reads.orphanOf(fh);
    ctx.readMetaOfInode = (ino) => reads.metaOfInode(ino);
    ctx.writes.readers = {
      beforeRemoved: (path, state) => reads.keepBytes(path, state),
      moved: (from, to, source, object) => {
        handles.moved(from, to, source, object);
      },
      uploaded: (path, replaced, object) => {
        for (const fh of handles.moved(path, path, replaced, object)) reads.regenerated(fh, object);
        handles.reportedToKernel(path, object);
      },
      writeOpened: (path) => reads.writeOpened(path),
    };
  }
  deps.metrics.setGauge('open_files', () => handles.size);
  deps.metrics.setGauge('open_dirs', () => families.dirs.openCount);
  deps.metrics.setGauge('kernel_inodes', () => inodes.size - 1);
  const kernelCache = new KernelCache(deps.fuse, inodes, handles, deps.metrics);
  deps.namespace.observe(kernelCache);
  return { onRequest: dispatcher(deps, families, kernelCache), handles, inodes, kernelCache };
}

const WRITE_OPS: ReadonlySet<number> = new Set([OP.CREATE, OP.WRITE, OP.FLUSH, OP.FSYNC, OP.SETATTR, OP.UNLINK, OP.MKDIR, OP.RMDIR, OP.RENAME, OP.MKNOD, OP.SYMLINK]);

/** Operations whose `name` is a component of a path (for RENAME, `name2` is one too; for SYMLINK it is the target). */
const NAMED_OPS: ReadonlySet<number> = new Set([OP.LOOKUP, OP.CREATE, OP.UNLINK, OP.MKDIR, OP.RMDIR, OP.RENAME, OP.MKNOD, OP.SYMLINK]);

function tooLong(name: string | undefined): boolean {
  return name !== undefined && nameTooLong(name);
}

function dispatchWrite(
  writes: WriteOps,
  op: number,
  answer: (name: string) => Answer,
  ino: number,
  x: number,
  y: number,
  z: number,
  name: string | undefined,
  name2: string | undefined,
  data: Buffer | undefined,
): void {
  switch (op) {
    case OP.CREATE:
      return writes.create(answer('create'), ino, name!, x);
    case OP.WRITE:
      return writes.write(answer('write'), x, y, data);
    case OP.FLUSH:
      return writes.flush(answer('flush'), x);
    case OP.FSYNC:
      return writes.fsync(answer('fsync'), x);
    case OP.SETATTR:
      return writes.setattr(answer('setattr'), ino, x, y, z, data);
    case OP.UNLINK:
      return writes.unlink(answer('unlink'), ino, name!);
    case OP.MKDIR:
      return writes.mkdir(answer('mkdir'), ino, name!);
    case OP.RMDIR:
      return writes.rmdir(answer('rmdir'), ino, name!);
    case OP.RENAME:
      return writes.rename(answer('rename'), ino, name!, x, name2, y);
    case OP.MKNOD:
      return writes.mknod(answer('mknod'), ino, name!, x);
    case OP.SYMLINK:
      return writes.symlink(answer('symlink'), ino, name!, name2!);
    default:
      return answer('unknown').error(Errno.ENOSYS);
  }
}

/** Routes each kernel request to its family's handler, with an Answer named after the operation. */
function dispatcher(deps: OperationDeps, { entries, reads, dirs, writes }: OpFamilies, kernelCache: KernelCache): RequestListener {
  const { fuse, metrics, log } = deps;
  return (op, req, ino, x, y, z, name, reason, name2, data) => {
    if (op === OP.FORGET) return entries.forget(ino, x);
    if (op === OP.INVALIDATED) return kernelCache.invalidated(ino);
    // Releases of read handles and folders, answered by the addon (KernelOptions.readHandlesBelow).
    if (!req && op === OP.RELEASE) return reads.released(x);
    if (!req && op === OP.RELEASEDIR) return dirs.released(x);
    if (!req) return;
    try {
      if (NAMED_OPS.has(op) && (tooLong(name) || (op === OP.RENAME && tooLong(name2)))) return fuse.replyErr(req, Errno.ENAMETOOLONG);
      switch (op) {
        case OP.LOOKUP:
          return entries.lookup(new Answer(fuse, metrics, req, 'lookup'), ino, name!);
        case OP.GETATTR:
          return entries.getattr(new Answer(fuse, metrics, req, 'getattr'), ino, x);
        case OP.OPEN:
          return reads.open(new Answer(fuse, metrics, req, 'open'), ino, x);
        case OP.READ:
          return reads.read(new Answer(fuse, metrics, req, 'read'), ino, x, y, z, name, reason);
        case OP.RELEASE:
          return reads.release(new Answer(fuse, metrics, req, 'release'), x);
        case OP.OPENDIR:
          return dirs.opendir(new Answer(fuse, metrics, req, 'opendir'), ino);
        case OP.READDIR:
          return dirs.readdir(new Answer(fuse, metrics, req, 'readdir'), x, y, z);
        case OP.READDIRPLUS:
          return dirs.readdirplus(new Answer(fuse, metrics, req, 'readdirplus'), x, y, z);
        case OP.RELEASEDIR:
          return dirs.releasedir(new Answer(fuse, metrics, req, 'releasedir'), x);
        case OP.STATFS:
          return entries.statfs(new Answer(fuse, metrics, req, 'statfs'));
        case OP.READLINK:
          return entries.readlink(new Answer(fuse, metrics, req, 'readlink'), ino);
        default:
          // close(2) and fsync(2) of a read handle: nothing of ours to send or make durable. Kernels
          // before 5.16 send FLUSH at every close (FOPEN_NOFLUSH is newer): answered EBADF, or EROFS with
          // -o ro, a read-only `with open(...)` raised at its close.
          if ((op === OP.FLUSH || op === OP.FSYNC) && !WriteOps.isWriteHandle(x)) return new Answer(fuse, metrics, req, op === OP.FLUSH ? 'flush' : 'fsync').ok();
          if (!writes) return fuse.replyErr(req, WRITE_OPS.has(op) ? Errno.EROFS : Errno.ENOSYS);
          return dispatchWrite(writes, op, (name) => new Answer(fuse, metrics, req, name), ino, x, y, z, name, name2, data);
      }
    } catch (err) {
      // A handler threw before answering (a bug): the kernel still gets its answer.
      log.error({ op, err: err instanceof Error ? err.message : String(err) }, 'FUSE handler failed');
      try {
        fuse.replyErr(req, Errno.EIO);
      } catch {
        // already answered
      }
    }
  };
}
