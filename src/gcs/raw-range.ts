// One range GET on a download worker's own sockets (raw-pool.ts), the body read by the kernel straight
// into the block's memory. Measured on this project's machine (/work/probe/onread.mjs: 1 GiB as 4 MiB
// ranges from the emulator, one thread): 0.61-0.76 CPU-s per GiB against 2.2-3.1 through undici, whose
// socket is read 64 KiB at a time through a Node stream, parsed by llhttp and copied once more. Only what
// a media range needs is spoken: HTTP/1.1, a body framed by Content-Length; anything else (a chunked
// range body) is refused with RawFramingError before a byte lands, and the caller asks undici instead.
import { crc32c } from '../crc32c.js';
import { StalledError, watchSilence, type AttemptLimits } from './attempt-limits.js';
import { GcsError } from './errors.js';
import { copyWindow, stalled, wrongRangeOf, type RangeConnection } from './range-body.js';
import type { RawPool, RawSocket, Reader } from './raw-pool.js';
import { ERROR_BODY_LIMIT, errorFromStatus } from './responses.js';

/** The response cannot be read here (its framing): nothing of it landed; undici may read it. */
export class RawFramingError extends Error {}

type Headers = Record<string, string | string[]>;

/** Where the attempt's stalls are observed, counted and logged (recorders on a download worker). */
export type RawConnection = Pick<RangeConnection, 'stall' | 'metrics' | 'log'>;

/** Parses a response head (status line and header lines, without the blank line); null if it is not HTTP/1.x. */
export function parseHead(text: string): { status: number; headers: Headers; http10: boolean } | null {
  const lines = text.split('\r\n');
  const m = /^HTTP\/1\.([01]) (\d{3})(?: |$)/.exec(lines[0] ?? '');
  if (!m) return null;
  const headers: Headers = {};
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i]!;
    const colon = line.indexOf(':');
    if (colon <= 0) return null;
    const name = line.slice(0, colon).trim().toLowerCase();
    const value = line.slice(colon + 1).trim();
    const had = headers[name];
    headers[name] = had === undefined ? value : Array.isArray(had) ? [...had, value] : [had, value];
  }
  return { status: Number(m[2]), headers, http10: m[1] === '0' };
}

/**
 * A Content-Length to frame a body by: undefined when there is none, null when it cannot be trusted
 * (not all digits, or copies that differ: RFC 9112 says such a message's framing is unknown).
 */
export function contentLength(v: string | string[] | undefined): number | null | undefined {
  if (v === undefined) return undefined;
  const all = Array.isArray(v) ? v : [v];
  return all.every((x) => /^\d{1,15}$/.test(x) && Number(x) === Number(all[0])) ? Number(all[0]) : null;
}

const one = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);

/** The Keep-Alive header's timeout, in milliseconds, when the server gives one. */
function keepAliveHint(headers: Headers): number | null {
  const m = /timeout=(\d+)/i.exec(one(headers['keep-alive']) ?? '');
  return m ? Number(m[1]) * 1000 : null;
}

/** The request's bytes; header values come from gcsmount itself, but a line break in one would split the request. */
function requestBytes(host: string, path: string, headers: Record<string, string>): Buffer {
  let text = `GET ${path} HTTP/1.1\r\nhost: ${host}\r\n`;
  for (const [k, v] of Object.entries(headers)) {
    if (/[\r\n]/.test(k) || /[\r\n]/.test(v)) throw new GcsError('INVALID', `header ${k} holds a line break`);
    text += `${k}: ${v}\r\n`;
  }
  return Buffer.from(`${text}\r\n`, 'latin1');
}

/**
 * The same contract as range-body.ts's receiveRange: `out` filled from `start` (a 206 of exactly that
 * range, or a 200 of the whole object skipped into), `got.bytes` counting what landed, `hashed` kept
 * running; CORRUPT for another range, the status's error for any other answer, a transient error for a
 * broken connection. Once it settles nothing more lands in `out`.
 */
export async function receiveRangeRaw(pool: RawPool, conn: RawConnection, path: string, headers: Record<string, string>, start: number, objectSize: number, out: Buffer, what: string, limits: AttemptLimits, got: { bytes: number }, hashed: { crc32c: number } | null = null): Promise<void> {
  const request = requestBytes(pool.hostHeader, path, headers);
  // The attempt's silence runs from here, through any wait for a connection, as in undici's queue.
  const startedAt = performance.now();
  for (;;) {
    const s = await within(pool.acquire(), pool, conn, what, limits, startedAt);
    const reused = s.uses++ > 0;
    const outcome = await exchange(pool, s, conn, request, start, objectSize, out, what, limits, got, hashed, startedAt);
    // A kept-alive socket the server had closed as this request went out: nothing was answered, so
    // the request goes again (that socket is closed; another idle one, or a new one), as any HTTP
    // client does with a GET. A new connection that answers nothing is an error.
    if (outcome === 'unanswered' && reused) continue;
    if (outcome === 'unanswered') throw Object.assign(new Error(`${what}: the server closed the connection without answering`), { code: 'ECONNRESET' });
    return;
  }
}

