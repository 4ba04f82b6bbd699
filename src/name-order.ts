/**
 * GCS orders object names by UTF-8 bytes, which is code-point order. JavaScript's `<` compares UTF-16
 * code units and so sorts U+E000..U+FFFF after astral characters; remapping the surrogates fixes that
 * without allocating a Buffer per comparison. The emulator sorts its listings with it, and the
 * namespace's ranges and binary searches use it, so both agree with GCS's pages, startOffset and endOffset.
 */
export function compareNames(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    let x = a.charCodeAt(i);
    let y = b.charCodeAt(i);
    if (x === y) continue;
    if (x >= 0xd800) x = x <= 0xdfff ? x + 0x2000 : x - 0x800;
    if (y >= 0xd800) y = y <= 0xdfff ? y + 0x2000 : y - 0x800;
    return x - y;
  }
  return a.length - b.length;
}
