import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { copyCrc32c, crc32c, crc32cCombine } from '../src/crc32c.js';

describe('crc32cCombine', () => {
  it('gives the CRC32C of A then B from the two CRCs and B\'s length', () => {
    for (const [a, b] of [[0, 5], [1, 1], [3, 7], [100, 4096], [4 << 20, 4 << 20], [12_345, 999_999], [7, 0]] as const) {
      const A = randomBytes(a);
      const B = randomBytes(b);
      expect(crc32cCombine(crc32c(A), crc32c(B), b)).toBe(crc32c(Buffer.concat([A, B])) >>> 0);
    }
  });

  it('chains over many pieces as one running CRC does', () => {
    const pieces = Array.from({ length: 9 }, (_, i) => randomBytes(1000 * i + 17));
    let combined = 0;
    for (const p of pieces) combined = crc32cCombine(combined, crc32c(p), p.length);
    expect(combined).toBe(crc32c(Buffer.concat(pieces)) >>> 0);
  });
});

describe('copyCrc32c', () => {
  it('copies a window into shared memory and continues a running CRC32C over the bytes copied', () => {
    const target = Buffer.from(new SharedArrayBuffer(3 * 65_536)).fill(0xee);
    const body = randomBytes(150_000);
    let crc = 0;
    let at = 0;
    // Chunks as a socket gives them, the first with bytes before the window (a 200 skipped into).
    for (const [from, to] of [[1_000, 65_536], [65_536, 70_000], [70_000, 150_000]] as const) {
      crc = copyCrc32c(body, from, to, target, at, crc);
      at += to - from;
    }
    expect(target.subarray(0, at).equals(body.subarray(1_000))).toBe(true);
    expect(target[at]).toBe(0xee);
    expect(crc).toBe(crc32c(body.subarray(1_000)) >>> 0);
  });

  it('refuses a range outside either buffer rather than copy past it', () => {
    const target = Buffer.alloc(10);
    expect(() => copyCrc32c(Buffer.alloc(20), 0, 11, target, 0, 0)).toThrow(RangeError);
    expect(() => copyCrc32c(Buffer.alloc(20), 5, 25, target, 0, 0)).toThrow(RangeError);
    expect(() => copyCrc32c(Buffer.alloc(20), 6, 5, target, 0, 0)).toThrow(RangeError);
  });
});
