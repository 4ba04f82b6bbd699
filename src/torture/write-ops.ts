// Seeded sequences of file-system operations for the differential write test: the same sequence is
// applied to a mount and to a local folder, and every answer must agree (see write-runner.ts).
import { seededRandom } from './model-bucket.js';
import { TreeModel } from './write-model.js';

export { runWriteDifferential, WriteDifferential, checkAfterCrash } from './write-runner.js';
export type { WriteDiffOptions, WriteDiffReport, Mismatch, Allowances, CrashModel } from './write-runner.js';

export type OpenFlag = 'rdonly' | 'wronly' | 'rdwr' | 'create' | 'excl' | 'trunc' | 'append';

/** One operation, as fs_op_server.py reads it. Data is (seed, len): the server expands it. */
export type WriteOp =
  | { op: 'open'; h: string; path: string; flags: OpenFlag[] }
  /** At `off` when given (lseek first), else at the handle's position. */
  | { op: 'write'; h: string; off?: number; seed: number; len: number }
  | { op: 'pwrite'; h: string; off: number; seed: number; len: number }
  | { op: 'read'; h: string; off: number; len: number }
  | { op: 'ftruncate'; h: string; size: number }
  | { op: 'truncate'; path: string; size: number }
  | { op: 'fsync' | 'close'; h: string }
  | { op: 'unlink' | 'mkdir' | 'rmdir' | 'stat' | 'listdir' | 'readall'; path: string }
  | { op: 'rename'; src: string; dst: string };

export interface WriteOpsOptions {
  seed: number;
  /** Operations, about: a sequence under way is finished, then whatever is open is closed. */
  count: number;
  /** Generate directory renames (gcsfuse refuses them beyond --rename-dir-limit). Default true. */
  dirRenames?: boolean;
  /** Now and then a write of 24-40 MiB, across a 32 MiB streaming-upload chunk. Default false. */
  bigWrites?: boolean;
  /** Bytes all writes together may carry; beyond it writes are small. Default 192 MiB (512 MiB with bigWrites). */
  maxBytes?: number;
  /**
   * Above this many bytes in the tree the generator truncates and unlinks more and writes less: every
   * close hashes the whole tree on both sides, so its size is what a run costs. Default 24 MiB (96 MiB
   * with bigWrites).
   */
  maxTreeBytes?: number;
  /** Handles open at once. Default 3. */
  maxHandles?: number;
}

const KIB = 1024;
const MIB = 1024 * KIB;
/** Where a write path cuts: resumable-upload granularity, the block size, a streaming-upload chunk. */
const BOUNDARIES = [256 * KIB, 4 * MIB, 32 * MIB];
/** Made first; d3 and d2/s only come and go through mkdir, rmdir and rename. */
const START_DIRS = ['d1', 'd2', 'd1/s'];
const DIR_NAMES = ['d1', 'd2', 'd3', 'd1/s', 'd2/s'];
/** 12 file names over 4 folders: few enough that creates, renames and unlinks keep colliding. */
const FILE_NAMES = ['', 'd1/', 'd2/', 'd1/s/'].flatMap((d) => ['a', 'b', 'c'].map((b) => d + b));

const OPEN_FLAGS: Array<[OpenFlag[], number]> = [
  [['wronly', 'create', 'trunc'], 5],
  [['rdwr', 'create'], 4],
  [['rdwr'], 3],
  [['wronly', 'create', 'append'], 2],
  [['rdwr', 'append'], 1],
  [['rdonly'], 3],
  [['wronly', 'create', 'excl'], 2],
  [['rdwr', 'trunc'], 1],
];

