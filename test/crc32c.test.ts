import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { crc32c, crc32cCombine } from '../src/crc32c.js';

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
