/**
 * gcsfuse's `--file-cache-include-regex` / `--file-cache-exclude-regex`: which objects the block cache on
 * disk keeps, by `BUCKET/OBJECT` (gcsfuse's form). An object left out is read from GCS as on a mount
 * without a cache dir (the kernel's page cache still keeps it between opens). Exclusion wins over
 * inclusion; an empty pattern is no filter; a pattern matches anywhere in the name unless anchored.
 */

/** A pattern that is not a regular expression: the mount refuses it before starting. */
export class CacheFilterError extends Error {
  override readonly name = 'CacheFilterError';
}

/** Whether the disk cache keeps `objectName` of the mount's bucket. */
export type CacheFilter = (objectName: string) => boolean;

/**
 * gcsfuse's patterns are Go's (RE2). The common RE2-only forms are taken as RE2 means them: flags at the
 * start (`(?i)`, `(?s)`, `(?m)`, as JavaScript's flags) and named groups `(?P<name>...)`. Anything else
 * JavaScript does not read is refused with the reason.
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
  source = source.replace(/\(\?P</g, '(?<');
  try {
    return new RegExp(source, `${flags}u`);
  } catch {
    // Unicode mode refuses escapes RE2 takes (\- outside a class): the lenient mode reads them as RE2 does.
  }
  try {
    return new RegExp(source, flags);
  } catch (err) {
    throw new CacheFilterError(`--${flag}: ${JSON.stringify(pattern)} is not a valid regular expression (${(err as Error).message})`);
  }
}

/** The filter for `bucket`, or null when neither pattern is set (every object is kept). */
export function cacheFilter(bucket: string, include: string, exclude: string): CacheFilter | null {
  if (!include && !exclude) return null;
  const inc = include ? compile('file-cache-include-regex', include) : null;
  const exc = exclude ? compile('file-cache-exclude-regex', exclude) : null;
  return (objectName) => {
    const path = `${bucket}/${objectName}`;
    if (exc?.test(path)) return false;
    return inc ? inc.test(path) : true;
  };
}
