import { LRUCache } from 'lru-cache';
import type { HandleReader } from '../blocks/handle-reader.js';
import type { ObjectMeta } from '../gcs/object-client.js';

interface OpenFile {
  path: string;
  reader: HandleReader;
}

interface Pin {
  meta: ObjectMeta;
  opens: number;
}

/**
 * Open files by the number handed to the kernel, and the generation each path is pinned to.
 *
 * The kernel keeps one page cache per inode, and libfuse's path API gives every open of a path the same
 * inode. If a new open read a newer generation while an older one is still open, the new bytes would land
 * in the pages the old reader reads next: a mix. So while any handle of a path is open, every open and
 * stat of that path sees the same generation; the next one is seen once the last handle closes.
 *
 * The kernel also keeps each file's size for the attribute timeout, and clamps reads to it. A file
 * opened on a newer generation than the size the kernel holds would read as a truncated (or padded) new
 * file. What the kernel holds is exactly what getattr last answered, so an open pins that generation.
 */
export class HandleTable {
  private readonly open = new Map<number, OpenFile>();
  private readonly pins = new Map<string, Pin>();
  /** What getattr last told the kernel about each file, bounded: past it, an open asks the namespace. */
  private readonly reported = new LRUCache<string, ObjectMeta>({ max: 500_000 });
  private next = 1;

  /** Records the attributes handed to the kernel for a file. */
  reportedToKernel(path: string, meta: ObjectMeta): void {
    this.reported.set(path, meta);
  }

  /** The generation an open of `path` must read: the pinned one, else the one the kernel has the size of. */
  generationFor(path: string, fresh: ObjectMeta): ObjectMeta {
    return this.pins.get(path)?.meta ?? this.reported.get(path) ?? fresh;
  }

  /** The generation `path` is pinned to while it has open handles. */
  pinned(path: string): ObjectMeta | undefined {
    return this.pins.get(path)?.meta;
  }

  add(path: string, reader: HandleReader): number {
    // Skip numbers still in use after wrap-around; 2^31 opens is a long time, but not forever.
    while (this.open.has(this.next)) this.next = (this.next % 0x7fff_ffff) + 1;
    const fd = this.next;
    this.next = (this.next % 0x7fff_ffff) + 1;
    this.open.set(fd, { path, reader });
    const pin = this.pins.get(path);
    if (pin) pin.opens++;
    else this.pins.set(path, { meta: reader.meta, opens: 1 });
    return fd;
  }

  get(fd: number): HandleReader | undefined {
    return this.open.get(fd)?.reader;
  }

  remove(fd: number): void {
    const file = this.open.get(fd);
    if (!file) return;
    this.open.delete(fd);
    const pin = this.pins.get(file.path);
    if (pin && --pin.opens === 0) this.pins.delete(file.path);
  }

  get size(): number {
    return this.open.size;
  }
}
