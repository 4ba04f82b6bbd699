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

type OpKind =
  | 'open' | 'sequential' | 'write' | 'pwrite' | 'outOfOrder' | 'read' | 'ftruncate' | 'truncate' | 'fsync' | 'close'
  | 'unlink' | 'renameFile' | 'renameDir' | 'renameChain' | 'mkdir' | 'rmdir' | 'stat' | 'listdir' | 'readall';

/** The operations for one seed: the same options always give the same list. */
export function generateWriteOps(opts: WriteOpsOptions): WriteOp[] {
  return new WriteOpGenerator(opts).run();
}

/**
 * One run of the generator. Every choice draws from one seeded stream in a fixed order, so a seed
 * replays a failing run exactly: a change that adds, drops or reorders a draw changes every operation
 * after it.
 */
class WriteOpGenerator {
  private readonly rand: () => number;
  private readonly big: boolean;
  private readonly maxHandles: number;
  private readonly maxTree: number;
  private bytesLeft: number;
  private readonly m = new TreeModel();
  private readonly ops: WriteOp[] = [];

  constructor(private readonly opts: WriteOpsOptions) {
    this.rand = seededRandom(opts.seed);
    this.big = opts.bigWrites ?? false;
    this.maxHandles = opts.maxHandles ?? 3;
    this.maxTree = opts.maxTreeBytes ?? (this.big ? 96 : 24) * MIB;
    this.bytesLeft = opts.maxBytes ?? (this.big ? 512 : 192) * MIB;
  }

  run(): WriteOp[] {
    for (const d of START_DIRS) this.emit({ op: 'mkdir', path: d });
    // The last sequence may run a few operations past `count`: cutting it would leave its handle unused.
    while (this.ops.length < this.opts.count) this.oneOp();
    // A run ends with nothing open, so its final state is settled on both sides (and in the bucket).
    for (const h of [...this.m.handles.keys()]) this.emit({ op: 'close', h });
    return this.ops;
  }

  private int(lo: number, hi: number): number {
    return lo + Math.floor(this.rand() * (hi - lo + 1));
  }
  private pick<T>(xs: readonly T[]): T {
    return xs[Math.floor(this.rand() * xs.length)]!;
  }
  private weighted<T>(xs: ReadonlyArray<readonly [T, number]>): T {
    let r = this.rand() * xs.reduce((s, [, w]) => s + w, 0);
    for (const [x, w] of xs) if ((r -= w) < 0) return x;
    return xs[xs.length - 1]![0];
  }
  private logUniform(lo: number, hi: number): number {
    return Math.floor(lo * (hi / lo) ** this.rand());
  }
  private emit(op: WriteOp): void {
    this.ops.push(op);
    this.m.apply(op);
  }

  private writeLength(): number {
    const crowded = this.m.treeBytes() > this.maxTree;
    let len = this.weighted<() => number>([
      [() => this.int(1, 4 * KIB), 30],
      [() => this.logUniform(KIB, MIB), 50],
      [() => this.logUniform(MIB, 8 * MIB), crowded ? 0 : 15],
      [() => this.int(24 * MIB, 40 * MIB), this.big && !crowded ? 3 : 0],
    ])();
    if (len > this.bytesLeft) len = Math.min(len, 64 * KIB);
    this.bytesLeft -= len;
    return len;
  }

  /** Offsets where bugs live: the end, inside, past the end (a hole), either side of a boundary. */
  private offsetIn(size: number): number {
    return this.weighted<() => number>([
      [() => size, 4],
      [() => this.int(0, size), 3],
      [() => size + this.int(1, 2 * MIB), 1],
      [
        () => {
          const b = this.pick(BOUNDARIES.filter((x) => x <= size + 4 * MIB)) ?? BOUNDARIES[0]!;
          return Math.max(0, b * this.int(1, Math.max(1, Math.floor((size + b) / b))) + this.int(-3000, 3000));
        },
        2,
      ],
    ])();
  }

  private truncateSize(size: number, crowded: boolean): number {
    if (crowded || this.rand() < 0.3) return this.rand() < 0.5 ? 0 : this.int(0, Math.min(size, 64 * KIB));
    return this.weighted<() => number>([
      [() => this.int(0, size), 3],
      [() => size + this.int(1, MIB), 1],
      [() => Math.max(0, this.pick(BOUNDARIES.slice(0, 2)) + this.int(-1, 1)), 1],
    ])();
  }

