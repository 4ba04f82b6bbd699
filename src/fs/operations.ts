import { constants } from 'node:fs';
import type { BlockSource } from '../blocks/block-source.js';
import { HandleReader, type HandleReaderConfig } from '../blocks/handle-reader.js';
import { isGcsError } from '../gcs/errors.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { Entry } from '../namespace/entry.js';
import type { Namespace } from '../namespace/namespace.js';
import type { Prefetcher } from '../prefetch/prefetcher.js';
import { statFor, type AttributePolicy } from './attributes.js';
import { Errno, errnoFor } from './errno.js';
import { HandleTable, type ReportedSizesConfig } from './handles.js';
import { InodeTable, ROOT_INO, type InodeNode } from './inodes.js';
import { childPath, parentPath } from '../namespace/paths.js';
import { KernelCache } from './kernel-cache.js';
import { OP, OPEN_FLAGS, type Attr, type FuseAddon, type FuseRequest, type NativeFile, type RequestListener } from './kernel.js';
import type { ListingRun } from '../namespace/listing-run.js';
import type { NativeReads } from './native-reads.js';

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
}

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
  1, // flag: ST_RDONLY
  255, // namemax
];

/** Linux's O_ACCMODE: node:fs does not export it. */
const O_ACCMODE = 3;

/** Read buffers kept for reuse: the kernel copies a reply out before replyBuf returns. */
const POOLED_BUFFER_BYTES = 1024 * 1024;
const MAX_POOLED_BUFFERS = 64;

/**
 * The least a READDIRPLUS entry takes: its header (fuse_entry_out and fuse_dirent, 152 bytes) and a
 * one-byte name, 8-byte aligned. No more entries than size / this fit in a reply.
 */
const MIN_DIRENTPLUS_BYTES = 160;

/**
 * Folders with more entries than this get READDIRPLUS entries bare (names and types, as READDIR): each
 * full entry makes the kernel and the inode table hold an inode until FORGET, so a plain `ls -f` of a
 * Zarr array's 100,000 chunk files cost 1.1-2.0 s instead of 0.2-0.4 and some 50 MiB of the daemon's
 * memory (issue 14 bounds it at 256 MiB). `ls -l` of such a folder looks each name up, as before.
 */
const READDIRPLUS_MAX_ENTRIES = 10_000;

/** File type bits, for an entry sent without attributes (its d_type). */
const S_IFREG = 0o100000;
const S_IFDIR = 0o040000;

/** The folder listing one open directory handle reads, taken when its first readdir asks. */
interface DirHandle {
  ino: number;
  /**
   * Entries 0 and 1 are "." and ".."; entry i's metadata is row rows[i] of runs[i] (null for those two),
   * `prefix` the folder's object prefix.
   */
  listing: { names: string[]; inos: number[]; isDir: boolean[]; runs: (ListingRun | null)[]; rows: number[]; prefix: string } | null;
  pending: Promise<DirHandle['listing']> | null;
}

/**
 * One request's answer, timed from the kernel's request to our answer under the operation's name
 * (what `gcsmount stats` shows). The addon refuses a second answer, and answers EIO for a request
 * dropped unanswered; the handlers below still answer every request exactly once, errors included.
 */
class Answer {
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

  buf(data: Buffer, length: number): void {
    this.fuse.replyBuf(this.req, data, length);
    this.done(false);
  }

  dir(d: NonNullable<DirHandle['listing']>, start: number, size: number): void {
    this.fuse.replyDir(this.req, d.names, d.inos, d.isDir, start, size);
    this.done(false);
  }

