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
/** How old a statfs may be, and how far above the margin free space must be, to estimate rather than ask. */
const SAMPLE_MS = 100;
const FRESH_WITHIN_BYTES = 1024 * 2 ** 20;
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

  private sampledFree: number | null = null;
  private sampledAt = Number.NEGATIVE_INFINITY;
  /** Bytes this cache wrote since the sample. */
  private writtenSince = 0;

  /**
   * Bytes this user may still write there (bavail: root's reserve does not count), or null. Far above
   * the margin, a statfs up to SAMPLE_MS old less what this cache wrote since will do (a statfs per
   * block write was ~4% of the main thread's time over cold chunk files); near it, always a fresh one.
   * Space others free meanwhile is seen late, which only errs on the safe side; space others take is
   * what the margin itself is for.
   */
  freeBytes(): number | null {
    if (this.sampledFree !== null && performance.now() - this.sampledAt < SAMPLE_MS) {
      const estimate = this.sampledFree - this.writtenSince;
      if (estimate - this.bytes > FRESH_WITHIN_BYTES) return estimate;
    }
    try {
      const st = statfsSync(this.dir);
      this.sampledFree = st.bavail * st.bsize;
      this.sampledAt = performance.now();
      this.writtenSince = 0;
      return this.sampledFree;
    } catch {
      this.sampledFree = null;
      return null;
    }
  }

  /** A block file of `bytes` reached the disk. */
  wrote(bytes: number): void {
    this.writtenSince += bytes;
  }
}
