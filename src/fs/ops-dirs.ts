import type { Entry } from '../namespace/entry.js';
import type { ListingRun } from '../namespace/listing-run.js';
import { childPath, parentPath } from '../namespace/paths.js';
import { S_IFDIR, S_IFLNK, S_IFREG, statFor, typeOf } from './attributes.js';
import { Errno, errnoFor } from './errno.js';
import { ROOT_INO, type InodeNode } from './inodes.js';
import { OPEN_FLAGS } from './kernel.js';
import type { Answer, OpContext } from './operations.js';

/**
 * The least a READDIRPLUS entry takes: its header (fuse_entry_out and fuse_dirent, 152 bytes) and a
 * one-byte name, 8-byte aligned. No more entries than size / this fit in a reply.
 */
const MIN_DIRENTPLUS_BYTES = 160;

/**
 * Folders with more entries than this get READDIRPLUS entries bare (names and types, as READDIR): each
 * full entry makes the kernel and the inode table hold an inode until FORGET, so a plain `ls -f` of a
 * Zarr array's 100,000 chunk files cost 1.1-2.0 s instead of 0.2-0.4 and some 50 MiB of the daemon's
 * memory (issue 14 bounds it at 256 MiB). `ls -l` of such a folder looks each name up, as before.
 */
const READDIRPLUS_MAX_ENTRIES = 10_000;

/** File type bits, for an entry sent without attributes (its d_type). */

/**
 * An open folder's listing as the kernel reads it. Entries 0 and 1 are "." and ".."; entry i's metadata
 * is row rows[i] of runs[i] (null for those two), `prefix` the folder's object prefix.
 */
export interface DirListing {
  names: string[];
  inos: number[];
  /** Each entry's file type bits (S_IFDIR, S_IFREG, S_IFLNK). */
  types: number[];
  runs: (ListingRun | null)[];
  rows: number[];
  prefix: string;
  /** Entries this mount changed since the bucket's listing was taken (written, made, renamed here), by index. */
  local: Map<number, Entry>;
}

/** The folder listing one open directory handle reads, taken when its first readdir asks. */
interface DirHandle {
  ino: number;
  listing: DirListing | null;
  pending: Promise<DirListing> | null;
}

/** Open folders and their listings: OPENDIR, READDIR, READDIRPLUS and RELEASEDIR. */
export class DirOps {
  private readonly dirs = new Map<number, DirHandle>();
  private nextDir = 1;

  constructor(private readonly ctx: OpContext) {}

  /** How many folders the kernel holds open (the open_dirs gauge). */
  get openCount(): number {
    return this.dirs.size;
  }

  opendir(a: Answer, ino: number): void {
    const { inodes, deps } = this.ctx;
    const path = inodes.path(ino);
    if (path === undefined) return a.error(Errno.ESTALE);
    const fh = this.nextDir++;
    this.dirs.set(fh, { ino, listing: null, pending: null });
    let flags = 0;
    const node = inodes.node(ino);
    if (deps.timeouts.listCacheMs > 0 && node) {
      // The kernel keeps the listing in its page cache: reused by the next opens while it is young,
      // dropped (and filled again from us) by the first open after the TTL.
      flags |= OPEN_FLAGS.CACHE_READDIR;
      const now = performance.now();
      if (node.listCachedAt !== null && now - node.listCachedAt < deps.timeouts.listCacheMs) flags |= OPEN_FLAGS.KEEP_CACHE;
      else node.listCachedAt = now;
    }
    // An open the kernel did not take (its connection aborted meanwhile) gets no RELEASEDIR.
    if (!a.open(fh, flags)) this.dirs.delete(fh);
  }

  readdir(a: Answer, fh: number, offset: number, size: number): void {
    this.withListing(a, fh, offset, (l) => a.dir(l, offset, size));
  }

