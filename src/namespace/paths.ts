// Mount paths ('/', '/a', '/a/b'): the one way the namespace, the FUSE layer and the prefetcher split and join them.

/** The folder holding `path` ('/' for the root's entries and for the root itself). */
export function parentPath(path: string): string {
  const i = path.lastIndexOf('/');
  return i <= 0 ? '/' : path.slice(0, i);
}

/** The last component of `path`. */
export function baseName(path: string): string {
  return path.slice(path.lastIndexOf('/') + 1);
}

/** The path of `name` in the folder at `parent`. */
export function childPath(parent: string, name: string): string {
  return parent === '/' ? `/${name}` : `${parent}/${name}`;
}
