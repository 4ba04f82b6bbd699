// A file's mtime as gcsfuse keeps it: custom metadata `gcsfuse_mtime`, RFC 3339 in UTC with as many
// fraction digits as needed (Go's time.RFC3339Nano), so gcsfuse and gcsmount read each other's.

export const MTIME_KEY = 'gcsfuse_mtime';

/** `2026-11-25T10:00:00.123456789Z` for nanoseconds since the epoch; trailing zeros of the fraction dropped. */
export function formatMtime(epochNs: bigint): string {
  let secs = epochNs / 1_000_000_000n;
  let nanos = epochNs % 1_000_000_000n;
  if (nanos < 0n) {
    nanos += 1_000_000_000n;
    secs -= 1n;
  }
  const whole = new Date(Number(secs) * 1000).toISOString().slice(0, 19);
  const fraction = nanos === 0n ? '' : `.${nanos.toString().padStart(9, '0').replace(/0+$/, '')}`;
  return `${whole}${fraction}Z`;
}

/** The custom metadata that gives an object the mtime `ms` (milliseconds since the epoch). */
export function mtimeMetadata(ms: number): Record<string, string> {
  return { [MTIME_KEY]: formatMtime(BigInt(Math.round(ms)) * 1_000_000n) };
}

/** Nanoseconds since the epoch, or null when the text is not an RFC 3339 time. Offsets other than Z are honoured. */
export function parseMtime(text: string): bigint | null {
  const m = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$/i.exec(text.trim());
  if (!m) return null;
  const ms = Date.parse(`${m[1]}${m[3]!.toUpperCase()}`);
  if (Number.isNaN(ms)) return null;
  return BigInt(ms) * 1_000_000n + BigInt((m[2] ?? '').padEnd(9, '0') || '0');
}
