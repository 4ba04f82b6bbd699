import type { Entry } from '../namespace/entry.js';
import type { Listing } from '../namespace/listing.js';
import type { Metrics } from '../observe/metrics.js';
import type { HandleTable } from './handles.js';
import { baseName, parentPath } from '../namespace/paths.js';
import { ROOT_INO, type InodeNode, type InodeTable } from './inodes.js';
import type { FuseAddon, SessionHandle } from './kernel.js';

/**
 * Drops what the kernel caches of a path once the daemon learns that the path changed: a listing or a
 * lookup of GCS shows a generation other than the one whose attributes (or pages) the kernel holds, or
 * no such name at all. Without it the kernel keeps showing the old size, the old bytes, or a deleted
 * name until its own timeouts (the metadata TTL) run out, even though the daemon knows better.
 *
 * Only what the kernel does not learn by itself needs this: a reply to the kernel (a lookup, getattr or
 * readdirplus entry) carries the new attributes anyway, and the kernel drops the pages whose mtime or
 * size moved (AUTO_INVAL_DATA). The cases are a folder listed by a lookup of another name (metadata
 * prefetch, a walk), a stat of GCS made for an open, and names gone from a listing.
 *
 * A path with open files is left alone: each open file keeps showing the generation it pinned
 * (HandleTable), and the kernel with it.
 */
export class KernelCache {
  private session: SessionHandle | null = null;

  constructor(
    private readonly fuse: FuseAddon,
    private readonly inodes: InodeTable,
    private readonly handles: HandleTable,
    private readonly metrics: Metrics,
  ) {}

  /** The session to notify, once mounted. */
  attach(session: SessionHandle): void {
    this.session = session;
  }

  /** A complete, fresh listing of the folder at `folder`: every inode the kernel holds in it is checked. */
  listed(folder: string, listing: Listing): void {
    const held = this.inodes.childrenOf(folder);
    if (!held || !this.session) return;
    for (const node of held) this.check(node, listing.get(baseName(node.path)));
  }

  /** A fresh answer for one path from GCS. */
  resolved(path: string, entry: Entry | null): void {
    const node = this.inodes.at(path);
    if (node && this.session) this.check(node, entry);
  }

  /** The kernel has dropped the attributes and pages of `ino` (the addon's OP.INVALIDATED). */
  invalidated(ino: number): void {
    const node = this.inodes.node(ino);
    // Told nothing since: the kernel will ask for the size before it reads, so an open may now read the
    // generation that is current rather than the one last reported.
    if (node && node.toldGeneration === null && !this.handles.pinned(node.path)) this.handles.droppedFromKernel(node.path);
  }

  private check(node: InodeNode, entry: Entry | null): void {
    if (node.ino === ROOT_INO || node.toldKind === null || this.handles.pinned(node.path)) return;
    if (entry === null) {
      // Gone: dropping the inode's attributes is enough (its stat asks getattr, which answers ENOENT,
      // as does an open), and unlike dropping the name it needs no lock of the folder, which the kernel
      // holds for every lookup in it: an entry invalidation waits for all of them, and a lookup stuck on
      // GCS would stall every later lookup and listing of the folder behind it.
      node.toldKind = null;
      node.toldGeneration = null;
      node.cachedGeneration = null;
      if (this.fuse.invalidateInode(this.session!, node.ino)) this.metrics.inc('fuse_invalidated_entries');
      return;
    }
    if (entry.kind !== node.toldKind) {
      // A file became a folder or the other way round: the inode cannot change its type, so the name
      // goes (the next use of it is a LOOKUP). Rare enough to take the folder's lock for.
      const parent = this.inodes.peek(parentPath(node.path));
      if (parent === undefined) return;
      node.toldKind = null;
      node.toldGeneration = null;
      if (this.fuse.invalidateEntry(this.session!, parent, baseName(node.path))) this.metrics.inc('fuse_invalidated_entries');
      return;
    }
    if (entry.kind !== 'file') return;
    const generation = entry.meta.generation;
    const staleAttributes = node.toldGeneration !== null && node.toldGeneration !== generation;
    const stalePages = node.cachedGeneration !== null && node.cachedGeneration !== generation;
    if (!staleAttributes && !stalePages) return;
    node.toldGeneration = null;
    node.cachedGeneration = null;
    if (this.fuse.invalidateInode(this.session!, node.ino)) this.metrics.inc('fuse_invalidated_inodes');
  }
}
