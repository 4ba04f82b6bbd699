/**
 * gcsfuse's `--file-cache-include-regex` / `--file-cache-exclude-regex`: which objects the block cache on
 * disk keeps, by `BUCKET/OBJECT` (gcsfuse's form). An object left out is read from GCS as on a mount
 * without a cache dir (the kernel's page cache still keeps it between opens). Exclusion wins over
 * inclusion; an empty pattern is no filter; a pattern matches anywhere in the name unless anchored.
 */

import { LRUCache } from 'lru-cache';

/** Object names whose answer is kept (a name is about 100 bytes: ~2 MB at most). */
const KNOWN_NAMES = 10_000;

/** A pattern that is not a regular expression: the mount refuses it before starting. */
export class CacheFilterError extends Error {
  override readonly name = 'CacheFilterError';
}

/** Whether the disk cache keeps `objectName` of the mount's bucket. */
export type CacheFilter = (objectName: string) => boolean;

/** What JavaScript's Unicode mode lets be escaped as itself; RE2 lets any ASCII punctuation be. */
const JS_SYNTAX = new Set('^$\\.*+?()[]{}|/');

/**
 * An RE2 pattern as a JavaScript one meaning the same: `\A` and `\z` (start and end of the text),
 * escaped punctuation JavaScript's Unicode mode refuses (`\-`, `\#`: the character itself; `\-` kept
 * inside a class, where it is allowed and means the dash), and named groups `(?P<name>...)`. Other RE2
 * forms (`[[:alpha:]]`, `\pL`, `\Q...\E`) are not translated: Unicode mode refuses them, and so does
 * compile(), rather than read them as something else.
 */
function fromRe2(pattern: string): string {
  let out = '';
  let inClass = false;
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === '\\' && i + 1 < pattern.length) {
      const n = pattern[++i]!;
      if (!inClass && n === 'A') out += '(?<![\\s\\S])';
      else if (!inClass && n === 'z') out += '(?![\\s\\S])';
      else if (/[!-\/:-@[-`{-~]/.test(n) && !JS_SYNTAX.has(n) && !(inClass && n === '-')) out += n;
      else out += c + n;
      continue;
    }
    if (c === '(' && !inClass && pattern.startsWith('(?P<', i)) {
      out += '(?<';
      i += 3;
      continue;
    }
    if (c === '[' && !inClass) inClass = true;
    else if (c === ']' && inClass) inClass = false;
    out += c;
  }
  return out;
}

/**
 * gcsfuse's patterns are Go's (RE2), compiled as JavaScript's in Unicode mode after fromRe2; flags at the
 * start (`(?i)`, `(?s)`, `(?m)`) become JavaScript's. A pattern it cannot read is refused with the reason.
 */
function compile(flag: string, pattern: string): RegExp {
  let source = pattern;
  let flags = '';
  const lead = /^\(\?([a-zA-Z]+)\)/.exec(source);
  if (lead) {
    for (const f of lead[1]!) {
      if (!'ims'.includes(f)) throw new CacheFilterError(`--${flag}: flag (?${f}) of ${JSON.stringify(pattern)} is not supported (only i, m and s)`);
      if (!flags.includes(f)) flags += f;
    }
    source = source.slice(lead[0].length);
  }
  try {
    return new RegExp(fromRe2(source), `${flags}u`);
  } catch (err) {
    throw new CacheFilterError(`--${flag}: ${JSON.stringify(pattern)} is not a regular expression gcsmount can read (${(err as Error).message})`);
  }
}

/** The filter for `bucket`, or null when neither pattern is set (every object is kept). */
export function cacheFilter(bucket: string, include: string, exclude: string): CacheFilter | null {
  if (!include && !exclude) return null;
  const inc = include ? compile('file-cache-include-regex', include) : null;
  const exc = exclude ? compile('file-cache-exclude-regex', exclude) : null;
  // Asked at every block a read or prefetch touches: each name is matched once. JavaScript's engine
  // backtracks where RE2 does not, so a pattern such as `^(.*/)*x$` costs more per name than in gcsfuse.
  const known = new LRUCache<string, boolean>({ max: KNOWN_NAMES });
  return (objectName) => {
    const seen = known.get(objectName);
    if (seen !== undefined) return seen;
    const path = `${bucket}/${objectName}`;
    const keep = exc?.test(path) ? false : inc ? inc.test(path) : true;
    known.set(objectName, keep);
    return keep;
  };
}
