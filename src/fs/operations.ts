import { constants } from 'node:fs';
import type { FuseOps, FuseStatfs } from 'fuse-native';
import type { BlockSource } from '../blocks/block-source.js';
import { HandleReader, type HandleReaderConfig } from '../blocks/handle-reader.js';
import { isGcsError } from '../gcs/errors.js';
import type { ObjectMeta } from '../gcs/object-client.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import type { Namespace } from '../namespace/namespace.js';
import type { Prefetcher } from '../prefetch/prefetcher.js';
import { statFor, type AttributePolicy } from './attributes.js';
import { Errno, errnoFor } from './errno.js';
import { HandleTable, type ReportedSizesConfig } from './handles.js';

export interface OperationDeps {
  namespace: Namespace;
  blocks: BlockSource;
  attributes: AttributePolicy;
  reader: HandleReaderConfig;
  /** How long, and for how many paths, the sizes told to the kernel are remembered. */
  reportedSizes: ReportedSizesConfig;
  log: Logger;
  metrics: Metrics;
  /** Told of every open, to fetch what the reader will open next; null when prefetch is off. */
  prefetcher?: Prefetcher | null;
}

/**
 * A bucket has no capacity: report a huge constant one, as gcsfuse does (1 PiB free, and inodes to
 * match), so `df` and tools that check for space before writing or copying are happy. fuse-native hands
 * every statfs field to libfuse through a Uint32Array, so each value must fit in 32 bits: 2^40 blocks
 * of 4 KiB arrived as 0. A 1 MiB block size (also the preferred I/O size gcsfuse reports) keeps the
 * count at 2^30.
 */
const STATFS: FuseStatfs = {
  bsize: 2 ** 20,
  frsize: 2 ** 20,
  blocks: 2 ** 30,
  bfree: 2 ** 30,
  bavail: 2 ** 30,
  files: 2 ** 30,
  ffree: 2 ** 30,
  favail: 2 ** 30,
  fsid: 0,
  flag: 1, // ST_RDONLY
  namemax: 255,
};

/** Linux's O_ACCMODE: node:fs does not export it. */
const O_ACCMODE = 3;

const readOnly = (...args: unknown[]): void => (args.at(-1) as (err: number) => void)(Errno.EROFS);

/** FUSE operations for a read-only mount. Every callback is answered exactly once, errors included. */
export function createOperations(deps: OperationDeps): { ops: FuseOps; handles: HandleTable } {
  const { namespace, metrics, log } = deps;
  const handles = new HandleTable(deps.reportedSizes);
  metrics.setGauge('open_files', () => handles.size);

  const fail = (op: string, path: string, err: unknown, errno: number): number => {
    metrics.inc('fuse_errors');
    if (errno !== Errno.ENOENT) log.warn({ op, path, err: err instanceof Error ? err.message : String(err) }, `${op} failed`);
    return errno;
  };

  /**
   * Every file size the kernel is told goes through here: the kernel clamps reads to it for the
   * attribute timeout, so the next open must read the generation it belongs to.
   */
  const fileAttributes = (path: string, meta: ObjectMeta) => {
    handles.reportedToKernel(path, meta);
    return statFor({ kind: 'file', meta }, deps.attributes);
  };

  const ops: FuseOps = {
    statfs: (_path, cb) => cb(0, STATFS),

    getattr: (path, cb) => {
      if (handles.pinned(path)) return cb(0, fileAttributes(path, handles.pinned(path)!));
      namespace.lookup(path).then(
        (entry) => {
          if (!entry) return cb(Errno.ENOENT);
          // A handle opened while the lookup ran pins the path: answer with its generation, not the new one.
          cb(0, entry.kind === 'file' ? fileAttributes(path, handles.pinned(path) ?? entry.meta) : statFor(entry, deps.attributes));
        },
        (err) => cb(fail('getattr', path, err, errnoFor(err))),
      );
    },

    fgetattr: (path, fd, cb) => {
      const reader = handles.get(fd);
      if (!reader) return ops.getattr!(path, cb);
      // An open file keeps showing the generation it pinned.
      cb(0, fileAttributes(path, reader.meta));
    },

    readdir: (path, cb) => {
      namespace.readdir(path).then(
        (listing) => {
          const names = listing.names();
          names.unshift('.', '..');
          cb(0, names);
        },
        (err) => cb(fail('readdir', path, err, errnoFor(err))),
      );
    },

    open: (path, flags, cb) => {
      if ((flags & O_ACCMODE) !== constants.O_RDONLY || flags & constants.O_TRUNC) return cb(Errno.EROFS);
      namespace.lookup(path).then(
        (entry) => {
          if (!entry) return cb(Errno.ENOENT);
          if (entry.kind === 'dir') return cb(Errno.EISDIR);
          const meta = handles.generationFor(path, entry.meta);
          cb(0, handles.add(path, new HandleReader(deps.blocks, meta, deps.reader)));
          deps.prefetcher?.opened(path, meta);
        },
        (err) => cb(fail('open', path, err, errnoFor(err))),
      );
    },

    read: (path, fd, buf, len, pos, cb) => {
      const reader = handles.get(fd);
      if (!reader) return cb(Errno.EBADF);
      // fuse-native detaches `buf` once we answer: fill it before the callback and keep no reference.
      const done = (n: number): void => {
        metrics.inc('fuse_read_bytes', n);
        cb(n);
      };
      const failed = (err: unknown): void => {
        // The pinned generation is gone: this open file cannot go on (it must never mix generations),
        // but the next open should see the object as it is now.
        // What the kernel was told about the path stays as it is: it keeps that size until its attribute
        // timeout, and until then an open must read the generation the size belongs to (or fail).
        if (isGcsError(err, 'NOT_FOUND')) namespace.forget(path);
        cb(fail('read', path, err, Errno.EIO));
      };
      try {
        const n = reader.read(pos, buf.subarray(0, len));
        if (typeof n === 'number') done(n);
        else n.then(done, failed);
      } catch (err) {
        failed(err);
      }
    },

    release: (_path, fd, cb) => {
      handles.get(fd)?.close();
      handles.remove(fd);
      cb(0);
    },

    write: readOnly,
    create: readOnly,
    unlink: readOnly,
    rename: readOnly,
    mkdir: readOnly,
    rmdir: readOnly,
    truncate: readOnly,
    ftruncate: readOnly,
    chmod: readOnly,
    chown: readOnly,
    utimens: readOnly,
    symlink: readOnly,
    link: readOnly,
    setxattr: readOnly,
    removexattr: readOnly,
  };
  return { ops: timed(ops, metrics), handles };
}

/**
 * Every operation timed from the kernel's request to our answer, by name; the first callback argument
 * is the errno (or, for read, the byte count), negative on failure.
 */
function timed(ops: FuseOps, metrics: Metrics): FuseOps {
  const out: Record<string, unknown> = {};
  for (const [name, op] of Object.entries(ops) as [string, (...args: unknown[]) => void][]) {
    out[name] = (...args: unknown[]) => {
      const t0 = performance.now();
      const cb = args[args.length - 1] as (first: number, ...rest: unknown[]) => void;
      args[args.length - 1] = (first: number, ...rest: unknown[]) => {
        metrics.observeOp(name, performance.now() - t0, first < 0);
        cb(first, ...rest);
      };
      op(...args);
    };
  }
  return out as FuseOps;
}
