import type { Logger } from '../observe/logger.js';

export type Health = 'ok' | 'full' | 'unwritable';

export interface WriteHealthConfig {
  /** After a full disk, how long writes pause before the next try. */
  fullPauseMs: number;
  /** After a write fails for another reason, the first pause before writes are tried again; it doubles up to the max. */
  unwritableRetryMs: number;
  unwritableRetryMaxMs: number;
}

/** SQLite's "database or disk is full" (SQLITE_FULL) is the index's ENOSPC. */
export function isDiskFull(err: NodeJS.ErrnoException): boolean {
  return err.code === 'ENOSPC' || err.code === 'EDQUOT' || err.code === 'SQLITE_FULL';
}

/**
 * Whether the cache's writes are being tried, and when the next one is. Neither condition is forever:
 * a full disk pauses writes for `fullPauseMs`, any other failure for a backoff that doubles while
 * retries keep failing. Logged once per change of state, not per block.
 */
export class WriteHealth {
  state: Health = 'ok';
  /** While not ok: writes are skipped until then, and the next one is the retry. */
  private retryAt = 0;
  private backoffMs: number;

  constructor(
    private readonly cfg: WriteHealthConfig,
    private readonly dir: string,
    private readonly log: Logger,
  ) {
    this.backoffMs = cfg.unwritableRetryMs;
  }

  /** 'go' when writes are on; 'skip' while paused; 'retry' for the one write that tries again (the ones behind it wait for its outcome). */
  admit(): 'go' | 'skip' | 'retry' {
    if (this.state === 'ok') return 'go';
    if (Date.now() < this.retryAt) return 'skip';
    this.retryAt = Number.POSITIVE_INFINITY;
    return 'retry';
  }

  /** The write admitted as the retry wrote nothing after all (the block was there): the next write retries. */
  notTried(): void {
    if (this.state !== 'ok') this.retryAt = 0;
  }

  /** A write failed: pauses writes, and says so when the state changes. */
  failed(err: NodeJS.ErrnoException): void {
    if (isDiskFull(err)) {
      if (this.state !== 'full') this.log.warn({ dir: this.dir, code: err.code }, 'block cache disk is full: reads go straight to GCS until space frees up');
      this.state = 'full';
      this.retryAt = Date.now() + this.cfg.fullPauseMs;
      this.backoffMs = this.cfg.unwritableRetryMs;
      return;
    }
    if (this.state !== 'unwritable') {
      this.log.warn({ dir: this.dir, code: err.code, err: err.message }, 'block cache directory is not writable: reads go straight to GCS; writes are retried with backoff');
      this.backoffMs = this.cfg.unwritableRetryMs;
    } else {
      this.backoffMs = Math.min(this.backoffMs * 2, this.cfg.unwritableRetryMaxMs);
    }
    this.state = 'unwritable';
    this.retryAt = Date.now() + this.backoffMs;
  }

  /** A write went through. */
  succeeded(): void {
    if (this.state === 'ok') return;
    this.log.info({ dir: this.dir, was: this.state }, this.state === 'full' ? 'block cache disk has room again' : 'block cache directory is writable again');
    this.state = 'ok';
    this.retryAt = 0;
    this.backoffMs = this.cfg.unwritableRetryMs;
  }
}
