import { compareNames as compareKeys } from '../name-order.js';
import type { ObjectMeta } from '../gcs/object-client.js';

const DIR = 1;
const HAS_CRC = 2;
/** A file hidden because a directory has its name (the directory is shown). */
const HIDDEN = 4;
/** A symbolic link (its target is in `odd`). */
const SYMLINK = 8;

/** What a compact run cannot hold in its arrays: generations beyond 2^53, odd CRC strings, link targets. Rare. */
interface OddMeta {
  generation: string;
  metageneration: string;
  crc32c: string | null;
  symlinkTarget?: string | null;
}

/** Per entry: 8 size + 8 generation + 8 metageneration + 8 updated + 4 crc + 1 flags + 4 offset. */
const BYTES_PER_ENTRY = 41;
const RUN_OVERHEAD = 400;

function exactNumber(decimal: string): number | null {
  const n = Number(decimal);
  return Number.isSafeInteger(n) && n >= 0 && String(n) === decimal ? n : null;
}

function crcNumber(b64: string): number | null {
  const b = Buffer.from(b64, 'base64');
  return b.length === 4 && b.toString('base64') === b64 ? b.readUInt32BE(0) : null;
}

function crcString(n: number): string {
  const b = Buffer.allocUnsafe(4);
  b.writeUInt32BE(n >>> 0, 0);
  return b.toString('base64');
}

/**
 * A sorted run of directory entries in a compact form: every key (a name, or a name plus '/' for a
 * directory) in one string with their offsets, and the metadata in typed arrays. About 41 bytes plus
 * the name's characters per entry, where an object per entry cost several hundred: a 100,000-entry
 * folder takes about 6 MB and fits the default stat budget.
 */
export class ListingRun {
  private constructor(
    readonly count: number,
    private readonly text: string,
    private readonly offsets: Uint32Array,
    private readonly sizes: Float64Array,
    private readonly generations: Float64Array,
    private readonly metagenerations: Float64Array,
    private readonly updated: Float64Array,
    private readonly crcs: Uint32Array,
    private readonly flags: Uint8Array,
    private readonly odd: Map<number, OddMeta> | null,
  ) {}

  /** Builds a run from entries already in key order (compareKeys), without duplicates. */
  static of(keys: readonly string[], metas: readonly (ObjectMeta | null)[]): ListingRun {
    const n = keys.length;
    const offsets = new Uint32Array(n + 1);
    const sizes = new Float64Array(n);
    const generations = new Float64Array(n);
    const metagenerations = new Float64Array(n);
    const updated = new Float64Array(n);
    const crcs = new Uint32Array(n);
    const flags = new Uint8Array(n);
    let odd: Map<number, OddMeta> | null = null;
    let at = 0;
    for (let i = 0; i < n; i++) {
      offsets[i] = at;
      at += keys[i]!.length;
      const meta = metas[i];
      if (!meta) {
        flags[i] = DIR;
        continue;
      }
      sizes[i] = meta.size;
      updated[i] = meta.updatedMs;
      const gen = exactNumber(meta.generation);
      const metagen = exactNumber(meta.metageneration);
      const crc = meta.crc32c === null ? null : crcNumber(meta.crc32c);
      const link = meta.symlinkTarget !== undefined;
      if (gen === null || metagen === null || (meta.crc32c !== null && crc === null) || link) {
        const o: OddMeta = { generation: meta.generation, metageneration: meta.metageneration, crc32c: meta.crc32c };
        if (link) {
          o.symlinkTarget = meta.symlinkTarget;
          flags[i] = SYMLINK;
        }
        (odd ??= new Map()).set(i, o);
        continue;
      }
      generations[i] = gen;
      metagenerations[i] = metagen;
      if (crc !== null) {
        crcs[i] = crc;
        flags[i] = HAS_CRC;
      }
    }
    offsets[n] = at;
    // One flat string: joined keys are one allocation instead of one string object per name.
    const text = keys.join('');
    return new ListingRun(n, text, offsets, sizes, generations, metagenerations, updated, crcs, flags, odd);
  }

  /** Several runs as one, in key order, each key once (the first run holding it wins). */
  static merge(runs: readonly ListingRun[]): ListingRun {
    const rows: { key: string; run: ListingRun; i: number }[] = [];
    for (const run of runs) for (let i = 0; i < run.count; i++) rows.push({ key: run.key(i), run, i });
    // Stable: equal keys keep the order of `runs`.
    rows.sort((a, b) => compareKeys(a.key, b.key));
    const keys: string[] = [];
    const metas: (ObjectMeta | null)[] = [];
    for (const row of rows) {
      if (keys.length > 0 && keys[keys.length - 1] === row.key) continue;
      keys.push(row.key);
      metas.push(row.run.isDir(row.i) ? null : row.run.meta(row.i, ''));
    }
    return ListingRun.of(keys, metas);
  }

