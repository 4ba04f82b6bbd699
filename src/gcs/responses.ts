// Turning GCS's answers into values and GcsErrors: object resources, error bodies, Retry-After, and
// transport failures.
import type { Dispatcher } from 'undici';
import { GcsError, codeForStatus } from './errors.js';
import { MTIME_KEY, parseMtime } from './mtime.js';
import type { ObjectMeta } from './object-client.js';
import { symlinkTargetOf } from './symlinks.js';

/**
 * Only what the namespace and the block cache use: small responses, cheap to parse. `metadata` carries
 * gcsfuse's mtime and symlink keys (Zarr chunks and most objects have none, so it costs nothing there).
 */
export const OBJECT_FIELDS = 'name,size,generation,metageneration,updated,crc32c,metadata';

export interface RawObject {
  name: string;
  size: string;
  generation: string;
  metageneration?: string;
  updated?: string;
  crc32c?: string;
  metadata?: Record<string, string>;
}

export function toMeta(raw: RawObject): ObjectMeta {
  const meta: ObjectMeta = {
    name: raw.name,
    size: Number(raw.size),
    generation: raw.generation,
    metageneration: raw.metageneration ?? '1',
    updatedMs: mtimeMsOf(raw),
    crc32c: raw.crc32c ?? null,
  };
  const target = symlinkTargetOf(raw.metadata);
  if (target !== undefined) meta.symlinkTarget = target;
  return meta;
}

/**
 * The file's mtime as gcsfuse shows it: its `gcsfuse_mtime` when that is a time, else the whole seconds
 * of `goog-reserved-file-mtime` (what `gcloud storage cp --preserve-posix` keeps), else the object's
 * update time.
 */
function mtimeMsOf(raw: RawObject): number {
  const kept = raw.metadata?.[MTIME_KEY];
  const ns = kept === undefined ? null : parseMtime(kept);
  if (ns !== null) return Number(ns / 1_000_000n);
  const posix = raw.metadata?.[POSIX_MTIME_KEY];
  const secs = posix === undefined ? null : goInteger(posix);
  if (secs !== null && Number.isSafeInteger(secs * 1000)) return secs * 1000;
  return raw.updated ? Date.parse(raw.updated) : 0;
}

/** gcloud's POSIX mtime: seconds since the epoch, read as gcsfuse reads it (Go's ParseInt with base 0). */
const POSIX_MTIME_KEY = 'goog-reserved-file-mtime';

/** An integer as Go's strconv.ParseInt(s, 0, 64) reads it (0x, 0o, 0b and a leading 0 for octal), or null. */
export function goInteger(text: string): number | null {
  const m = /^([+-]?)(0[xX][0-9a-fA-F]+|0[bB][01]+|0[oO][0-7]+|0[0-7]*|[1-9][0-9]*)$/.exec(text);
  if (!m) return null;
  const digits = m[2]!;
  const value = /^0[0-7]+$/.test(digits) ? BigInt(`0o${digits.slice(1)}`) : BigInt(digits);
  const n = m[1] === '-' ? -value : value;
  return n >= -(2n ** 63n) && n < 2n ** 63n ? Number(n) : null;
}

export function retryAfterSeconds(header: string | string[] | undefined): number | null {
  const value = Array.isArray(header) ? header[0] : header;
  if (!value) return null;
  const secs = Number(value);
  if (Number.isFinite(secs)) return Math.max(0, secs);
  const date = Date.parse(value);
  return Number.isNaN(date) ? null : Math.max(0, (date - Date.now()) / 1000);
}

/** undici's answers to a request on a pool that close() or destroy() has begun to take down. */
const CLOSED_CODES = new Set(['UND_ERR_CLOSED', 'UND_ERR_DESTROYED']);

/**
 * Network-level failures (resets, refused connections, timeouts) are all worth another attempt; a
 * client that is closed (the daemon is stopping) is not a fault of GCS and is never retried.
 */
export function transportError(err: unknown, what: string): GcsError {
  if (err instanceof GcsError) return err;
  const code = (err as { code?: string }).code ?? 'ERR';
  const message = err instanceof Error ? err.message : String(err);
  if (CLOSED_CODES.has(code)) return new GcsError('CLOSED', `${what}: ${message}`);
  return new GcsError('TRANSIENT', `${what}: ${code} ${message}`);
}

export function errorFromStatus(statusCode: number, retryAfter: string | string[] | undefined, bodyText: string, what: string): GcsError {
  let detail = '';
  try {
    const parsed = JSON.parse(bodyText) as { error?: { message?: string } };
    detail = parsed.error?.message ?? bodyText.slice(0, 200);
  } catch {
    detail = bodyText.slice(0, 200);
  }
  return new GcsError(codeForStatus(statusCode), `${what}: HTTP ${statusCode}${detail ? ` ${detail}` : ''}`, statusCode, retryAfterSeconds(retryAfter));
}

/**
 * What the write path reads of an answer: undici's ResponseData, or one a download worker received and
 * passed back whole (range-workers.ts's send).
 */
export interface SentResponse {
  statusCode: number;
  headers: Record<string, string | string[] | undefined>;
  body: { dump(): Promise<unknown>; json(): Promise<unknown>; text(): Promise<string> };
}

export async function errorFromResponse(res: SentResponse | Dispatcher.ResponseData, what: string): Promise<GcsError> {
  // A broken socket while reading an error body leaves only the status to report.
  const text = await res.body.text().catch(() => '');
  return errorFromStatus(res.statusCode, res.headers['retry-after'], text, what);
}

/** An error body is read for its message, up to this much. */
export const ERROR_BODY_LIMIT = 4096;
