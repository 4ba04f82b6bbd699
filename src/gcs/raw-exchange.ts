// One request and its response on a download worker's socket (raw-pool.ts): the head read into the
// socket's head buffer, the body read by the kernel straight into the caller's memory (raw-range.ts
// makes the attempt of it: a connection, and a retry where a kept-alive one was lost).
import { crc32c } from '../crc32c.js';
import { StalledError, watchSilence, type AttemptLimits } from './attempt-limits.js';
import { GcsError } from './errors.js';
import { copyWindow, stalled, wrongRangeOf, type RangeConnection } from './range-body.js';
import type { RawPool, RawSocket, Reader } from './raw-pool.js';
import { contentLength, dechunk, keepAliveHint, one, parseHead, RawFramingError, type Headers } from './raw-http.js';
import { ERROR_BODY_LIMIT, errorFromStatus } from './responses.js';

/** Where the attempt's stalls are observed, counted and logged (recorders on a download worker). */
export type RawConnection = Pick<RangeConnection, 'stall' | 'metrics' | 'log'>;

/** What one exchange fills: `out` from `start` of an object of `objectSize` bytes. */
export interface RangeTarget {
  start: number;
  objectSize: number;
  out: Buffer;
  got: { bytes: number };
  hashed: { crc32c: number } | null;
  what: string;
}

/** How an exchange ended well: the range landed, or the connection ended before any byte came back. */
export type Outcome = 'done' | 'unanswered';

/**
 * The socket's reader while the request is out. Every way it settles either closes the socket or
 * leaves the pool pointing its next read at the socket's own head buffer (release() clears the
 * reader before Node asks for the next buffer), so nothing lands in `out` once it has settled.
 */
export class RangeExchange implements Reader {
  private readonly head: Buffer;
  private headLen = 0;
  private phase: 'head' | 'body' | 'error' = 'head';
  private status = 0;
  private headers: Headers = {};
  /** -1: chunked, or until the connection ends. */
  private bodyLength = -1;
  private chunked = false;
  /** Whether the server keeps the connection after this response (HTTP/1.1 unless it says close; 1.0 only if it says keep-alive). */
  private persistent = false;
  /** Body bytes read, and a 200's bytes before the window. */
  private seen = 0;
  private skip = 0;
  private errorText = '';
  private settled = false;
  private cutBy: Error | null = null;
  private lastAt: number;
  private longest = 0;
  private readonly silence: ReturnType<typeof watchSilence>;
  /** The client's own limit on a silent response (undici's headersTimeout and bodyTimeout there). */
  private readonly timeout: ReturnType<typeof watchSilence>;

  /** Sends `request` on `s`; `done` hears how it ended (once). `since`: when the attempt's silence began. */
  constructor(
    private readonly pool: RawPool,
    private readonly s: RawSocket,
    private readonly conn: RawConnection,
    private readonly t: RangeTarget,
    limits: AttemptLimits,
    since: number,
    private readonly done: (err: Error | null, outcome: Outcome) => void,
  ) {
    this.head = s.head;
    this.lastAt = since;
    this.silence = watchSilence(limits, t.what, (err, silentMs) => {
      this.cutBy = err;
      if (err instanceof StalledError) stalled(conn, t.what, silentMs, t.got.bytes, this.status);
      this.settle(err, false);
    }, since);
    this.timeout = watchSilence({ stallMs: pool.silenceMs, deadlineAt: Number.POSITIVE_INFINITY }, t.what, () => {
      const code = this.phase === 'head' ? 'UND_ERR_HEADERS_TIMEOUT' : 'UND_ERR_BODY_TIMEOUT';
      this.settle(Object.assign(new Error(`${t.what}: no bytes for ${pool.silenceMs} ms`), { code }), false);
    });
  }

  send(request: Buffer): void {
    this.s.reader = this;
    this.s.socket.write(request);
  }

  /** Where the next read lands: the head buffer, the skipped part of a 200, the window, or the error text's scratch. */
  next(): Buffer {
    if (this.phase === 'head') return this.head.subarray(this.headLen);
    if (this.phase === 'error') return this.head;
    const { out, got } = this.t;
    const left = this.bodyLength - this.seen;
    if (this.seen < this.skip) return this.head.subarray(0, Math.min(this.head.length, this.skip - this.seen, left));
    return out.subarray(got.bytes, got.bytes + Math.min(out.length - got.bytes, left));
  }

  landed(n: number): void {
    if (this.settled) return;
    this.progressed();
    if (this.phase === 'head') return this.headLanded(n);
    if (this.phase === 'error') return this.errorLanded(this.head.subarray(0, n));
    const { out, got, hashed } = this.t;
    if (this.seen < this.skip) this.seen += n;
    else {
      if (hashed) hashed.crc32c = crc32c(out.subarray(got.bytes, got.bytes + n), hashed.crc32c);
      got.bytes += n;
      this.seen += n;
    }
    this.bodyDone();
  }

  ended(err: Error | null): void {
    if (this.settled) return;
    if (this.phase === 'head' && this.headLen === 0) return this.settle(null, false, 'unanswered');
    // An error body the connection ends: its status when that is how it was framed; a broken
    // connection when it was cut short of its length or last chunk (undici's answer too).
    if (this.phase === 'error' && this.bodyLength < 0 && !this.chunked) return this.settle(this.statusError(this.errorText), false);
    this.settle(this.broken(err ? `${(err as { code?: string }).code ?? 'ERR'} ${err.message}` : 'other side closed'), false);
  }

