import { createRequire } from 'node:module';

/**
 * Transparent huge pages (MADV_HUGEPAGE, through the addon) for long-lived memory that the kernel pins
 * and copies from: the block buffers GCS downloads land in, which O_DIRECT writes and FUSE replies pin
 * page by page. Where the addon cannot load, or the system refuses, the memory stays in small pages
 * (correct, only costlier). Returns the bytes advised.
 */
function load(): (memory: ArrayBuffer) => number {
  try {
    const addon = createRequire(import.meta.url)('../native/build/Release/gcsmount_fuse.node') as { adviseHugePages?: unknown };
    if (typeof addon.adviseHugePages === 'function') return addon.adviseHugePages as (memory: ArrayBuffer) => number;
  } catch {
    // small pages, below
  }
  return () => 0;
}

export const adviseHugePages: (memory: ArrayBuffer) => number = load();
