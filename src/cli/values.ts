// Value parsers for mount options. Pure functions: each takes the name of the option it is parsing
// (a flag name such as 'uid', or any label containing a space such as "config key 'file-system.uid'")
// and the text to parse, and throws OptionError with a one-line message naming both on bad input.

/** A user error in the command line or config file. The message is one line, fit to print as is. */
export class OptionError extends Error {
  override readonly name = 'OptionError';
}

import type { SizeLimit, Ttl } from '../units.js';

export type { SizeLimit, Ttl };

/** gcsfuse's upper bound for *-ttl-secs values (math.MaxInt64 nanoseconds, in whole seconds). */
export const MAX_TTL_SECS = 9_223_372_036;

const MIB = 1024 * 1024;

/** How an option is named in messages: bare flag names get their dashes (-o, --uid), labels are used as given. */
export function optionLabel(flag: string): string {
  if (flag.startsWith('-') || /\s/.test(flag)) return flag;
  return flag.length === 1 ? `-${flag}` : `--${flag}`;
}

function fail(flag: string, text: string, expected: string): never {
  throw new OptionError(`invalid value ${JSON.stringify(text)} for ${optionLabel(flag)}: ${expected}`);
}

function checkRange(flag: string, text: string, n: number, min?: number, max?: number): number {
  if (min !== undefined && n < min) fail(flag, text, `must be at least ${min}`);
  if (max !== undefined && n > max) fail(flag, text, `must be at most ${max}`);
  return n;
}

/** A decimal integer (optional sign), within [min, max] when given. */
export function parseInt(flag: string, text: string, min?: number, max?: number): number {
  const t = text.trim();
  if (!/^[+-]?\d+$/.test(t)) fail(flag, text, 'expected an integer');
  const n = Number(t);
  if (!Number.isSafeInteger(n)) fail(flag, text, 'integer out of range');
  return checkRange(flag, text, n, min, max);
}

/** A decimal number such as 2, 1.5, .5 or 1e3, within [min, max] when given. */
export function parseFloat(flag: string, text: string, min?: number, max?: number): number {
  const t = text.trim();
  if (!/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(t)) fail(flag, text, 'expected a number');
  const n = Number(t);
  if (!Number.isFinite(n)) fail(flag, text, 'number out of range');
  return checkRange(flag, text, n, min, max);
}

const TRUE_WORDS = new Set(['true', 't', '1', 'yes', 'y', 'on']);
const FALSE_WORDS = new Set(['false', 'f', '0', 'no', 'n', 'off']);

/** true/false, 1/0, yes/no (and Go's t/f), any case. A bare boolean flag never reaches this. */
export function parseBool(flag: string, text: string): boolean {
  const t = text.trim().toLowerCase();
  if (TRUE_WORDS.has(t)) return true;
  if (FALSE_WORDS.has(t)) return false;
  return fail(flag, text, 'expected true or false');
}

/** Permission bits in octal: '0644', '644' or '0o644'; at most 0777. */
export function parseOctal(flag: string, text: string): number {
  const t = text.trim().replace(/^0[oO]/, '');
  if (!/^[0-7]+$/.test(t)) fail(flag, text, 'expected octal permission bits such as 0644');
  const n = Number.parseInt(t, 8);
  if (n > 0o777) fail(flag, text, 'must be at most 0777');
  return n;
}

const DURATION_UNITS_MS: Record<string, number> = {
  ns: 1e-6,
  us: 1e-3,
  'µs': 1e-3, // U+00B5 micro sign
  'μs': 1e-3, // U+03BC Greek mu
  ms: 1,
  s: 1000,
  m: 60_000,
  h: 3_600_000,
};

/**
 * A Go-style duration ('600s', '30m', '1h30m', '1.5s', '200ms', '0') or a bare number of seconds
 * ('600'), returned in milliseconds. Negative durations are rejected.
 */
export function parseDuration(flag: string, text: string): number {
  const t = text.trim();
  if (t === '') fail(flag, text, 'expected a duration such as 30s, 5m or 1h30m');
  if (t.startsWith('-')) fail(flag, text, 'duration must not be negative');
  const body = t.startsWith('+') ? t.slice(1) : t;
  // A bare number: seconds.
  if (/^(\d+\.?\d*|\.\d+)$/.test(body)) return Number(body) * 1000;
  const part = /(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)/y;
  let ms = 0;
  let pos = 0;
  while (pos < body.length) {
    part.lastIndex = pos;
    const m = part.exec(body);
    if (!m) fail(flag, text, 'expected a duration such as 30s, 5m or 1h30m');
    ms += Number(m[1]) * DURATION_UNITS_MS[m[2]!]!;
    pos = part.lastIndex;
  }
  if (!Number.isFinite(ms)) fail(flag, text, 'duration out of range');
  return ms;
}

/** Milliseconds as a short Go-style duration for help text: 0s, 200ms, 1.5s, 60s. */
export function formatDuration(ms: number): string {
  if (ms === 0) return '0s';
  if (ms < 1000) return `${ms}ms`;
  return `${ms / 1000}s`;
}

/** Milliseconds as an integer number of seconds, rounded up (gcsfuse's rule for the deprecated TTL flags). */
export function msToWholeSeconds(ms: number): number {
  return Math.ceil(ms / 1000);
}

/** A gcsfuse *-ttl-secs value: -1 = forever, 0 = off, n > 0 = n seconds. */
export function ttlFromSeconds(seconds: number, flag = 'ttl-secs'): Ttl {
  if (!Number.isInteger(seconds) || seconds < -1 || seconds > MAX_TTL_SECS) {
    fail(flag, String(seconds), `expected -1 (forever), 0 (off) or whole seconds up to ${MAX_TTL_SECS}`);
  }
  if (seconds === -1) return { kind: 'forever' };
  if (seconds === 0) return { kind: 'off' };
  return { kind: 'ms', ms: seconds * 1000 };
}

/** A gcsfuse *-max-size-mb value: -1 = unlimited, 0 = off (no cache), n > 0 = n MiB. */
export function sizeLimitFromMb(mb: number, flag = 'max-size-mb'): SizeLimit {
  if (!Number.isInteger(mb) || mb < -1) {
    fail(flag, String(mb), 'expected -1 (unlimited), 0 (off) or a size in MiB');
  }
  if (mb === -1) return { kind: 'unlimited' };
  if (mb === 0) return { kind: 'off' };
  return { kind: 'bytes', bytes: mb * MIB };
}

/** A string that must be one of `choices` (compared case-insensitively; returned lower-cased). */
export function parseChoice(flag: string, text: string, choices: readonly string[]): string {
  const t = text.trim().toLowerCase();
  if (!choices.includes(t)) fail(flag, text, `expected one of ${choices.join(', ')}`);
  return t;
}

/** A comma-separated list ('allow_other,ro'): items trimmed, empty items dropped. */
export function parseStringList(text: string): string[] {
  return text
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '');
}