  /** Runs that are already in key order and never share a key, as one. */
  static concat(runs: readonly ListingRun[]): ListingRun {
    const keys: string[] = [];
    const metas: (ObjectMeta | null)[] = [];
    for (const run of runs) {
      for (let i = 0; i < run.count; i++) {
        keys.push(run.key(i));
        metas.push(run.isDir(i) ? null : run.meta(i, ''));
      }
    }
    return ListingRun.of(keys, metas);
  }

  /** Rows [from, to) as a run of their own. */
  slice(from: number, to: number): ListingRun {
    const keys: string[] = [];
    const metas: (ObjectMeta | null)[] = [];
    for (let i = from; i < to; i++) {
      keys.push(this.key(i));
      metas.push(this.isDir(i) ? null : this.meta(i, ''));
    }
    return ListingRun.of(keys, metas);
  }

  get bytes(): number {
    // One-byte strings cost a byte a character; assume two to stay on the safe side of the budget.
    return RUN_OVERHEAD + this.text.length * 2 + this.count * BYTES_PER_ENTRY + (this.odd ? this.odd.size * 200 : 0);
  }

  key(i: number): string {
    return this.text.slice(this.offsets[i]!, this.offsets[i + 1]!);
  }

  get firstKey(): string {
    return this.key(0);
  }

  get lastKey(): string {
    return this.key(this.count - 1);
  }

  isDir(i: number): boolean {
    return (this.flags[i]! & DIR) !== 0;
  }

  isHidden(i: number): boolean {
    return (this.flags[i]! & HIDDEN) !== 0;
  }

  hide(i: number): void {
    this.flags[i]! |= HIDDEN;
    this.ranks = null;
  }

  /** ranks[i]: the visible files among rows before i (ranks[count]: all of them); built on first use. */
  private ranks: Uint32Array | null = null;

  private fileRanks(): Uint32Array {
    if (!this.ranks) {
      const ranks = new Uint32Array(this.count + 1);
      for (let i = 0; i < this.count; i++) ranks[i + 1] = ranks[i]! + (this.isVisibleFile(i) ? 1 : 0);
      this.ranks = ranks;
    }
    return this.ranks;
  }

  isVisibleFile(i: number): boolean {
    return (this.flags[i]! & (DIR | HIDDEN)) === 0;
  }

  /** Visible files among rows before row i. */
  filesBefore(i: number): number {
    return this.fileRanks()[i]!;
  }

  /** The row of the visible file with `rank` files before it in this run (0 <= rank < the run's files). */
  rowOfFile(rank: number): number {
    const ranks = this.fileRanks();
    let lo = 0;
    let hi = this.count - 1;
    // The first row whose rank after it passes `rank`.
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (ranks[mid + 1]! > rank) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  }

  /** Compares entry i's key with `key` without building a string (compareKeys order). */
  private compareAt(i: number, key: string): number {
    const start = this.offsets[i]!;
    const len = this.offsets[i + 1]! - start;
    const n = Math.min(len, key.length);
    for (let j = 0; j < n; j++) {
      let x = this.text.charCodeAt(start + j);
      let y = key.charCodeAt(j);
      if (x === y) continue;
      if (x >= 0xd800) x = x <= 0xdfff ? x + 0x2000 : x - 0x800;
      if (y >= 0xd800) y = y <= 0xdfff ? y + 0x2000 : y - 0x800;
      return x - y;
    }
    return len - key.length;
  }

  /** Index of `key`, or -1: a binary search. */
  indexOf(key: string): number {
    let lo = 0;
    let hi = this.count;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      const c = this.compareAt(mid, key);
      if (c === 0) return mid;
      if (c < 0) lo = mid + 1;
      else hi = mid;
    }
    return -1;
  }

  /** Entry i's generation (without building its metadata). */
  generation(i: number): string {
    const o = this.odd?.get(i);
    return o ? o.generation : String(this.generations[i]!);
  }

  /** Whether entry i is a symbolic link. */
  isSymlink(i: number): boolean {
    return (this.flags[i]! & SYMLINK) !== 0;
  }

  /** Entry i's object metadata; `prefix` is the folder's object prefix, which completes the name. */
  meta(i: number, prefix: string): ObjectMeta {
    const o = this.odd?.get(i);
    const flags = this.flags[i]!;
    const meta: ObjectMeta = {
      name: prefix + this.key(i),
      size: this.sizes[i]!,
      generation: o ? o.generation : String(this.generations[i]!),
      metageneration: o ? o.metageneration : String(this.metagenerations[i]!),
      updatedMs: this.updated[i]!,
      crc32c: o ? o.crc32c : flags & HAS_CRC ? crcString(this.crcs[i]!) : null,
    };
    if (o?.symlinkTarget !== undefined) meta.symlinkTarget = o.symlinkTarget;
    return meta;
  }
}