/**
 * The socket `pending` gives, within the attempt's limits: waiting for a connection (the pool's limit,
 * or a connect that hangs) counts as the attempt's silence, as it does in undici's queue.
 */
function within(pending: Promise<RawSocket>, pool: RawPool, conn: RawConnection, what: string, limits: AttemptLimits, since: number): Promise<RawSocket> {
  return new Promise((resolve, reject) => {
    let done = false;
    const silence = watchSilence(limits, what, (err, silentMs) => {
      done = true;
      if (err instanceof StalledError) stalled(conn, what, silentMs, 0, 0);
      reject(err);
    }, since);
    pending.then(
      (s) => {
        silence.stop();
        // Given up on meanwhile: the socket is someone else's to use.
        if (done) pool.release(s, true);
        else resolve(s);
      },
      (err: Error) => {
        silence.stop();
        if (!done) reject(err);
      },
    );
  });
}

/** One request and its response on `s`: 'unanswered' when the connection ended before any byte came back. */
function exchange(pool: RawPool, s: RawSocket, conn: RawConnection, request: Buffer, start: number, objectSize: number, out: Buffer, what: string, limits: AttemptLimits, got: { bytes: number }, hashed: { crc32c: number } | null, since: number): Promise<'done' | 'unanswered'> {
  const stall = conn.stall;
  return new Promise((resolve, reject) => {
    const head = s.head;
    let headLen = 0;
    let phase: 'head' | 'body' | 'error' = 'head';
    let status = 0;
    let resHeaders: Headers = {};
    let bodyLength = -1; // -1: chunked, or until the connection ends
    let chunked = false;
    /** Whether the server keeps the connection after this response (HTTP/1.1 unless it says close; 1.0 only if it says keep-alive). */
    let persistent = false;
    let seen = 0; // body bytes read
    let skip = 0; // a 200's bytes before the window
    let errorText = '';
    let settled = false;
    let cutBy: Error | null = null;
    let lastAt = since;
    let longest = 0;
    const silence = watchSilence(limits, what, (err, silentMs) => {
      cutBy = err;
      if (err instanceof StalledError) stalled(conn, what, silentMs, got.bytes, status);
      settle(err, false);
    }, since);
    // The client's own limit on a silent response (undici's headersTimeout and bodyTimeout there).
    const timeout = watchSilence({ stallMs: pool.silenceMs, deadlineAt: Number.POSITIVE_INFINITY }, what, () => {
      const code = phase === 'head' ? 'UND_ERR_HEADERS_TIMEOUT' : 'UND_ERR_BODY_TIMEOUT';
      settle(Object.assign(new Error(`${what}: no bytes for ${pool.silenceMs} ms`), { code }), false);
    });
    const progressed = (): void => {
      const t = performance.now();
      if (t - lastAt > longest) longest = t - lastAt;
      lastAt = t;
      silence.progress();
      timeout.progress();
    };
    /** Ends the exchange; the socket goes back to the pool only when `reusable`, else it is closed now. */
    const settle = (err: Error | null, reusable: boolean, outcome: 'done' | 'unanswered' = 'done'): void => {
      if (settled) return;
      settled = true;
      silence.stop();
      timeout.stop();
      pool.release(s, reusable && persistent, keepAliveHint(resHeaders));
      if (!err && !cutBy && outcome === 'done') stall?.observe(longest);
      if (err) reject(err);
      else resolve(outcome);
    };
    const broken = (message: string): Error => Object.assign(new Error(`${what}: ${message}`), { code: 'UND_ERR_SOCKET' });

    /** Where the next read lands: the head buffer, the skipped part of a 200, the window, or the error text's scratch. */
    const next = (): Buffer => {
      if (phase === 'head') return head.subarray(headLen);
      if (phase === 'error') return head;
      const left = bodyLength - seen;
      if (seen < skip) return head.subarray(0, Math.min(head.length, skip - seen, left));
      return out.subarray(got.bytes, got.bytes + Math.min(out.length - got.bytes, left));
    };

    const headLanded = (n: number): void => {
      let from = Math.max(0, headLen - 3);
      headLen += n;
      for (;;) {
        const end = head.subarray(0, headLen).indexOf('\r\n\r\n', from, 'latin1');
        if (end < 0) {
          if (headLen >= head.length) settle(broken('a response head longer than 64 KiB'), false);
          return;
        }
        const parsed = parseHead(head.toString('latin1', 0, end));
        if (!parsed) return settle(broken('not an HTTP/1.1 response'), false);
        if (parsed.status >= 100 && parsed.status < 200 && parsed.status !== 101) {
          // An interim answer (103 Early Hints, say): the final one follows on the same connection.
          head.copy(head, 0, end + 4, headLen);
          headLen -= end + 4;
          from = 0;
          continue;
        }
        return headParsed(parsed, end + 4);
      }
    };

    const headParsed = (parsed: NonNullable<ReturnType<typeof parseHead>>, bodyAt: number): void => {
      status = parsed.status;
      resHeaders = parsed.headers;
      const connection = one(resHeaders.connection) ?? '';
      persistent = parsed.http10 ? /keep-alive/i.test(connection) : !/close/i.test(connection);
      chunked = /chunked/i.test(one(resHeaders['transfer-encoding']) ?? '');
      const length = chunked ? undefined : contentLength(resHeaders['content-length']);
      bodyLength = typeof length === 'number' ? length : -1;
      // Framed by the connection's end (or not to be trusted): it cannot carry another response.
      if (bodyLength < 0 && !chunked) persistent = false;
      const extra = head.subarray(bodyAt, headLen);
      if (status === 200 || status === 206) {
        const wrong = wrongRangeOf(status, resHeaders, start, out.length, objectSize);
        if (wrong !== null) return settle(new GcsError('CORRUPT', `${what}: the server sent ${wrong}`), false);
        if (bodyLength < 0) return settle(new RawFramingError(`${what}: a ${status} body not framed by a Content-Length`), false);
        // Content-Range said this range; a body of another length is a broken answer (undici: a short body).
        if (status === 206 && bodyLength !== out.length) return settle(broken(`Content-Length ${bodyLength} for a range of ${out.length}`), false);
        skip = status === 200 ? start : 0;
        phase = 'body';
        // Body bytes read with the head: through the same window as the rest.
        if (extra.length > bodyLength - seen) return settle(broken('more bytes than its Content-Length'), false);
        copyWindow(extra, seen, skip, out, got, hashed);
        seen += extra.length;
        bodyDone();
        return;
      }
      phase = 'error';
      if (status === 204 || status === 304) bodyLength = 0;
      errorLanded(extra);
    };

    const bodyDone = (): void => {
      if (got.bytes === out.length) settle(null, seen === bodyLength);
      else if (seen === bodyLength) settle(broken(`the body ended ${out.length - got.bytes} bytes short of the range`), true);
    };

    const errorLanded = (bytes: Buffer): void => {
      seen += bytes.length;
      if (errorText.length < ERROR_BODY_LIMIT) errorText += bytes.toString('utf8', 0, Math.min(bytes.length, ERROR_BODY_LIMIT));
      if (bodyLength >= 0 && seen >= bodyLength) settle(errorFromStatus(status, resHeaders['retry-after'], errorText, what), seen === bodyLength);
      else if (bodyLength < 0 && (errorText.length >= ERROR_BODY_LIMIT || /(^|\r\n)0\r\n\r\n$/.test(errorText))) {
        // Chunked or to the connection's end: what there is of the text, and the connection closed.
        settle(errorFromStatus(status, resHeaders['retry-after'], dechunk(errorText), what), false);
      }
    };

    const reader: Reader = {
      next,
      landed: (n) => {
        if (settled) return;
        progressed();
        if (phase === 'head') return headLanded(n);
        if (phase === 'error') return errorLanded(head.subarray(0, n));
        if (seen < skip) seen += n;
        else {
          if (hashed) hashed.crc32c = crc32c(out.subarray(got.bytes, got.bytes + n), hashed.crc32c);
          got.bytes += n;
          seen += n;
        }
        bodyDone();
      },
      ended: (err) => {
        if (settled) return;
        if (phase === 'head' && headLen === 0) return settle(null, false, 'unanswered');
        // An error body the connection ends: its status when that is how it was framed; a broken
        // connection when it was cut short of its length or last chunk (undici's answer too).
        if (phase === 'error' && bodyLength < 0 && !chunked) return settle(errorFromStatus(status, resHeaders['retry-after'], errorText, what), false);
        settle(broken(err ? `${(err as { code?: string }).code ?? 'ERR'} ${err.message}` : 'other side closed'), false);
      },
    };
    s.reader = reader;
    s.socket.write(request);
  });
}

/** A chunked error body's text without its chunk-size lines (best effort: it only goes into a message). */
function dechunk(text: string): string {
  return text.replace(/(^|\r\n)[0-9a-fA-F]+(;[^\r\n]*)?\r\n/g, '$1').replace(/\r\n$/, '');
}
