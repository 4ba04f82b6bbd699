import type { HandleReader } from '../blocks/handle-reader.js';

/** Open files by the number handed to the kernel. Each pins the generation it opened. */
export class HandleTable {
  private readonly open = new Map<number, HandleReader>();
  private next = 1;

  add(reader: HandleReader): number {
    // Skip numbers still in use after wrap-around; 2^31 opens is a long time, but not forever.
    while (this.open.has(this.next)) this.next = (this.next % 0x7fff_ffff) + 1;
    const fd = this.next;
    this.next = (this.next % 0x7fff_ffff) + 1;
    this.open.set(fd, reader);
    return fd;
  }

  get(fd: number): HandleReader | undefined {
    return this.open.get(fd);
  }

  remove(fd: number): void {
    this.open.delete(fd);
  }

  get size(): number {
    return this.open.size;
  }
}
