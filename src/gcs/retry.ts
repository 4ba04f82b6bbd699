import { GcsError } from './errors.js';

/** A small pure policy with visible defaults, tested with an injected random source. */
export interface RetryPolicy {
  /** Attempts in all, the first included; Infinity for gcsfuse's "--max-retry-attempts 0": no limit. */
  maxAttempts: number;
  baseDelayMs: number;
  /** Growth of the delay ceiling per attempt (gcsfuse's --retry-multiplier). */
  multiplier: number;
  /** The cap on one sleep (gcsfuse's --max-retry-sleep). */
  maxDelayMs: number;
}

export const DEFAULT_RETRY: RetryPolicy = { maxAttempts: Number.POSITIVE_INFINITY, baseDelayMs: 100, multiplier: 2, maxDelayMs: 30_000 };

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
  const ceiling = Math.min(policy.maxDelayMs, policy.baseDelayMs * policy.multiplier ** (attempt - 1));
  const jittered = random() * ceiling;
  const asked = err instanceof GcsError && err.retryAfterSeconds !== null ? err.retryAfterSeconds * 1000 : 0;
  return Math.min(policy.maxDelayMs, Math.max(jittered, asked));
}
