import { createRequire } from 'node:module';

/** The project's addon (native/, built by npm ci): the FUSE layer, the native read path, CRC32C, block memory. */
const ADDON_PATH = '../native/build/Release/gcsmount_fuse.node';

/** Loads the addon; throws what require throws (a missing build, a missing libfuse3). */
export function requireAddon(): unknown {
  return createRequire(import.meta.url)(ADDON_PATH);
}

/**
 * The addon's functions, or an empty object where it cannot load (no libfuse3: `gcsmount cache verify`
 * on another machine, say), for the parts that have a JavaScript fallback.
 */
export function optionalAddon(): Record<string, unknown> {
  try {
    return requireAddon() as Record<string, unknown>;
  } catch {
    return {};
  }
}
