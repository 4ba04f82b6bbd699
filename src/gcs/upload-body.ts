// The silence limit of a request that sends a body (an upload chunk).

/** The slowest sending a request body is allowed before its silence limit may cut it: 1 MiB/s. */
const MIN_SEND_BYTES_PER_SEC = 1024 * 1024;

/**
 * The silence limit of a request sending `bytes`: --http-client-timeout (`baseMs`; 0: undici's own)
 * plus the time the body may take at 1 MiB/s. undici starts a request's headers timer when it
 * dispatches it and restarts it only on writes that back up the socket; a Buffer body is one write, and
 * bytes in the kernel's socket buffers (megabytes, autotuned) are progress it cannot see: the wait for
 * GCS's answer starts, for undici, while the body is still going out, and a slow link had every chunk
 * cut though GCS was never silent. (Sending the body in pieces let the timer follow the send only as
 * far as the kernel's buffers allowed, and cost 0.2 daemon CPU-s per uploaded GiB: not done.)
 */
export function sendTimeoutMs(baseMs: number, bytes: number): number | undefined {
  return baseMs > 0 ? baseMs + Math.ceil((bytes / MIN_SEND_BYTES_PER_SEC) * 1000) : undefined;
}