  private progressed(): void {
    const t = performance.now();
    if (t - this.lastAt > this.longest) this.longest = t - this.lastAt;
    this.lastAt = t;
    this.silence.progress();
    this.timeout.progress();
  }

  /** Ends the exchange; the socket goes back to the pool only when `reusable`, else it is closed now. */
  private settle(err: Error | null, reusable: boolean, outcome: Outcome = 'done'): void {
    if (this.settled) return;
    this.settled = true;
    this.silence.stop();
    this.timeout.stop();
    this.pool.release(this.s, reusable && this.persistent, keepAliveHint(this.headers));
    if (!err && !this.cutBy && outcome === 'done') this.conn.stall?.observe(this.longest);
    this.done(err, outcome);
  }

  private broken(message: string): Error {
    return Object.assign(new Error(`${this.t.what}: ${message}`), { code: 'UND_ERR_SOCKET' });
  }

  private statusError(text: string): GcsError {
    return errorFromStatus(this.status, this.headers['retry-after'], text, this.t.what);
  }

  private headLanded(n: number): void {
    const head = this.head;
    let from = Math.max(0, this.headLen - 3);
    this.headLen += n;
    for (;;) {
      const end = head.subarray(0, this.headLen).indexOf('\r\n\r\n', from, 'latin1');
      if (end < 0) {
        if (this.headLen >= head.length) this.settle(this.broken('a response head longer than 64 KiB'), false);
        return;
      }
      const parsed = parseHead(head.toString('latin1', 0, end));
      if (!parsed) return this.settle(this.broken('not an HTTP/1.1 response'), false);
      if (parsed.status >= 100 && parsed.status < 200 && parsed.status !== 101) {
        // An interim answer (103 Early Hints, say): the final one follows on the same connection.
        head.copy(head, 0, end + 4, this.headLen);
        this.headLen -= end + 4;
        from = 0;
        continue;
      }
      return this.headParsed(parsed, end + 4);
    }
  }

  private headParsed(parsed: NonNullable<ReturnType<typeof parseHead>>, bodyAt: number): void {
    const { start, objectSize, out, got, hashed, what } = this.t;
    this.status = parsed.status;
    this.headers = parsed.headers;
    const connection = one(this.headers.connection) ?? '';
    this.persistent = parsed.http10 ? /keep-alive/i.test(connection) : !/close/i.test(connection);
    this.chunked = /chunked/i.test(one(this.headers['transfer-encoding']) ?? '');
    const length = this.chunked ? undefined : contentLength(this.headers['content-length']);
    this.bodyLength = typeof length === 'number' ? length : -1;
    // Framed by the connection's end (or not to be trusted): it cannot carry another response.
    if (this.bodyLength < 0 && !this.chunked) this.persistent = false;
    const extra = this.head.subarray(bodyAt, this.headLen);
    const status = this.status;
    if (status !== 200 && status !== 206) {
      this.phase = 'error';
      if (status === 204 || status === 304) this.bodyLength = 0;
      return this.errorLanded(extra);
    }
    const wrong = wrongRangeOf(status, this.headers, start, out.length, objectSize);
    if (wrong !== null) return this.settle(new GcsError('CORRUPT', `${what}: the server sent ${wrong}`), false);
    if (this.bodyLength < 0) return this.settle(new RawFramingError(`${what}: a ${status} body not framed by a Content-Length`), false);
    // Content-Range said this range; a body of another length is a broken answer (undici: a short body).
    if (status === 206 && this.bodyLength !== out.length) return this.settle(this.broken(`Content-Length ${this.bodyLength} for a range of ${out.length}`), false);
    this.skip = status === 200 ? start : 0;
    this.phase = 'body';
    // Body bytes read with the head: through the same window as the rest.
    if (extra.length > this.bodyLength) return this.settle(this.broken('more bytes than its Content-Length'), false);
    copyWindow(extra, this.seen, this.skip, out, got, hashed);
    this.seen += extra.length;
    this.bodyDone();
  }

  private bodyDone(): void {
    const { out, got } = this.t;
    if (got.bytes === out.length) this.settle(null, this.seen === this.bodyLength);
    else if (this.seen === this.bodyLength) this.settle(this.broken(`the body ended ${out.length - got.bytes} bytes short of the range`), true);
  }

  private errorLanded(bytes: Buffer): void {
    this.seen += bytes.length;
    if (this.errorText.length < ERROR_BODY_LIMIT) this.errorText += bytes.toString('utf8', 0, Math.min(bytes.length, ERROR_BODY_LIMIT));
    if (this.bodyLength >= 0 && this.seen >= this.bodyLength) this.settle(this.statusError(this.errorText), this.seen === this.bodyLength);
    else if (this.bodyLength < 0 && (this.errorText.length >= ERROR_BODY_LIMIT || /(^|\r\n)0\r\n\r\n$/.test(this.errorText))) {
      // Chunked or to the connection's end: what there is of the text, and the connection closed.
      this.settle(this.statusError(dechunk(this.errorText)), false);
    }
  }
}
