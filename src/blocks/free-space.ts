import { statfsSync } from 'node:fs';

/**
 * With no size budget (`--file-cache-max-size-mb -1`, "until the disk is full") the cache keeps this
 * share of its file system free, at most FREE_MARGIN_MAX_BYTES: room for whatever else uses that disk
 * (a shared /tmp, a scratch SSD) and for the index's own growth, so parallel block writes never run into
 * ENOSPC together (which paused the cache and left nothing cached on a small disk). cachefilesd keeps
 * 7% free by default for the same reason; 5% is a block of 4 MiB on an 80 MiB disk, 50 GiB on 1 TB
 * before the cap.
 */
export const FREE_MARGIN_SHARE = 0.05;
export const FREE_MARGIN_MAX_BYTES = 4 * 2 ** 30;
/** Eviction for the margin frees this share of the margin beyond it, so it runs in batches, not per block. */
const BATCH_SHARE = 0.25;

/** The free space the cache leaves on its file system, and how much is free now. */
export class FreeSpaceMargin {
  private constructor(
    private readonly dir: string,
    /** Bytes kept free. */
    readonly bytes: number,
    /** Bytes freed beyond the margin when eviction runs for it. */
    readonly batchBytes: number,
  ) {}

  /** The margin for the file system of `dir`; null when statfs cannot tell (the cache then relies on ENOSPC). */
  static of(dir: string): FreeSpaceMargin | null {
    try {
      const st = statfsSync(dir);
      const bytes = Math.min(FREE_MARGIN_MAX_BYTES, Math.ceil(st.blocks * st.bsize * FREE_MARGIN_SHARE));
      return new FreeSpaceMargin(dir, bytes, Math.ceil(bytes * BATCH_SHARE));
    } catch {
      return null;
    }
  }

  /** Bytes this user may still write there (bavail: root's reserve does not count), or null. */
  freeBytes(): number | null {
    try {
      const st = statfsSync(this.dir);
      return st.bavail * st.bsize;
    } catch {
      return null;
    }
  }
}
