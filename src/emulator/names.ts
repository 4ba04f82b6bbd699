// Object- and bucket-name rules: ordering, validation, and which names a plain file can hold.
import { compareNames } from '../name-order.js';

/** Folder (inside each bucket folder) for objects a file system cannot hold, temp files and uploads. */
export const SIDE_DIR = '.gcs-emulator';

export { compareNames };

/** True when every name that starts with `dirPrefix` sorts strictly before `bound`. */
export function allNamesBelow(dirPrefix: string, bound: string): boolean {
  return compareNames(dirPrefix, bound) < 0 && !bound.startsWith(dirPrefix);
}

/** GCS limits names to 1..1024 bytes of UTF-8. */
export function objectNameError(name: string): string | null {
  if (name.length === 0) return 'Object name must not be empty.';
  if (Buffer.byteLength(name, 'utf8') > 1024) return 'Object name is longer than 1024 bytes.';
  if (!isWellFormed(name)) return 'Object name is not valid UTF-8.';
  return null;
}

/** Bucket names become folder names, so refuse anything that could escape the root. */
export function bucketNameError(bucket: string): string | null {
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,221}$/.test(bucket)) return `Invalid bucket name: '${bucket}'`;
  return null;
}

/**
 * Whether `name` can be the relative path of a regular file under the bucket folder. Names that fail
 * (or that collide with a folder at upload time) live in the side store instead.
 */
export function isFileSystemName(name: string): boolean {
  if (name.startsWith('/') || name.endsWith('/')) return false;
  if (/[\0\n\r]/.test(name)) return false;
  for (const part of name.split('/')) {
    if (part === '' || part === '.' || part === '..') return false;
    if (part.startsWith(SIDE_DIR)) return false;
    if (Buffer.byteLength(part, 'utf8') > 255) return false;
  }
  return true;
}

function isWellFormed(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0xd800 || c > 0xdfff) continue;
    if (c > 0xdbff) return false;
    const d = s.charCodeAt(i + 1);
    if (!(d >= 0xdc00 && d <= 0xdfff)) return false;
    i++;
  }
  return true;
}
