import type { Dispatcher } from 'undici';
import { copyCrc32c } from '../crc32c.js';
import type { Logger } from '../observe/logger.js';
import type { Metrics } from '../observe/metrics.js';
import { StalledError, watchSilence, type AttemptLimits } from './attempt-limits.js';
import { GcsError } from './errors.js';
import { ERROR_BODY_LIMIT, errorFromStatus } from './responses.js';
import type { StallTimeout } from './stall-timeout.js';

/**
 * What one range GET is sent through, and where its stalls are observed, counted and logged (on a
 * download worker, recorders whose records the main thread replays: range-workers.ts).
 */
export interface RangeConnection {
  pool: Dispatcher;
  origin: string;
  stall: Pick<StallTimeout, 'observe'> | null;
  metrics: Pick<Metrics, 'inc'>;
  log: Pick<Logger, 'warn'>;
}

/**
 * One range GET whose body is copied straight into `out` as it arrives; resolves with the bytes copied.
 * undici's dispatch API rather than `request()`: a readable stream and its events per 64 KiB chunk were
 * a measured share of the CPU that a cold sequential read costs. `hashed`: the CRC32C of the bytes
 * copied so far, kept as each chunk is copied (by the addon, while the chunk is in the cache).
 */
export function receiveRange(conn: RangeConnection, path: string, headers: Record<string, string>, start: number, objectSize: number, out: Buffer, what: string, limits: AttemptLimits, got: { bytes: number }, hashed: { crc32c: number } | null = null): Promise<void> {
  const stall = conn.stall;
  return new Promise((resolve, reject) => {
    let status = 0;
    let retryAfter: string | string[] | undefined;
    let errorText = '';
    // A 200 means the server ignored the range and sends the whole object: skip to our window.
    let skip = 0;
    let seen = 0;
    let settled = false;
    /** Why the body must not be used (another range, or not the object's bytes); its bytes are dropped. */
    let wrongRange: string | null = null;
    let controller: Dispatcher.DispatchController | null = null;
    let cutBy: Error | null = null;
    // The longest silence of this response, headers included: one observation for the stall timeout.
    const sentAt = performance.now();
    let lastAt = sentAt;
    let longest = 0;
    const ranged = () => status === 200 || status === 206;
    const silence = watchSilence(limits, what, (err, silentMs) => {
      cutBy = err;
      if (err instanceof StalledError) stalled(conn, what, silentMs, got.bytes, status);
      controller?.abort(err);
      settle(err);
    });
    const progressed = (): void => {
      const t = performance.now();
      if (t - lastAt > longest) longest = t - lastAt;
      lastAt = t;
      silence.progress();
    };
    const settle = (err: Error | null): void => {
      if (settled) return;
      settled = true;
      silence.stop();
      if (!err && !cutBy) stall?.observe(longest);
      if (err) reject(err);
      else resolve();
    };
    conn.pool.dispatch(
      { origin: conn.origin, method: 'GET', path, headers },
      {
        onRequestStart: (c) => {
          controller = c;
          // Cut before undici even started it (it waited for a connection).
          if (cutBy) c.abort(cutBy);
        },
        onResponseStart: (_controller, statusCode, resHeaders) => {
          progressed();
          status = statusCode;
          retryAfter = resHeaders['retry-after'];
          skip = statusCode === 200 ? start : 0;
          wrongRange = wrongRangeOf(statusCode, resHeaders, start, out.length, objectSize);
        },
        onResponseData: (controller, chunk) => {
          // Once settled, `out` is the caller's again (a retry's, or another block's once released):
          // nothing more may land in it.
          if (settled) return;
          progressed();
          if (wrongRange !== null) {
            // Nothing of it is wanted: end it now rather than download a whole object for nothing.
            settle(new GcsError('CORRUPT', `${what}: the server sent ${wrongRange}`));
            controller.abort(new Error('response refused'));
            return;
          }
          if (!ranged()) {
            if (errorText.length < ERROR_BODY_LIMIT) errorText += chunk.toString('utf8');
            return;
          }
          copyWindow(chunk, seen, skip, out, got, hashed);
          seen += chunk.length;
          if (got.bytes === out.length && status === 200) {
            settle(null);
            controller.abort(new Error('rest of an unranged response not needed'));
          }
        },
        onResponseEnd: () => {
          if (wrongRange !== null) settle(new GcsError('CORRUPT', `${what}: the server sent ${wrongRange}`));
          else settle(ranged() ? null : errorFromStatus(status, retryAfter, errorText, what));
        },
        // A connection that breaks after the last byte has still delivered the range.
        onResponseError: (_controller, err) => {
          if (wrongRange !== null) settle(new GcsError('CORRUPT', `${what}: the server sent ${wrongRange}`));
          else settle(ranged() && got.bytes === out.length ? null : err);
        },
      },
    );
  });
}

/**
 * Why a response's body must not be used for the `length` bytes from `start` (another range, or not
 * the object's bytes), or null. Only a 206 or a 200 carries the bytes; other statuses are errors.
 */
export function wrongRangeOf(statusCode: number, resHeaders: Record<string, string | string[] | undefined>, start: number, length: number, objectSize: number): string | null {
  if (statusCode === 206) {
    // Bytes of another range would be served as ours: the one check a 206 body cannot make itself.
    const sent = String(resHeaders['content-range'] ?? '');
    const m = /^bytes (\d+)-(\d+)\//.exec(sent);
    if (!m || Number(m[1]) !== start || Number(m[2]) !== start + length - 1) return `Content-Range ${sent || '(none)'}`;
  } else if (statusCode === 200) {
    // A 200 is usable only as the whole object, to skip into: a body of any other length (a
    // transcoded one is chunked, with none) is other bytes, whatever their offsets say.
    const sent = resHeaders['content-length'];
    if (sent === undefined || Number(sent) !== objectSize) {
      return `a 200 of ${sent === undefined ? 'unknown length' : `${String(sent)} bytes`} for a ${objectSize}-byte object (range ignored, e.g. decompressive transcoding)`;
    }
  }
  return null;
}

/** A response cut for its silence: observed by the stall timeout, counted and logged. */
export function stalled(conn: Pick<RangeConnection, 'stall' | 'metrics' | 'log'>, what: string, silentMs: number, received: number, status: number): void {
  conn.stall?.observe(silentMs);
  conn.metrics.inc('gcs_stalls');
  conn.log.warn({ what, silentMs: Math.round(silentMs), received, status }, 'GCS response stalled: cutting it and resuming by Range');
}

/**
 * Copies the bytes of `chunk`, which starts `seen` bytes into the body, that fall in the window `skip`
 * bytes into it, to `out` after the `got.bytes` already there (as many as fit), hashing them into
 * `hashed` when given.
 */
export function copyWindow(chunk: Buffer, seen: number, skip: number, out: Buffer, got: { bytes: number }, hashed: { crc32c: number } | null): void {
  const from = Math.max(0, skip - seen);
  const take = Math.min(chunk.length - from, out.length - got.bytes);
  if (take <= 0) return;
  if (hashed) hashed.crc32c = copyCrc32c(chunk, from, from + take, out, got.bytes, hashed.crc32c);
  else chunk.copy(out, got.bytes, from, from + take);
  got.bytes += take;
}
