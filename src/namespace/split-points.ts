import { compareKeys } from './listing.js';

/**
 * Where to cut (cursor, hi) into more parts, from the names of the page just listed. Candidates are, at
 * each position from where the page's names vary back to the start, every character the names use there
 * that sorts after the cursor's; only positions whose character in the cursor is one of those (a digit
 * among digits: a position that varies, not a separator like the '.' of 'c.'). The nearest such position
 * cuts off parts about the size of the page (each a page plus a partial one: two requests for ~1.1
 * pages), so the next one back goes first: 'c.54320' after a page from 'c.53421' gives 'c.6' .. 'c.9'
 * first, then 'c.55' .. 'c.59'; 'c000999' after 'c000000'.. gives 'c01' .. 'c09' (10,000 names each),
 * not 'c001' .. 'c009'. A guess can make an empty part (one request); parts left large are cut again
 * when their pages come back.
 */
export function splitPoints(cursor: string, hi: string | null, sample: readonly string[], want: number, delimited: boolean): string[] {
  const first = sample[0] ?? cursor;
  let q = 0;
  while (q < first.length && q < cursor.length && first.charCodeAt(q) === cursor.charCodeAt(q)) q++;
  q = Math.min(q, cursor.length - 1);
  // The characters of the part where the names vary (a shared 'c.' prefix says nothing about the rest).
  const alphabet = new Set<number>();
  for (const k of sample) for (let i = q; i < k.length; i++) alphabet.add(k.charCodeAt(i));
  const chars = [...alphabet].sort((a, b) => a - b);
  const pointsAt = (p: number): string[] => {
    const base = cursor.slice(0, p);
    const at = cursor.charCodeAt(p);
    const points: string[] = [];
    for (const ch of chars) {
      if (ch <= at) continue;
      // Surrogate halves alone are not keys; leave those folders to paging.
      if (ch >= 0xd800 && ch <= 0xdfff) continue;
      const key = base + String.fromCharCode(ch);
      if (delimited && key.includes('/')) continue;
      if (hi !== null && compareKeys(key, hi) >= 0) break;
      points.push(key);
    }
    return points;
  };
  const levels: string[][] = [];
  for (let p = q; p >= 0; p--) {
    if (p < q && !alphabet.has(cursor.charCodeAt(p))) continue;
    const points = pointsAt(p);
    if (points.length > 0) levels.push(points);
  }
  if (levels.length >= 2) levels.unshift(levels.splice(1, 1)[0]!);
  const out: string[] = [];
  for (const points of levels) {
    for (const key of points) {
      if (out.length >= want) break;
      out.push(key);
    }
  }
  return out.sort(compareKeys);
}