  /**
   * READDIRPLUS: entries with their attributes, from the listing (which has each object's size, mtime
   * and generation), so that a stat after it needs no LOOKUP. The kernel holds one lookup of each entry
   * it takes (FORGET gives them back), "." and ".." excepted; entries that did not fit hold none. A name
   * whose entry the kernel was given within the first half of its timeout, of the same generation, goes
   * bare (no attributes, no lookup): a second `ls` of a large folder then costs the kernel and us
   * next to nothing per name, and a listing in the second half still renews the entries.
   */
  readdirplus(a: Answer, fh: number, offset: number, size: number): void {
    const { inodes, handles, deps, told } = this.ctx;
    const { timeouts } = deps;
    this.withListing(a, fh, offset, (l, path) => {
      const n = Math.max(0, Math.min(l.names.length - offset, Math.floor(size / MIN_DIRENTPLUS_BYTES)));
      const names = l.names.slice(offset, offset + n);
      const attrs = new Float64Array(7 * n);
      const entries: (Entry | null)[] = [];
      const held: InodeNode[] = [];
      const paths: string[] = [];
      const now = performance.now();
      const freshFor = timeouts.entrySec * 500;
      const huge = l.names.length - 2 > READDIRPLUS_MAX_ENTRIES;
      /** Entry i without attributes (the kernel takes no lookup of it): inode `ino`'s name and type. */
      const bare = (i: number, ino: number, type: number): void => {
        attrs[7 * i] = -ino;
        attrs[7 * i + 1] = type;
        entries.push(null);
      };
      for (let i = 0; i < n; i++) {
        const at = offset + i;
        const run = l.runs[at];
        // What this mount changed since the listing was taken wins: it is kept for every readdir of the
        // handle, and an entry sent with its old attributes gave the kernel back a name removed here
        // (a positive dentry for the entry timeout) or an overwritten file's old generation.
        const since = at >= 2 ? this.ctx.writes?.localEntry(childPath(path, names[i]!)) : undefined;
        if (since === null) {
          bare(i, l.inos[at]!, l.types[at]!);
          continue;
        }
        const local = since ?? l.local.get(at);
        if (local) {
          const child = childPath(path, names[i]!);
          const holder = inodes.hold(child);
          attrs.set(statFor(holder.ino, local, deps.attributes), 7 * i);
          entries.push(local);
          held[i] = holder;
          paths[i] = child;
          continue;
        }
        if (!run) {
          attrs.set(statFor(l.inos[at]!, { kind: 'dir', mtimeMs: null }, deps.attributes), 7 * i);
          entries.push(null);
          continue;
        }
        const row = l.rows[at]!;
        const type = l.types[at]!;
        const dir = type === S_IFDIR;
        if (huge) {
          bare(i, l.inos[at]!, type);
          continue;
        }
        const child = childPath(path, names[i]!);
        const pinned = dir ? undefined : handles.pinned(child);
        const node = inodes.at(child);
        if (!pinned && node && node.lookups > 0 && now - node.entryToldAt < freshFor && node.toldKind === (dir ? 'dir' : 'file') && (dir || node.toldGeneration === run.generation(row))) {
          bare(i, node.ino, type);
          continue;
        }
        const entry: Entry = dir ? { kind: 'dir', mtimeMs: null } : { kind: 'file', meta: pinned ?? run.meta(row, l.prefix) };
        const holder = inodes.hold(child);
        attrs.set(statFor(holder.ino, entry, deps.attributes), 7 * i);
        entries.push(entry);
        held[i] = holder;
        paths[i] = child;
      }
      const sent = a.dirPlus(names, attrs, offset, size, timeouts.entrySec, timeouts.attrSec);
      for (let i = 0; i < n; i++) {
        const entry = entries[i];
        if (!entry) continue;
        const node = held[i]!;
        if (i >= sent) {
          inodes.forget(node.ino, 1); // not sent: the kernel holds no lookup of it
          continue;
        }
        told(node.ino, paths[i]!, entry, node);
        node.entryToldAt = now;
      }
    });
  }

  releasedir(a: Answer, fh: number): void {
    this.dirs.delete(fh);
    a.ok();
  }

  /** A folder's release the addon answered. */
  released(fh: number): void {
    this.dirs.delete(fh);
    this.ctx.deps.metrics.observeOp('releasedir', 0, false);
  }

  /**
   * Runs `reply` with the open folder's listing (taken on its first readdir, and again at offset 0: a
   * rewinddir reads the folder as it is now, as gcsfuse's does), or answers the error.
   */
  private withListing(a: Answer, fh: number, offset: number, reply: (listing: DirListing, path: string) => void): void {
    const d = this.dirs.get(fh);
    if (!d) return a.error(Errno.EBADF);
    const path = this.ctx.inodes.path(d.ino);
    if (path === undefined) return a.error(Errno.ESTALE);
    if (offset === 0 && d.listing) {
      d.listing = null;
      d.pending = null;
    }
    if (d.listing) return reply(d.listing, path);
    this.listingOf(d, path).then(
      (listing) => reply(listing, path),
      (err) => {
        d.pending = null;
        this.ctx.fail(a, path, err, errnoFor(err));
      },
    );
  }

  private listingOf(d: DirHandle, path: string): Promise<DirListing> {
    const { inodes, deps } = this.ctx;
    d.pending ??= deps.namespace.readdir(path).then((listing) => {
      const parent = path === '/' ? ROOT_INO : (inodes.peek(parentPath(path)) ?? ROOT_INO);
      const names = ['.', '..'];
      const inos = [d.ino, parent];
      const types = [S_IFDIR, S_IFDIR];
      const runs: (ListingRun | null)[] = [null, null];
      const rows = [0, 0];
      // What this mount changed in the folder wins over the listing, which may be older than the change.
      const changed = this.ctx.writes?.changesIn(path);
      const local = new Map<number, Entry>();
      listing.forEachRow((name, dir, run, i) => {
        if (changed?.has(name)) return;
        names.push(name);
        // A name not looked up yet has no inode: readdir's number is only a hint (stat asks lookup).
        inos.push(inodes.peek(childPath(path, name)) ?? unlookedInode(path, name));
        types.push(dir ? S_IFDIR : run.isSymlink(i) ? S_IFLNK : S_IFREG);
        runs.push(run);
        rows.push(i);
      });
      for (const [name, entry] of changed ?? []) {
        if (!entry) continue;
        local.set(names.length, entry);
        names.push(name);
        inos.push(inodes.peek(childPath(path, name)) ?? unlookedInode(path, name));
        types.push(typeOf(entry));
        runs.push(null);
        rows.push(0);
      }
      d.listing = { names, inos, types, runs, rows, prefix: listing.prefix, local };
      return d.listing;
    });
    return d.pending;
  }
}

/**
 * A stable number for a name readdir shows before anything looked it up, above any inode we hand
 * out (those count up from 2), so `ls -i` is at least consistent between listings.
 */
function unlookedInode(dir: string, name: string): number {
  let h = 0x811c9dc5;
  const s = `${dir}/${name}`;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return 2 ** 40 + (h >>> 0);
}
