/**
 * `--log-format text`: pino's JSON lines rewritten as `key=value` lines, the shape gcsfuse's text logs
 * have (`time="..." severity=INFO message="..."`), for people who read the log rather than parse it.
 */

/** pino's numeric levels as gcsfuse names them. */
const SEVERITY: Record<number, string> = { 10: 'TRACE', 20: 'DEBUG', 30: 'INFO', 40: 'WARNING', 50: 'ERROR', 60: 'ERROR' };

/** A value bare when it is a plain word or number, quoted (JSON) when it has spaces, quotes or '='. */
function text(value: unknown): string {
  if (typeof value === 'number' || typeof value === 'boolean' || value === null) return String(value);
  const s = typeof value === 'string' ? value : JSON.stringify(value);
  return /^[^\s"=\\]+$/.test(s) ? s : JSON.stringify(s);
}

/** One JSON log line (pino's, with its newline) as one text line; a line that is not JSON passes as it is. */
export function jsonLineToText(line: string): string {
  let record: Record<string, unknown>;
  try {
    record = JSON.parse(line) as Record<string, unknown>;
  } catch {
    return line;
  }
  const { time, level, msg, ...rest } = record;
  const parts = [
    `time=${JSON.stringify(typeof time === 'number' ? new Date(time).toISOString() : String(time))}`,
    `severity=${SEVERITY[level as number] ?? String(level)}`,
    `message=${JSON.stringify(typeof msg === 'string' ? msg : '')}`,
  ];
  for (const [key, value] of Object.entries(rest)) if (value !== undefined) parts.push(`${key}=${text(value)}`);
  return `${parts.join(' ')}\n`;
}

/** A pino destination that writes text lines to `dest`. */
export function textDestination(dest: { write(s: string): unknown }): { write(s: string): void } {
  return { write: (s) => void dest.write(jsonLineToText(s)) };
}
