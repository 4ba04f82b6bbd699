// How a request body goes to undici: large ones in pieces, so undici's silence limit measures silence.
import { Readable } from 'node:stream';

/** The piece size: each write of one that backs up the socket restarts undici's headers timer. */
const PIECE_BYTES = 256 * 1024;

/**
 * `body` as pieces of at most 256 KiB for undici. undici starts a request's headers timer
 * (--http-client-timeout) when it dispatches the request and restarts it only on writes that back up the
 * socket: a Buffer is one write, so the timer ran while a 32 MiB upload chunk was still going out, and a
 * link slower than the chunk over the timeout had every attempt cut though GCS was never silent. Written
 * piece by piece (after each drain), the timer measures the time without progress: the send's, then
 * GCS's answer's. Small bodies are sent as they are.
 */
export function pieces(body: Buffer): Buffer | Readable {
  if (body.length <= PIECE_BYTES) return body;
  function* each(): Generator<Buffer> {
    for (let at = 0; at < body.length; at += PIECE_BYTES) yield body.subarray(at, Math.min(body.length, at + PIECE_BYTES));
  }
  return Readable.from(each(), { objectMode: false, highWaterMark: PIECE_BYTES });
}

/** The slowest sending a request body is allowed before its silence limit may cut it: 1 MiB/s. */
const MIN_SEND_BYTES_PER_SEC = 1024 * 1024;

/**
 * The silence limit of a request sending `bytes`: --http-client-timeout (`baseMs`; 0: undici's own)
 * plus the time the body may take at 1 MiB/s. The bytes the kernel has taken into its socket buffers
 * (megabytes, autotuned) are progress undici cannot see: the wait for GCS's answer starts, for undici,
 * while they are still going out, and a slow link had every chunk cut though GCS was never silent.
 */
export function sendTimeoutMs(baseMs: number, bytes: number): number | undefined {
  return baseMs > 0 ? baseMs + Math.ceil((bytes / MIN_SEND_BYTES_PER_SEC) * 1000) : undefined;
}