  /** How many entries the kernel took (0 when it took no reply: the request was interrupted). */
  dirPlus(names: readonly string[], attrs: Float64Array, start: number, size: number, entrySec: number, attrSec: number): number {
    const sent = this.fuse.replyDirPlus(this.req, names, attrs, start, size, entrySec, attrSec);
    this.done(false);
    return Math.max(0, sent);
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
 * The handlers of a read-only mount, by request. Each takes the inode the kernel names and answers
 * through its Answer; a write operation is a new OP code in the addon and one more handler here.
 */
export interface Operations {
  onRequest: RequestListener;
  handles: HandleTable;
  inodes: InodeTable;
  /** Invalidates the kernel's caches as the namespace learns of changes; attach() it to the session once mounted. */
  kernelCache: KernelCache;
}

/** FUSE operations for a read-only mount over libfuse3's inode API. */
export function createOperations(deps: OperationDeps): Operations {
  const { namespace, metrics, log, fuse, timeouts } = deps;
  const handles = new HandleTable(deps.reportedSizes);
  const inodes = new InodeTable();
  const dirs = new Map<number, DirHandle>();
  /** The native side of each open file (which of its blocks are on disk), by handle. */
  const files = new Map<number, NativeFile>();
  let nextDir = 1;
  const pool: Buffer[] = [];
  metrics.setGauge('open_files', () => handles.size);
  metrics.setGauge('open_dirs', () => dirs.size);
  metrics.setGauge('kernel_inodes', () => inodes.size - 1);
  const kernelCache = new KernelCache(fuse, inodes, handles, metrics);
  namespace.observe(kernelCache);

  const fail = (a: Answer, path: string, err: unknown, errno: number): void => {
    metrics.inc('fuse_errors');
    if (errno !== Errno.ENOENT) log.warn({ op: a.op, path, err: err instanceof Error ? err.message : String(err) }, `${a.op} failed`);
    a.error(errno);
  };

  /**
   * Every file size the kernel is told goes through here: the kernel clamps reads to it for the
   * attribute timeout, so the next open must read the generation it belongs to.
   */
  const fileAttributes = (ino: number, path: string, meta: ObjectMeta): Attr => {
    told(ino, path, { kind: 'file', meta });
    return statFor(ino, { kind: 'file', meta }, deps.attributes);
  };

  /** Records what the kernel was told about inode `ino` (and for how long it may hold a file's size). */
  const told = (ino: number, path: string, entry: Entry, node = inodes.node(ino)): void => {
    if (node) {
      node.toldKind = entry.kind;
      node.toldGeneration = entry.kind === 'file' ? entry.meta.generation : null;
    }
    if (entry.kind === 'file') handles.reportedToKernel(path, entry.meta);
  };

  /** The attributes the kernel gets for `path` as inode `ino`: an open file's pinned generation wins. */
  const shown = (ino: number, path: string, entry: Entry): Attr => {
    const pinned = entry.kind === 'file' ? handles.pinned(path) : undefined;
    if (pinned) return fileAttributes(ino, path, pinned);
    told(ino, path, entry);
    return statFor(ino, entry, deps.attributes);
  };

  /** A path's attributes as the kernel must see them: an open file's pinned generation wins. */
  const attributesOf = (ino: number, path: string) =>
    namespace.lookup(path).then((entry) => {
      if (!entry) return null;
      // A handle opened while the lookup ran pins the path: answer with its generation, not the new one.
      return shown(ino, path, entry);
    });

  const lookup = (a: Answer, parent: number, name: string): void => {
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
      const attr = shown(ino, path, entry);
      // An interrupted lookup the kernel no longer waited for holds no count: no FORGET will come for it.
      if (!a.entry(attr, timeouts.entrySec, timeouts.attrSec)) inodes.forget(ino, 1);
      else inodes.node(ino)!.entryToldAt = performance.now();
    };
    const pinned = handles.pinned(path);
    if (pinned) return answer({ kind: 'file', meta: pinned });
    namespace.lookup(path).then(answer, (err) => fail(a, path, err, errnoFor(err)));
  };

  const getattr = (a: Answer, ino: number, fhPlusOne: number): void => {
    const path = inodes.path(ino);
    if (path === undefined) return a.error(Errno.ESTALE);
    // An open file keeps showing the generation it pinned.
    const reader = fhPlusOne > 0 ? handles.get(fhPlusOne - 1) : undefined;
    if (reader) return a.attr(fileAttributes(ino, path, reader.meta), timeouts.attrSec);
    const pinned = handles.pinned(path);
    if (pinned) return a.attr(fileAttributes(ino, path, pinned), timeouts.attrSec);
    attributesOf(ino, path).then(
      (attr) => (attr ? a.attr(attr, timeouts.attrSec) : a.error(Errno.ENOENT)),
      (err) => fail(a, path, err, errnoFor(err)),
    );
  };

  const open = (a: Answer, ino: number, flags: number): void => {
    const path = inodes.path(ino);
    if (path === undefined) return a.error(Errno.ESTALE);
    if ((flags & O_ACCMODE) !== constants.O_RDONLY || flags & constants.O_TRUNC) return a.error(Errno.EROFS);
    namespace.lookup(path).then(
      (entry) => {
        if (!entry) return a.error(Errno.ENOENT);
        if (entry.kind === 'dir') return a.error(Errno.EISDIR);
        const meta = handles.generationFor(path, entry.meta);
        // A shard whose reads the prefetcher follows (zarr opens it once per inner chunk): every read must
        // reach it at the offset the reader asked, so neither the native side nor the kernel's page cache
        // and readahead (which sends whole aligned megabytes, neighbours included) answers for it, and the
        // handle reads nothing ahead (a block past one inner chunk is a guess the prefetcher makes better).
        const followed = deps.prefetcher?.followsReads(meta) ?? false;
        const reader = new HandleReader(deps.blocks, meta, followed ? { ...deps.reader, maxWindowBlocks: 0 } : deps.reader);
        const fh = handles.add(path, reader);
        // Blocks of this generation already on disk are read natively from the first read on.
        const file = fuse.nativeFile(fh, meta.size, deps.blocks.blockSize);
        if (!followed) deps.native?.register(file, meta, 0);
        files.set(fh, file);
        // The kernel's pages of this inode stay while they belong to the generation this open reads
        // (libfuse 2's auto_cache did this by size and mtime); otherwise the open drops them.
        const node = inodes.node(ino);
        const keep = node !== undefined && node.cachedGeneration === meta.generation;
        if (node) node.cachedGeneration = meta.generation;
        if (!a.open(fh, (keep ? OPEN_FLAGS.KEEP_CACHE : 0) | (followed ? OPEN_FLAGS.DIRECT_IO : 0), file)) {
          reader.close();
          handles.remove(fh);
          files.delete(fh);
          return;
        }
        deps.prefetcher?.opened(path, meta);
      },
      (err) => fail(a, path, err, errnoFor(err)),
    );
  };

  /** `fallback`: the native path gave this read back (a FALLBACK reason), `damagedKey` the block file it found bad. */
  const read = (a: Answer, ino: number, fh: number, pos: number, size: number, damagedKey: string | undefined, fallback: number): void => {
    if (fallback) deps.native?.gaveBack(damagedKey, fallback);
    const reader = handles.get(fh);
    if (!reader) return a.error(Errno.EBADF);
    // Before any cache answers it: a reader of a sharded Zarr array shows where it is only by its reads.
    deps.prefetcher?.read(reader.meta, pos);
    // Within one block that is here already: the kernel copies straight out of the block's memory.
    const view = reader.view(pos, size);
    if (view) {
      metrics.inc('fuse_read_bytes', view.length);
      return a.buf(view, view.length);
    }
    // Blocks on disk: read and checked by a native worker, not here (unless it just gave the read back,
    // or this handle is already fetching them: a cold reader's blocks are held before they arrive).
    const file = files.get(fh);
    if (deps.native && file && !fallback && !reader.holds(pos, size) && !deps.prefetcher?.followsReads(reader.meta)) {
      const until = deps.native.handOff(a.req, ino, file, reader.meta, pos, size);
      if (until > 0) return reader.servedElsewhere(until);
    }
    const failed = (err: unknown): void => {
      const path = inodes.path(ino) ?? '?';
      // The pinned generation is gone: this open file cannot go on (it must never mix generations),
      // but the next open should see the object as it is now.
      // What the kernel was told about the path stays as it is: it keeps that size until its attribute
      // timeout, and until then an open must read the generation the size belongs to (or fail).
      if (isGcsError(err, 'NOT_FOUND')) namespace.forget(path);
      fail(a, path, err, Errno.EIO);
    };
    // Within one block still on its way: answered from the block's memory once it is here, as above.
    let later: ReturnType<typeof reader.viewLater>;
    try {
      later = reader.viewLater(pos, size);
    } catch (err) {
      return failed(err);
    }
    if (later) {
      later.then((v) => {
        try {
          metrics.inc('fuse_read_bytes', v.bytes.length);
          a.buf(v.bytes, v.bytes.length);
        } finally {
          v.release();
        }
      }, failed);
      return;
    }
    const pooled = size <= POOLED_BUFFER_BYTES;
    const buf = pooled ? (pool.pop() ?? Buffer.allocUnsafeSlow(POOLED_BUFFER_BYTES)) : Buffer.allocUnsafeSlow(size);
    const giveBack = (): void => {
      if (pooled && pool.length < MAX_POOLED_BUFFERS) pool.push(buf);
    };
    const done = (n: number): void => {
      metrics.inc('fuse_read_bytes', n);
      a.buf(buf, n);
      giveBack();
    };
    const readFailed = (err: unknown): void => {
      giveBack();
      failed(err);
    };
    try {
      const n = reader.read(pos, buf.subarray(0, size));
      if (typeof n === 'number') done(n);
      else n.then(done, readFailed);
    } catch (err) {
      readFailed(err);
    }
  };

  const release = (a: Answer, fh: number): void => {
    handles.get(fh)?.close();
    handles.remove(fh);
    files.delete(fh);
    a.ok();
  };

  const opendir = (a: Answer, ino: number): void => {
    const path = inodes.path(ino);
    if (path === undefined) return a.error(Errno.ESTALE);
    const fh = nextDir++;
    dirs.set(fh, { ino, listing: null, pending: null });
    let flags = 0;
    const node = inodes.node(ino);
    if (timeouts.listCacheMs > 0 && node) {
      // The kernel keeps the listing in its page cache: reused by the next opens while it is young,
      // dropped (and filled again from us) by the first open after the TTL.
      flags |= OPEN_FLAGS.CACHE_READDIR;
      const now = performance.now();
      if (node.listCachedAt !== null && now - node.listCachedAt < timeouts.listCacheMs) flags |= OPEN_FLAGS.KEEP_CACHE;
      else node.listCachedAt = now;
    }
    // An open the kernel did not take (its connection aborted meanwhile) gets no RELEASEDIR.
    if (!a.open(fh, flags)) dirs.delete(fh);
  };

  const listingOf = (d: DirHandle, path: string): Promise<DirHandle['listing']> => {
    d.pending ??= namespace.readdir(path).then((listing) => {
      const parent = path === '/' ? ROOT_INO : (inodes.peek(parentPath(path)) ?? ROOT_INO);
      const names = ['.', '..'];
      const inos = [d.ino, parent];
      const isDir = [true, true];
      const runs: (ListingRun | null)[] = [null, null];
      const rows = [0, 0];
      listing.forEachRow((name, dir, run, i) => {
        names.push(name);
        // A name not looked up yet has no inode: readdir's number is only a hint (stat asks lookup).
        inos.push(inodes.peek(childPath(path, name)) ?? unlookedInode(path, name));
        isDir.push(dir);
        runs.push(run);
        rows.push(i);
      });
      d.listing = { names, inos, isDir, runs, rows, prefix: listing.prefix };
      return d.listing;
    });
    return d.pending;
  };

  /** Runs `reply` with the open folder's listing (taken on its first readdir), or answers the error. */
  const withListing = (a: Answer, fh: number, reply: (listing: NonNullable<DirHandle['listing']>, path: string) => void): void => {
    const d = dirs.get(fh);
    if (!d) return a.error(Errno.EBADF);
    const path = inodes.path(d.ino);
    if (path === undefined) return a.error(Errno.ESTALE);
    if (d.listing) return reply(d.listing, path);
    listingOf(d, path).then(
      (listing) => reply(listing!, path),
      (err) => {
        d.pending = null;
        fail(a, path, err, errnoFor(err));
      },
    );
  };

  const readdir = (a: Answer, fh: number, offset: number, size: number): void => withListing(a, fh, (l) => a.dir(l, offset, size));

  /**
   * READDIRPLUS: entries with their attributes, from the listing (which has each object's size, mtime
   * and generation), so that a stat after it needs no LOOKUP. The kernel holds one lookup of each entry
   * it takes (FORGET gives them back), "." and ".." excepted; entries that did not fit hold none. A name
   * whose entry the kernel was given within the first half of its timeout, of the same generation, goes
   * bare (no attributes, no lookup): a second `ls` of a large folder then costs the kernel and us
   * next to nothing per name, and a listing in the second half still renews the entries.
   */
  const readdirplus = (a: Answer, fh: number, offset: number, size: number): void =>
    withListing(a, fh, (l, path) => {
      const n = Math.max(0, Math.min(l.names.length - offset, Math.floor(size / MIN_DIRENTPLUS_BYTES)));
      const names = l.names.slice(offset, offset + n);
      const attrs = new Float64Array(7 * n);
      const entries: (Entry | null)[] = [];
      const held: InodeNode[] = [];
      const paths: string[] = [];
      const now = performance.now();
      const freshFor = timeouts.entrySec * 500;
      const huge = l.names.length - 2 > READDIRPLUS_MAX_ENTRIES;
      /** Entry i without attributes (the kernel takes no lookup of it): inode `ino`'s name and type. */
      const bare = (i: number, ino: number, dir: boolean): void => {
        attrs[7 * i] = -ino;
        attrs[7 * i + 1] = dir ? S_IFDIR : S_IFREG;
        entries.push(null);
      };
      for (let i = 0; i < n; i++) {
        const at = offset + i;
        const run = l.runs[at];
        if (!run) {
          attrs.set(statFor(l.inos[at]!, { kind: 'dir', mtimeMs: null }, deps.attributes), 7 * i);
          entries.push(null);
          continue;
        }
        const row = l.rows[at]!;
        const dir = l.isDir[at]!;
        if (huge) {
          bare(i, l.inos[at]!, dir);
          continue;
        }
        const child = childPath(path, names[i]!);
        const pinned = dir ? undefined : handles.pinned(child);
        const node = inodes.at(child);
        if (!pinned && node && node.lookups > 0 && now - node.entryToldAt < freshFor && node.toldKind === (dir ? 'dir' : 'file') && (dir || node.toldGeneration === run.generation(row))) {
          bare(i, node.ino, dir);
          continue;
        }
        const entry: Entry = dir ? { kind: 'dir', mtimeMs: null } : { kind: 'file', meta: pinned ?? run.meta(row, l.prefix) };
        const holder = inodes.hold(child);
        attrs.set(statFor(holder.ino, entry, deps.attributes), 7 * i);
        entries.push(entry);
        held[i] = holder;
        paths[i] = child;
      }
      const sent = a.dirPlus(names, attrs, offset, size, timeouts.entrySec, timeouts.attrSec);
      for (let i = 0; i < n; i++) {
        const entry = entries[i];
        if (!entry) continue;
        const node = held[i]!;
        if (i >= sent) {
          inodes.forget(node.ino, 1); // not sent: the kernel holds no lookup of it
          continue;
        }
        told(node.ino, paths[i]!, entry, node);
        node.entryToldAt = now;
      }
    });

  const releasedir = (a: Answer, fh: number): void => {
    dirs.delete(fh);
    a.ok();
  };

  const onRequest: RequestListener = (op, req, ino, x, y, z, name, reason) => {
    if (op === OP.FORGET) return inodes.forget(ino, x);
    if (op === OP.INVALIDATED) return kernelCache.invalidated(ino);
    if (!req) return;
    try {
      switch (op) {
        case OP.LOOKUP:
          return lookup(new Answer(fuse, metrics, req, 'lookup'), ino, name!);
        case OP.GETATTR:
          return getattr(new Answer(fuse, metrics, req, 'getattr'), ino, x);
        case OP.OPEN:
          return open(new Answer(fuse, metrics, req, 'open'), ino, x);
        case OP.READ:
          return read(new Answer(fuse, metrics, req, 'read'), ino, x, y, z, name, reason);
        case OP.RELEASE:
          return release(new Answer(fuse, metrics, req, 'release'), x);
        case OP.OPENDIR:
          return opendir(new Answer(fuse, metrics, req, 'opendir'), ino);
        case OP.READDIR:
          return readdir(new Answer(fuse, metrics, req, 'readdir'), x, y, z);
        case OP.READDIRPLUS:
          return readdirplus(new Answer(fuse, metrics, req, 'readdirplus'), x, y, z);
        case OP.RELEASEDIR:
          return releasedir(new Answer(fuse, metrics, req, 'releasedir'), x);
        case OP.STATFS:
          return new Answer(fuse, metrics, req, 'statfs').statfs(STATFS);
        default:
          return fuse.replyErr(req, Errno.ENOSYS);
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

  return { onRequest, handles, inodes, kernelCache };
}

/**
 * A stable number for a name readdir shows before anything looked it up, above any inode we hand
 * out (those count up from 2), so `ls -i` is at least consistent between listings.
 */
function unlookedInode(dir: string, name: string): number {
  let h = 0x811c9dc5;
  const s = `${dir}/${name}`;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return 2 ** 40 + (h >>> 0);
}
