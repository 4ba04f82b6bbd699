/**
 * Object names are arbitrary UTF-8; paths are not. These rules decide which names can appear in the mount.
 * A name that cannot is hidden (and logged once by the caller), never allowed to break a listing.
 */

/** Linux's NAME_MAX, in bytes. */
const NAME_MAX = 255;

export type ComponentProblem = 'empty' | 'dot' | 'too-long' | 'nul';

/** Why one path component (the part between slashes) cannot be shown, or null when it can. */
export function componentProblem(component: string): ComponentProblem | null {
  if (component === '') return 'empty'; // from a//b, a leading '/', or a trailing '/'
  if (component === '.' || component === '..') return 'dot';
  if (component.includes('\0')) return 'nul';
  if (nameTooLong(component)) return 'too-long';
  return null;
}

/**
 * A name the kernel hands us (lookup, create, mkdir, rename's target...) longer than NAME_MAX bytes.
 * Such names are refused (ENAMETOOLONG) where they come in: made, they would be hidden by every later
 * lookup and listing. Each UTF-16 unit is at most 3 UTF-8 bytes, so short names skip the count.
 */
export function nameTooLong(name: string): boolean {
  return name.length * 3 > NAME_MAX && Buffer.byteLength(name, 'utf8') > NAME_MAX;
}

/**
 * Maps between mount paths and object names. With --only-dir the mount root is that prefix of the bucket.
 * Directory prefixes always end in '/', except the bucket root, which is ''.
 */
export class NameMapper {
  readonly rootPrefix: string;

  constructor(onlyDir: string | null) {
    const trimmed = (onlyDir ?? '').replace(/^\/+|\/+$/g, '');
    this.rootPrefix = trimmed ? `${trimmed}/` : '';
  }

  /** '/a/b' -> rootPrefix + 'a/b'; '/' -> rootPrefix without its slash ('' at the bucket root). */
  objectName(path: string): string {
    const rel = path.replace(/^\/+/, '');
    return rel ? this.rootPrefix + rel : this.rootPrefix.replace(/\/$/, '');
  }

  /** The listing prefix for the directory at `path`. */
  dirPrefix(path: string): string {
    const rel = path.replace(/^\/+|\/+$/g, '');
    return rel ? `${this.rootPrefix}${rel}/` : this.rootPrefix;
  }
}
