// Symbolic links as gcsfuse keeps them, so that links made by either tool read the same in both. An
// object is a link when its custom metadata has `gcsfuse_symlink_target` (the target is that value;
// gcsfuse's form, which gcsmount writes: an empty object), or `goog-reserved-file-is-symlink: true`
// (the standard form newer gcsfuse writes with --enable-standard-symlinks: the target is the object's
// bytes).

export const SYMLINK_TARGET_KEY = 'gcsfuse_symlink_target';
export const STANDARD_SYMLINK_KEY = 'goog-reserved-file-is-symlink';

/** Longest target a link may have (Linux's PATH_MAX, the kernel's own limit for readlink and symlink). */
export const MAX_SYMLINK_TARGET = 4095;

/**
 * What an object's metadata says of it as a link: undefined, not a link; a string, the link's target;
 * null, a link whose target is the object's bytes.
 */
export function symlinkTargetOf(metadata: Record<string, string> | undefined): string | null | undefined {
  if (!metadata) return undefined;
  const target = metadata[SYMLINK_TARGET_KEY];
  if (target !== undefined) return target;
  return metadata[STANDARD_SYMLINK_KEY] === 'true' ? null : undefined;
}
