/**
 * gcsfuse's special values as types, shared by every layer (imports nothing): -1 and 0 mean "forever" /
 * "unlimited" and "off" in its flags; here a component can never mistake one for a number.
 */
export type Ttl = { kind: 'off' } | { kind: 'forever' } | { kind: 'ms'; ms: number };
export type SizeLimit = { kind: 'off' } | { kind: 'unlimited' } | { kind: 'bytes'; bytes: number };

/**
 * A delay as Node's timers can take it: past 2^31 - 1 ms (24.8 days) setTimeout fires after 1 ms (with
 * a warning), so `--start-timeout 1000h` gave up at once and `--unmount-grace-period 1000h` served
 * nothing. Longer is as good as for ever.
 */
export function timerDelay(ms: number): number {
  return Math.min(Math.max(0, ms), 2 ** 31 - 1);
}