/** The operations for one seed: the same options always give the same list. */
export function generateWriteOps(opts: WriteOpsOptions): WriteOp[] {
  const rand = seededRandom(opts.seed);
  const big = opts.bigWrites ?? false;
  const maxHandles = opts.maxHandles ?? 3;
  const maxTree = opts.maxTreeBytes ?? (big ? 96 : 24) * MIB;
  let bytesLeft = opts.maxBytes ?? (big ? 512 : 192) * MIB;
  const m = new TreeModel();
  const ops: WriteOp[] = [];

  const int = (lo: number, hi: number): number => lo + Math.floor(rand() * (hi - lo + 1));
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
  const weighted = <T>(xs: ReadonlyArray<readonly [T, number]>): T => {
    let r = rand() * xs.reduce((s, [, w]) => s + w, 0);
    for (const [x, w] of xs) if ((r -= w) < 0) return x;
    return xs[xs.length - 1]![0];
  };
  const logUniform = (lo: number, hi: number): number => Math.floor(lo * (hi / lo) ** rand());
  const emit = (op: WriteOp): void => {
    ops.push(op);
    m.apply(op);
  };

  function writeLength(): number {
    const crowded = m.treeBytes() > maxTree;
    let len = weighted<() => number>([
      [() => int(1, 4 * KIB), 30],
      [() => logUniform(KIB, MIB), 50],
      [() => logUniform(MIB, 8 * MIB), crowded ? 0 : 15],
      [() => int(24 * MIB, 40 * MIB), big && !crowded ? 3 : 0],
    ])();
    if (len > bytesLeft) len = Math.min(len, 64 * KIB);
    bytesLeft -= len;
    return len;
  }

  /** Offsets where bugs live: the end, inside, past the end (a hole), either side of a boundary. */
  function offsetIn(size: number): number {
    return weighted<() => number>([
      [() => size, 4],
      [() => int(0, size), 3],
      [() => size + int(1, 2 * MIB), 1],
      [
        () => {
          const b = pick(BOUNDARIES.filter((x) => x <= size + 4 * MIB)) ?? BOUNDARIES[0]!;
          return Math.max(0, b * int(1, Math.max(1, Math.floor((size + b) / b))) + int(-3000, 3000));
        },
        2,
      ],
    ])();
  }

  const writable = (): string[] => [...m.handles].filter(([, h]) => !h.flags.includes('rdonly')).map(([id]) => id);
  /** Mostly names that exist or could be created: an ENOENT now and then is a case, all the time a waste. */
  const anyFile = (): string => {
    const r = rand();
    if (m.files.size && r < 0.6) return pick([...m.files.keys()]);
    const creatable = FILE_NAMES.filter((p) => m.dirs.has(m.parentOf(p)));
    return r < 0.92 && creatable.length ? pick(creatable) : pick(FILE_NAMES);
  };
  const readable = (): string[] => [...m.handles].filter(([, h]) => !h.flags.includes('wronly')).map(([id]) => id);
  const anyDir = (): string => (rand() < 0.5 ? pick([...m.dirs].filter((d) => d !== '')) ?? pick(DIR_NAMES) : pick(DIR_NAMES));

  function openOne(path: string, flags: OpenFlag[]): string {
    const h = m.newHandleId();
    emit({ op: 'open', h, path, flags });
    return h;
  }

  /** A file written front to back in chunks, maybe fsynced part-way and written on, closed, read back. */
  function sequentialFile(): void {
    const path = anyFile();
    const h = openOne(path, ['wronly', 'create', 'trunc']);
    if (!m.handles.has(h)) return;
    const total = writeLength();
    // At most 64 writes: a sequence is one step of a run, not most of it.
    const chunk = Math.max(pick([4 * KIB, 64 * KIB, 1 * MIB, 3 * MIB + 17, total]), Math.ceil(total / 64));
    const syncAt = rand() < 0.3 ? int(0, total) : -1;
    for (let done = 0; done < total; ) {
      const len = Math.min(chunk, total - done);
      emit({ op: 'write', h, seed: int(1, 2 ** 31), len });
      if (syncAt >= done && syncAt < done + len) emit({ op: 'fsync', h });
      done += len;
    }
    emit({ op: 'close', h });
    if (rand() < 0.6) {
      const r = openOne(path, ['rdonly']);
      emit({ op: 'read', h: r, off: 0, len: total + 1 });
      emit({ op: 'close', h: r });
    }
  }

  /** A region written as pieces in shuffled order, on a handle already open. */
  function outOfOrder(h: string): void {
    const hd = m.handles.get(h)!;
    const start = offsetIn(hd.ino.size);
    const pieces = int(2, 6);
    const len = Math.max(pieces, Math.min(writeLength(), 12 * MIB));
    const cuts = [0, len, ...Array.from({ length: pieces - 1 }, () => int(1, len - 1))].sort((a, b) => a - b);
    const parts = cuts.slice(1).map((end, i) => [cuts[i]!, end] as const).filter(([a, b]) => b > a);
    for (let i = parts.length - 1; i > 0; i--) {
      const j = int(0, i);
      [parts[i], parts[j]] = [parts[j]!, parts[i]!];
    }
    for (const [a, b] of parts) emit({ op: 'pwrite', h, off: start + a, seed: int(1, 2 ** 31), len: b - a });
  }

  function oneOp(): void {
    const open = [...m.handles.keys()];
    const w = writable();
    const crowded = m.treeBytes() > maxTree;
    const full = open.length >= maxHandles;
    const choice = weighted<string>([
      ['open', full ? 0 : 14],
      ['sequential', full ? 0 : 4],
      ['write', w.length ? 16 : 0],
      ['pwrite', w.length ? 8 : 0],
      ['outOfOrder', w.length ? 3 : 0],
      ['read', open.length ? 8 : 0],
      ['ftruncate', w.length ? (crowded ? 6 : 3) : 0],
      ['truncate', crowded ? 6 : 3],
      ['fsync', open.length ? 4 : 0],
      ['close', open.length ? (full ? 16 : 9) : 0],
      ['unlink', crowded ? 8 : 4],
      ['renameFile', 5],
      ['renameDir', opts.dirRenames === false ? 0 : 2],
      ['mkdir', 2],
      ['rmdir', 2],
      ['stat', 3],
      ['listdir', 2],
      ['readall', 3],
    ]);
    switch (choice) {
      case 'open':
        openOne(anyFile(), weighted(OPEN_FLAGS));
        return;
      case 'sequential':
        sequentialFile();
        return;
      case 'write': {
        const h = pick(w);
        const hd = m.handles.get(h)!;
        const off = rand() < 0.6 ? undefined : offsetIn(hd.ino.size);
        emit({ op: 'write', h, ...(off === undefined ? {} : { off }), seed: int(1, 2 ** 31), len: writeLength() });
        return;
      }
      case 'pwrite': {
        const h = pick(w);
        emit({ op: 'pwrite', h, off: offsetIn(m.handles.get(h)!.ino.size), seed: int(1, 2 ** 31), len: writeLength() });
        return;
      }
      case 'outOfOrder':
        outOfOrder(pick(w));
        return;
      case 'read': {
        const r = readable();
        const h = r.length && rand() < 0.9 ? pick(r) : pick(open);
        const size = m.handles.get(h)!.ino.size;
        emit({ op: 'read', h, off: rand() < 0.3 ? 0 : int(0, size + 10), len: rand() < 0.3 ? size + 1 : logUniform(1, 8 * MIB) });
        return;
      }
      case 'ftruncate': {
        const h = pick(w);
        emit({ op: 'ftruncate', h, size: truncateSize(m.handles.get(h)!.ino.size, crowded) });
        return;
      }
      case 'truncate': {
        const path = anyFile();
        emit({ op: 'truncate', path, size: truncateSize(m.files.get(path)?.size ?? 0, crowded) });
        return;
      }
      case 'fsync':
      case 'close':
        emit({ op: choice, h: pick(open) });
        return;
      case 'unlink':
        emit({ op: 'unlink', path: rand() < 0.9 ? anyFile() : anyDir() });
        return;
      case 'renameFile': {
        const src = anyFile();
        // mkdir sometimes takes a file's name: without dirRenames, such a folder is only looked at.
        if (opts.dirRenames === false && m.dirs.has(src)) emit({ op: 'stat', path: src });
        else emit({ op: 'rename', src, dst: rand() < 0.9 ? anyFile() : anyDir() });
        return;
      }
      case 'renameDir':
        emit({ op: 'rename', src: anyDir(), dst: rand() < 0.9 ? anyDir() : anyFile() });
        return;
      case 'mkdir':
        emit({ op: 'mkdir', path: rand() < 0.9 ? anyDir() : anyFile() });
        return;
      case 'rmdir':
        emit({ op: 'rmdir', path: anyDir() });
        return;
      case 'stat':
        emit({ op: 'stat', path: rand() < 0.7 ? anyFile() : anyDir() });
        return;
      case 'listdir':
        emit({ op: 'listdir', path: rand() < 0.2 ? '' : anyDir() });
        return;
      case 'readall':
        emit({ op: 'readall', path: anyFile() });
        return;
    }
  }

  function truncateSize(size: number, crowded: boolean): number {
    if (crowded || rand() < 0.3) return rand() < 0.5 ? 0 : int(0, Math.min(size, 64 * KIB));
    return weighted<() => number>([
      [() => int(0, size), 3],
      [() => size + int(1, MIB), 1],
      [() => Math.max(0, pick(BOUNDARIES.slice(0, 2)) + int(-1, 1)), 1],
    ])();
  }

  for (const d of START_DIRS) emit({ op: 'mkdir', path: d });
  // The last sequence may run a few operations past `count`: cutting it would leave its handle unused.
  while (ops.length < opts.count) oneOp();
  // A run ends with nothing open, so its final state is settled on both sides (and in the bucket).
  for (const h of [...m.handles.keys()]) emit({ op: 'close', h });
  return ops;
}
