import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { optionalAddon } from './native-addon.js';

/**
 * What the addon (native/gcsmount_fuse.c) does for the memory of block buffers. Huge pages: GCS
 * downloads are copied into it, and O_DIRECT writes and FUSE replies pin it page by page (4 KiB pages
 * cost as much as a third of the kernel's time on a cold read). Discarding: an idle slab's pages go back
 * to the system when the pool drops it, not whenever the garbage collector frees it. Without the addon
 * both do nothing (correct, only costlier).
 */
interface MemoryAddon {
  adviseHugePages(memory: ArrayBuffer | Uint8Array): number;
  discardMemory(memory: ArrayBuffer | Uint8Array): boolean;
  trimMalloc?(): boolean;
}

function load(): MemoryAddon | null {
  const native = optionalAddon() as Partial<MemoryAddon>;
  return typeof native.adviseHugePages === 'function' && typeof native.discardMemory === 'function' ? (native as MemoryAddon) : null;
}

const addon = load();

/** N-API takes no SharedArrayBuffer (shared block memory, for download workers): a view of all of it instead. */
const forAddon = (memory: ArrayBufferLike): ArrayBuffer | Uint8Array => (memory instanceof ArrayBuffer ? memory : new Uint8Array(memory));

/** Asks for huge pages over the memory's 2 MiB-aligned part, before it is touched; returns the bytes advised. */
export function adviseHugePages(memory: ArrayBufferLike): number {
  return addon?.adviseHugePages(forAddon(memory)) ?? 0;
}

/** Gives the memory's pages back to the system now; it reads as zeros if touched again. Only for memory nobody holds. */
export function discardMemory(memory: ArrayBufferLike): void {
  addon?.discardMemory(forAddon(memory));
}

/** WebAssembly memory comes in pages of 64 KiB: page-aligned memory is had in multiples of this. */
export const WASM_PAGE = 65536;

/**
 * `bytes` (a multiple of WASM_PAGE) of page-aligned memory, which O_DIRECT needs (a WebAssembly.Memory
 * is the one Node allocation that is aligned), shared with worker threads when asked, advised for huge
 * pages before any page is touched (faults then fill 2 MiB at a time). Throws when the runtime refuses
 * another WebAssembly.Memory (out of address space): the caller falls back to a plain Buffer.
 */
export function alignedMemory(bytes: number, shared: boolean): ArrayBufferLike {
  const pages = bytes / WASM_PAGE;
  const memory = new WebAssembly.Memory({ initial: pages, maximum: pages, shared }).buffer;
  adviseHugePages(memory);
  return memory;
}

/** V8's full collection, which Node exposes only behind a flag: set here, for a fresh context's `gc`. */
function loadGc(): (() => void) | null {
  try {
    setFlagsFromString('--expose-gc');
    const gc: unknown = runInNewContext('gc');
    return typeof gc === 'function' ? (gc as () => void) : null;
  } catch {
    return null;
  }
}

/** Loaded on first use: setting a V8 flag is no business of a module merely imported. */
let gc: (() => void) | null | undefined;

/**
 * For a daemon whose reads are over: what the runtime still holds goes back to the system. Socket reads
 * leave their buffers as garbage until V8 collects it (it waits for some 64 MiB of external memory), and
 * glibc keeps what is freed for reuse: measured, 50 MiB of the C heap stayed resident after 24 readers
 * finished. A full collection of an idle daemon's heap takes milliseconds.
 */
export function releaseIdleMemory(): void {
  if (gc === undefined) gc = loadGc();
  gc?.();
  addon?.trimMalloc?.();
}
