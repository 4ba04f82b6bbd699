/** The root directory's inode number, fixed by FUSE. */
export const ROOT_INO = 1;

interface Node {
  ino: number;
  path: string;
  /** How many lookups the kernel holds (each answered lookup adds one; FORGET takes them back). */
  lookups: number;
  /** The generation whose pages the kernel may hold for this inode (set at each open). */
  cachedGeneration: string | null;
  /** When the kernel's cache of this directory's listing was (re)started (ms, performance.now()). */
  listCachedAt: number | null;
}

/**
 * Inode numbers handed to the kernel, by mount path. A path keeps its number for as long as the kernel
 * holds a lookup of it, so every open of a path shares one inode (and one page cache), as the
 * generation pinning in HandleTable expects; the number goes once the kernel has forgotten it all.
 */
export class InodeTable {
  private readonly byIno = new Map<number, Node>();
  private readonly byPath = new Map<string, Node>();
  private next = ROOT_INO + 1;

  constructor() {
    const root: Node = { ino: ROOT_INO, path: '/', lookups: Number.POSITIVE_INFINITY, cachedGeneration: null, listCachedAt: null };
    this.byIno.set(ROOT_INO, root);
    this.byPath.set('/', root);
  }

  /** The mount path of an inode the kernel holds. */
  path(ino: number): string | undefined {
    return this.byIno.get(ino)?.path;
  }

  node(ino: number): Node | undefined {
    return this.byIno.get(ino);
  }

  /** The inode a path already has, if the kernel holds one. */
  peek(path: string): number | undefined {
    return this.byPath.get(path)?.ino;
  }

  /** One more lookup of `path` held by the kernel; its inode number. */
  lookedUp(path: string): number {
    let node = this.byPath.get(path);
    if (!node) {
      node = { ino: this.next++, path, lookups: 0, cachedGeneration: null, listCachedAt: null };
      this.byIno.set(node.ino, node);
      this.byPath.set(path, node);
    }
    node.lookups++;
    return node.ino;
  }

  /** The kernel dropped `count` lookups of `ino`. */
  forget(ino: number, count: number): void {
    const node = this.byIno.get(ino);
    if (!node || ino === ROOT_INO) return;
    node.lookups -= count;
    if (node.lookups > 0) return;
    this.byIno.delete(ino);
    if (this.byPath.get(node.path) === node) this.byPath.delete(node.path);
  }

  get size(): number {
    return this.byIno.size;
  }
}

/** The mount path of `name` in the folder at `parent`. */
export function childPath(parent: string, name: string): string {
  return parent === '/' ? `/${name}` : `${parent}/${name}`;
}
