import { parentPath } from '../namespace/paths.js';

/** The root directory's inode number, fixed by FUSE. */
export const ROOT_INO = 1;

export interface InodeNode {
  ino: number;
  /** Changes when the kernel renames it. */
  path: string;
  /** How many lookups the kernel holds (each answered lookup adds one; FORGET takes them back). */
  lookups: number;
  /** The generation whose pages the kernel may hold for this inode (set at each open). */
  cachedGeneration: string | null;
  /** When the kernel's cache of this directory's listing was (re)started (ms, performance.now()). */
  listCachedAt: number | null;
  /**
   * The generation of the attributes the kernel was last given for this inode (null: a directory, or
   * none given since the last invalidation): what the kernel may show until its attribute timeout.
   */
  toldGeneration: string | null;
  /** What the kernel was last told this inode is (null: nothing since the last invalidation). */
  toldKind: 'file' | 'dir' | null;
  /** When the kernel was last given this name's entry (a lookup or READDIRPLUS; performance.now()). */
  entryToldAt: number;
}

/**
 * Inode numbers handed to the kernel, by mount path. A path keeps its number for as long as the kernel
 * holds a lookup of it, so every open of a path shares one inode (and one page cache), as the
 * generation pinning in HandleTable expects; the number goes once the kernel has forgotten it all.
 */
export class InodeTable {
  private readonly byIno = new Map<number, InodeNode>();
  private readonly byPath = new Map<string, InodeNode>();
  /** The inodes the kernel holds in each folder, by the folder's path: what a new listing is checked against. */
  private readonly byFolder = new Map<string, Set<InodeNode>>();
  private next = ROOT_INO + 1;

  constructor() {
    const root: InodeNode = { ino: ROOT_INO, path: '/', lookups: Number.POSITIVE_INFINITY, cachedGeneration: null, listCachedAt: null, toldGeneration: null, toldKind: null, entryToldAt: 0 };
    this.byIno.set(ROOT_INO, root);
    this.byPath.set('/', root);
  }

  /** The mount path of an inode the kernel holds. */
  path(ino: number): string | undefined {
    return this.byIno.get(ino)?.path;
  }

  node(ino: number): InodeNode | undefined {
    return this.byIno.get(ino);
  }

  /**
   * Whether inode `ino` lost its name (unlinked, or renamed over) while the kernel keeps it for files
   * open on it: its path names nothing, or another inode, and only its open handles know what it is.
   */
  detached(ino: number): boolean {
    const node = this.byIno.get(ino);
    return node !== undefined && this.byPath.get(node.path) !== node;
  }

  /** The inode of a path the kernel holds. */
  at(path: string): InodeNode | undefined {
    return this.byPath.get(path);
  }

  /** The inode a path already has, if the kernel holds one. */
  peek(path: string): number | undefined {
    return this.byPath.get(path)?.ino;
  }

  /** One more lookup of `path` held by the kernel; its inode number. */
  lookedUp(path: string): number {
    return this.hold(path).ino;
  }

  /** One more lookup of `path` held by the kernel; its inode. */
  hold(path: string): InodeNode {
    let node = this.byPath.get(path);
    if (!node) {
      node = { ino: this.next++, path, lookups: 0, cachedGeneration: null, listCachedAt: null, toldGeneration: null, toldKind: null, entryToldAt: 0 };
      this.byIno.set(node.ino, node);
      this.index(node);
    }
    node.lookups++;
    return node;
  }

  /** The kernel dropped `count` lookups of `ino`. */
  forget(ino: number, count: number): void {
    const node = this.byIno.get(ino);
    if (!node || ino === ROOT_INO) return;
    node.lookups -= count;
    if (node.lookups > 0) return;
    this.byIno.delete(ino);
    this.unindex(node);
  }

  /**
   * `path` no longer names the inode it had (unlinked, or renamed over): the kernel keeps that inode for
   * its open files, and the next lookup of the path gets a new one. Its descendants go with it.
   */
  detach(path: string): void {
    for (const node of this.under(path)) this.unindex(node);
  }

  /** A rename: the inode of `from` (and those below it) now named under `to`, as the kernel has them. */
  rename(from: string, to: string): void {
    this.detach(to);
    for (const node of this.under(from)) {
      this.unindex(node);
      node.path = to + node.path.slice(from.length);
      this.index(node);
    }
  }

  /** The inodes at `path` and below it. */
  private under(path: string, out: InodeNode[] = []): InodeNode[] {
    const node = this.byPath.get(path);
    if (node) out.push(node);
    for (const child of this.byFolder.get(path) ?? []) this.under(child.path, out);
    return out;
  }

  private unindex(node: InodeNode): void {
    if (this.byPath.get(node.path) === node) this.byPath.delete(node.path);
    const folder = parentPath(node.path);
    const set = this.byFolder.get(folder);
    if (set?.delete(node) && set.size === 0) this.byFolder.delete(folder);
  }

  private index(node: InodeNode): void {
    this.byPath.set(node.path, node);
    const folder = parentPath(node.path);
    let set = this.byFolder.get(folder);
    if (!set) this.byFolder.set(folder, (set = new Set()));
    set.add(node);
  }

  /** The inodes the kernel holds in the folder at `path`. */
  childrenOf(path: string): ReadonlySet<InodeNode> | undefined {
    return this.byFolder.get(path);
  }

  get size(): number {
    return this.byIno.size;
  }
}
