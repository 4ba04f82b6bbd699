import { optionalAddon } from './native-addon.js';

/**
 * What the addon (native/gcsmount_fuse.c) does for the memory of block buffers. Huge pages: GCS
 * downloads are copied into it, and O_DIRECT writes and FUSE replies pin it page by page (4 KiB pages
 * cost as much as a third of the kernel's time on a cold read). Discarding: an idle slab's pages go back
 * to the system when the pool drops it, not whenever the garbage collector frees it. Without the addon
 * both do nothing (correct, only costlier).
 */
interface MemoryAddon {
  adviseHugePages(memory: ArrayBuffer): number;
  discardMemory(memory: ArrayBuffer): boolean;
}

function load(): MemoryAddon | null {
  const native = optionalAddon() as Partial<MemoryAddon>;
  return typeof native.adviseHugePages === 'function' && typeof native.discardMemory === 'function' ? (native as MemoryAddon) : null;
}

const addon = load();

/** Asks for huge pages over the memory's 2 MiB-aligned part, before it is touched; returns the bytes advised. */
export function adviseHugePages(memory: ArrayBuffer): number {
  return addon?.adviseHugePages(memory) ?? 0;
}

/** Gives the memory's pages back to the system now; it reads as zeros if touched again. Only for memory nobody holds. */
export function discardMemory(memory: ArrayBuffer): void {
  addon?.discardMemory(memory);
}