  private writable(): string[] {
    return [...this.m.handles].filter(([, h]) => !h.flags.includes('rdonly')).map(([id]) => id);
  }
  private readable(): string[] {
    return [...this.m.handles].filter(([, h]) => !h.flags.includes('wronly')).map(([id]) => id);
  }
  /** Mostly names that exist or could be created: an ENOENT now and then is a case, all the time a waste. */
  private anyFile(): string {
    const r = this.rand();
    if (this.m.files.size && r < 0.6) return this.pick([...this.m.files.keys()]);
    const creatable = FILE_NAMES.filter((p) => this.m.dirs.has(this.m.parentOf(p)));
    return r < 0.92 && creatable.length ? this.pick(creatable) : this.pick(FILE_NAMES);
  }
  private anyDir(): string {
    return this.rand() < 0.5 ? this.pick([...this.m.dirs].filter((d) => d !== '')) ?? this.pick(DIR_NAMES) : this.pick(DIR_NAMES);
  }

  private openOne(path: string, flags: OpenFlag[]): string {
    const h = this.m.newHandleId();
    this.emit({ op: 'open', h, path, flags });
    return h;
  }

  /**
   * A file open for writing renamed over another and on again before it is written, then grown past its
   * end (a hole): the replaced object must never show through (a new file took it as its source once).
   */
  private renameChain(): void {
    const h = this.openOne(this.anyFile(), this.pick<OpenFlag[]>([['rdwr', 'create'], ['wronly', 'create', 'trunc']]));
    if (!this.m.handles.has(h)) return;
    // Where the model has the handle's file now (a rename moves its inode to the new name).
    const path = (): string | undefined => {
      const ino = this.m.handles.get(h)?.ino;
      for (const [p, i] of this.m.files) if (i === ino) return p;
      return undefined;
    };
    for (let i = this.int(1, 2); i > 0; i--) {
      const src = path();
      if (src === undefined) break;
      this.emit({ op: 'rename', src, dst: this.anyFile() });
    }
    const size = this.m.handles.get(h)?.ino.size ?? 0;
    if (this.rand() < 0.5) this.emit({ op: 'ftruncate', h, size: size + this.int(1, 64 * KIB) });
    else this.emit({ op: 'pwrite', h, off: size + this.int(1, 64 * KIB), seed: this.int(1, 2 ** 31), len: this.int(1, 4 * KIB) });
    this.emit({ op: 'read', h, off: 0, len: 128 * KIB });
    this.emit({ op: 'close', h });
  }

  /** A file written front to back in chunks, maybe fsynced part-way and written on, closed, read back. */
  private sequentialFile(): void {
    const path = this.anyFile();
    const h = this.openOne(path, ['wronly', 'create', 'trunc']);
    if (!this.m.handles.has(h)) return;
    const total = this.writeLength();
    // At most 64 writes: a sequence is one step of a run, not most of it.
    const chunk = Math.max(this.pick([4 * KIB, 64 * KIB, 1 * MIB, 3 * MIB + 17, total]), Math.ceil(total / 64));
    const syncAt = this.rand() < 0.3 ? this.int(0, total) : -1;
    for (let done = 0; done < total; ) {
      const len = Math.min(chunk, total - done);
      this.emit({ op: 'write', h, seed: this.int(1, 2 ** 31), len });
      if (syncAt >= done && syncAt < done + len) this.emit({ op: 'fsync', h });
      done += len;
    }
    this.emit({ op: 'close', h });
    if (this.rand() < 0.6) {
      const r = this.openOne(path, ['rdonly']);
      this.emit({ op: 'read', h: r, off: 0, len: total + 1 });
      this.emit({ op: 'close', h: r });
    }
  }

  /** A region written as pieces in shuffled order, on a handle already open. */
  private outOfOrder(h: string): void {
    const hd = this.m.handles.get(h)!;
    const start = this.offsetIn(hd.ino.size);
    const pieces = this.int(2, 6);
    const len = Math.max(pieces, Math.min(this.writeLength(), 12 * MIB));
    const cuts = [0, len, ...Array.from({ length: pieces - 1 }, () => this.int(1, len - 1))].sort((a, b) => a - b);
    const parts = cuts.slice(1).map((end, i) => [cuts[i]!, end] as const).filter(([a, b]) => b > a);
    for (let i = parts.length - 1; i > 0; i--) {
      const j = this.int(0, i);
      [parts[i], parts[j]] = [parts[j]!, parts[i]!];
    }
    for (const [a, b] of parts) this.emit({ op: 'pwrite', h, off: start + a, seed: this.int(1, 2 ** 31), len: b - a });
  }

