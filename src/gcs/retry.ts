import { GcsError } from './errors.js';

/** A small pure policy with visible defaults, tested with an injected random source. */
export interface RetryPolicy {
  /** Attempts in all, the first included. */
  maxAttempts: number;
  baseDelayMs: number;
  /** The cap on one sleep (gcsfuse's --max-retry-sleep). */
  maxDelayMs: number;
}

export const DEFAULT_RETRY: RetryPolicy = { maxAttempts: 8, baseDelayMs: 100, maxDelayMs: 30_000 };

export function isRetryable(err: unknown): boolean {
  return err instanceof GcsError && err.code === 'TRANSIENT';
}

/**
 * How long to sleep before attempt `attempt + 1` (attempt counts from 1), or 'give-up'. Exponential backoff
 * with full jitter, so many clients that failed together do not retry together; a server's Retry-After is
 * a floor, still capped so a bogus header cannot stall a reader for hours.
 */
export function retryDelay(policy: RetryPolicy, attempt: number, err: unknown, random: () => number = Math.random): number | 'give-up' {
  if (!isRetryable(err) || attempt >= policy.maxAttempts) return 'give-up';
  const ceiling = Math.min(policy.maxDelayMs, policy.baseDelayMs * 2 ** (attempt - 1));
  const jittered = random() * ceiling;
  const asked = err instanceof GcsError && err.retryAfterSeconds !== null ? err.retryAfterSeconds * 1000 : 0;
  return Math.min(policy.maxDelayMs, Math.max(jittered, asked));
}
