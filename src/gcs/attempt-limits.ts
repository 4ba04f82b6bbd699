// Limits of one attempt: the stall timeout (silence) and --max-retry-duration (time), and the errors that cut it.
import { GcsError } from './errors.js';

/** An attempt cut because GCS sent nothing for longer than the stall timeout: resumed at once, no backoff. */
export class StalledError extends GcsError {
  constructor(what: string, silentMs: number) {
    super('TRANSIENT', `${what}: no bytes for ${Math.round(silentMs)} ms (stalled)`);
  }
}

/** An attempt cut because its read or lookup reached --max-retry-duration. */
export class DeadlineError extends GcsError {
  constructor(what: string) {
    super('TRANSIENT', `${what}: --max-retry-duration reached during the attempt`);
  }
}

/** What one attempt may use up: silence (the stall timeout) and time (the retry deadline). */
export interface AttemptLimits {
  stallMs: number;
  deadlineAt: number;
}

/**
 * Calls `cut` once the request has been silent for `limits.stallMs` since the last `progress()` (or
 * `since`, before the first), or the deadline has come, whichever is first. One timer per attempt, re-armed only when it fires.
 */
export function watchSilence(limits: AttemptLimits, what: string, cut: (err: GcsError, silentMs: number) => void, since = performance.now()): { progress(): void; stop(): void } {
  let last = since;
  let timer: NodeJS.Timeout | null = null;
  const arm = (): void => {
    const t = performance.now();
    const at = Math.min(last + limits.stallMs, limits.deadlineAt);
    if (!Number.isFinite(at)) return;
    timer = setTimeout(check, Math.max(1, at - t));
  };
  const check = (): void => {
    timer = null;
    const t = performance.now();
    if (t >= limits.deadlineAt) cut(new DeadlineError(what), t - last);
    else if (t - last >= limits.stallMs) cut(new StalledError(what, t - last), t - last);
    else arm();
  };
  arm();
  return {
    progress: () => {
      last = performance.now();
    },
    stop: () => {
      if (timer) clearTimeout(timer);
      timer = null;
    },
  };
}