  private chooseKind(open: string[], w: string[], crowded: boolean, full: boolean): OpKind {
    return this.weighted<OpKind>([
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
      ['renameDir', this.opts.dirRenames === false ? 0 : 2],
      ['renameChain', full ? 0 : 1],
      ['mkdir', 2],
      ['rmdir', 2],
      ['stat', 3],
      ['listdir', 2],
      ['readall', 3],
    ]);
  }

  private oneOp(): void {
    const m = this.m;
    const open = [...m.handles.keys()];
    const w = this.writable();
    const crowded = m.treeBytes() > this.maxTree;
    const choice = this.chooseKind(open, w, crowded, open.length >= this.maxHandles);
    switch (choice) {
      case 'open':
        this.openOne(this.anyFile(), this.weighted(OPEN_FLAGS));
        return;
      case 'sequential':
        this.sequentialFile();
        return;
      case 'write': {
        const h = this.pick(w);
        const hd = m.handles.get(h)!;
        const off = this.rand() < 0.6 ? undefined : this.offsetIn(hd.ino.size);
        this.emit({ op: 'write', h, ...(off === undefined ? {} : { off }), seed: this.int(1, 2 ** 31), len: this.writeLength() });
        return;
      }
      case 'pwrite': {
        const h = this.pick(w);
        this.emit({ op: 'pwrite', h, off: this.offsetIn(m.handles.get(h)!.ino.size), seed: this.int(1, 2 ** 31), len: this.writeLength() });
        return;
      }
      case 'outOfOrder':
        this.outOfOrder(this.pick(w));
        return;
      case 'read': {
        const r = this.readable();
        const h = r.length && this.rand() < 0.9 ? this.pick(r) : this.pick(open);
        const size = m.handles.get(h)!.ino.size;
        this.emit({ op: 'read', h, off: this.rand() < 0.3 ? 0 : this.int(0, size + 10), len: this.rand() < 0.3 ? size + 1 : this.logUniform(1, 8 * MIB) });
        return;
      }
      case 'ftruncate': {
        const h = this.pick(w);
        this.emit({ op: 'ftruncate', h, size: this.truncateSize(m.handles.get(h)!.ino.size, crowded) });
        return;
      }
      case 'truncate': {
        const path = this.anyFile();
        this.emit({ op: 'truncate', path, size: this.truncateSize(m.files.get(path)?.size ?? 0, crowded) });
        return;
      }
      case 'fsync':
      case 'close':
        this.emit({ op: choice, h: this.pick(open) });
        return;
      case 'unlink':
        this.emit({ op: 'unlink', path: this.rand() < 0.9 ? this.anyFile() : this.anyDir() });
        return;
      case 'renameFile': {
        const src = this.anyFile();
        // mkdir sometimes takes a file's name: without dirRenames, such a folder is only looked at.
        if (this.opts.dirRenames === false && m.dirs.has(src)) this.emit({ op: 'stat', path: src });
        else this.emit({ op: 'rename', src, dst: this.rand() < 0.9 ? this.anyFile() : this.anyDir() });
        return;
      }
      case 'renameDir':
        this.emit({ op: 'rename', src: this.anyDir(), dst: this.rand() < 0.9 ? this.anyDir() : this.anyFile() });
        return;
      case 'renameChain':
        this.renameChain();
        return;
      case 'mkdir':
        this.emit({ op: 'mkdir', path: this.rand() < 0.9 ? this.anyDir() : this.anyFile() });
        return;
      case 'rmdir':
        this.emit({ op: 'rmdir', path: this.anyDir() });
        return;
      case 'stat':
        this.emit({ op: 'stat', path: this.rand() < 0.7 ? this.anyFile() : this.anyDir() });
        return;
      case 'listdir':
        this.emit({ op: 'listdir', path: this.rand() < 0.2 ? '' : this.anyDir() });
        return;
      case 'readall':
        this.emit({ op: 'readall', path: this.anyFile() });
        return;
    }
  }
}
