import { crc32c as portableCrc32c } from '@node-rs/crc32';
import { optionalAddon } from './native-addon.js';

type Crc32c = (data: Buffer, crc?: number) => number;

/**
 * The addon's CRC32C (native/crc32c.c: SSE4.2, three interleaved streams; 22 GB/s here against about
 * 4 for @node-rs/crc32, the same values), for the checks JavaScript still makes: a whole object against
 * GCS's CRC32C, a block written to the cache, a block read back on the JavaScript path. Where the addon
 * cannot load (no libfuse3: `gcsmount cache verify` on another machine, say), @node-rs/crc32.
 */
function load(): Crc32c {
  const native = optionalAddon().crc32c;
  return typeof native === 'function' ? (native as Crc32c) : portableCrc32c;
}

export const crc32c: Crc32c = load();

type CopyCrc32c = (source: Buffer, from: number, to: number, target: Buffer, at: number, crc: number) => number;

/**
 * Copies source[from, to) to target[at...] and returns the CRC32C of those bytes continued from `crc`:
 * the addon's memcpy and hash while the bytes are in the cache (a download worker's body chunks, into
 * shared block memory, which V8 copies into word by word). Without the addon, Buffer.copy and crc32c.
 */
function loadCopy(): CopyCrc32c {
  const native = optionalAddon().copyCrc32c;
  if (typeof native === 'function') return native as CopyCrc32c;
  return (source, from, to, target, at, crc) => {
    source.copy(target, at, from, to);
    return crc32c(source.subarray(from, to), crc);
  };
}

export const copyCrc32c: CopyCrc32c = loadCopy();

/** CRC32C's polynomial, reflected. */
const POLY = 0x82f63b78;

function gf2Times(mat: Uint32Array, vec: number): number {
  let sum = 0;
  for (let i = 0; vec !== 0; i++, vec >>>= 1) if (vec & 1) sum ^= mat[i]!;
  return sum >>> 0;
}

function gf2Square(square: Uint32Array, mat: Uint32Array): void {
  for (let n = 0; n < 32; n++) square[n] = gf2Times(mat, mat[n]!);
}

/**
 * The CRC32C of A then B from the CRC32C of A, that of B and B's length (zlib's crc32_combine, over
 * CRC32C's polynomial): blocks hashed on their own give a whole upload's CRC32C without a second pass.
 */
export function crc32cCombine(crcA: number, crcB: number, lengthB: number): number {
  if (lengthB <= 0) return crcA >>> 0;
  const even = new Uint32Array(32);
  const odd = new Uint32Array(32);
  odd[0] = POLY; // the operator for one zero bit
  for (let n = 1, row = 1; n < 32; n++, row = (row << 1) >>> 0) odd[n] = row;
  gf2Square(even, odd); // two zero bits
  gf2Square(odd, even); // four
  let crc = crcA >>> 0;
  let len = lengthB;
  // Zero bytes appended to A, a power of two at a time (the first square gives one byte).
  for (;;) {
    gf2Square(even, odd);
    if (len % 2 === 1) crc = gf2Times(even, crc);
    len = Math.floor(len / 2);
    if (len === 0) break;
    gf2Square(odd, even);
    if (len % 2 === 1) crc = gf2Times(odd, crc);
    len = Math.floor(len / 2);
    if (len === 0) break;
  }
  return (crc ^ crcB) >>> 0;
}
