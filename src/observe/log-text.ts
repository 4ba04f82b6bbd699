/**
 * `--log-format text`: pino's JSON lines rewritten as `key=value` lines, the shape gcsfuse's text logs
 * have (`time="..." severity=INFO message="..."`), for people who read the log rather than parse it.
 */

/** pino's numeric levels as gcsfuse names them. */
const SEVERITY: Record<number, string> = { 10: 'TRACE', 20: 'DEBUG', 30: 'INFO', 40: 'WARNING', 50: 'ERROR', 60: 'ERROR' };

/** JSON's quoting, plus escapes for the C1 controls and line separators JSON leaves as they are. */
function quote(s: string): string {
  return JSON.stringify(s).replace(/[\x7f-\x9f\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}

/**
 * A value bare when it is a plain word or number, quoted (JSON) when it has spaces, quotes, '=' or
 * control characters (an object name must not put terminal escapes into a log someone reads).
 */
function text(value: unknown): string {
  if (typeof value === 'number' || typeof value === 'boolean' || value === null) return String(value);
  const s = typeof value === 'string' ? value : JSON.stringify(value);
  return /^[^\s"=\\\x00-\x1f\x7f-\x9f\u2028\u2029]+$/.test(s) ? s : quote(s);
}

/** One JSON log line (pino's, with its newline) as one text line; a line that is not JSON passes as it is. */
export function jsonLineToText(line: string): string {
  let parsed: unknown;
  try {
    parsed = JSON.parse(line);
  } catch {
    return line;
  }
  if (typeof parsed !== 'object' || parsed === null) return line;
  const record = parsed as Record<string, unknown>;
  const { time, level, msg, ...rest } = record;
  const parts = [
    `time=${quote(typeof time === 'number' ? new Date(time).toISOString() : String(time))}`,
    `severity=${SEVERITY[level as number] ?? String(level)}`,
    `message=${quote(typeof msg === 'string' ? msg : '')}`,
  ];
  for (const [key, value] of Object.entries(rest)) if (value !== undefined) parts.push(`${key}=${text(value)}`);
  return `${parts.join(' ')}\n`;
}

/** A pino destination that writes text lines to `dest`. */
export function textDestination(dest: { write(s: string): unknown }): { write(s: string): void } {
  return { write: (s) => void dest.write(jsonLineToText(s)) };
}
