// One range GET on a download worker's own sockets (raw-pool.ts), the body read by the kernel straight
// into the block's memory (raw-exchange.ts). Measured on this project's machine (/work/probe/onread.mjs:
// 1 GiB as 4 MiB ranges from the emulator, one thread): 0.61-0.76 CPU-s per GiB against 2.2-3.1 through
// undici, whose socket is read 64 KiB at a time through a Node stream, parsed by llhttp and copied once
// more. Only what a media range needs is spoken: HTTP/1.1, a body framed by Content-Length; anything
// else (a chunked range body) is refused with RawFramingError before a byte lands, and the caller asks
// undici instead.
import { StalledError, watchSilence, type AttemptLimits } from './attempt-limits.js';
import { stalled } from './range-body.js';
import { RangeExchange, type Outcome, type RawConnection } from './raw-exchange.js';
import { requestBytes } from './raw-http.js';
import type { RawPool, RawSocket } from './raw-pool.js';

export { RawFramingError, parseHead, contentLength } from './raw-http.js';
export type { RawConnection } from './raw-exchange.js';

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
    const outcome = await new Promise<Outcome>((resolve, reject) => {
      const exchange = new RangeExchange(pool, s, conn, { start, objectSize, out, got, hashed, what }, limits, startedAt, (err, how) => (err ? reject(err) : resolve(how)));
      exchange.send(request);
    });
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

