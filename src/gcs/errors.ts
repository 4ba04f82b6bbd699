/**
 * Every failure of the object store gets a stable code here, where it starts. Layers above switch on the
 * code, never on message text; fs/errno.ts is the one place that turns a code into an errno.
 */
export type GcsErrorCode =
  | 'NOT_FOUND' // 404: object, generation or bucket does not exist
  | 'FORBIDDEN' // 403: credentials valid, access denied
  | 'UNAUTHENTICATED' // 401: credentials missing or rejected
  | 'PRECONDITION' // 412: generation changed under us
  | 'RANGE' // 416: range past the end of the object
  | 'INVALID' // 400 and other permanent client errors
  | 'TRANSIENT' // 408, 429, 5xx, resets, timeouts, short bodies: worth retrying
  | 'CORRUPT' // bytes that fail their checksum, or a response that cannot be the bytes asked for
  | 'CLOSED'; // the client was closed (the daemon is stopping): not a fault of GCS, never retried

export class GcsError extends Error {
  override readonly name = 'GcsError';
  constructor(
    readonly code: GcsErrorCode,
    message: string,
    readonly status: number | null = null,
    /** Seconds the server asked us to wait (Retry-After), when it said so. */
    readonly retryAfterSeconds: number | null = null,
  ) {
    super(message);
  }
}

export function codeForStatus(status: number): GcsErrorCode {
  if (status === 404) return 'NOT_FOUND';
  if (status === 403) return 'FORBIDDEN';
  if (status === 401) return 'UNAUTHENTICATED';
  if (status === 412) return 'PRECONDITION';
  if (status === 416) return 'RANGE';
  if (status === 408 || status === 429 || status >= 500) return 'TRANSIENT';
  return 'INVALID';
}

export function isGcsError(err: unknown, code?: GcsErrorCode): err is GcsError {
  return err instanceof GcsError && (code === undefined || err.code === code);
}

/**
 * A resumable session GCS no longer knows (expired after about a week, or cancelled): 404 or 410. The
 * upload must start again from a new session; code NOT_FOUND, told apart from a missing object by class.
 */
export class UploadSessionExpiredError extends GcsError {
  constructor(what: string, status: number) {
    super('NOT_FOUND', `${what}: upload session expired or unknown (HTTP ${status})`, status);
  }
}

/** GCS holds fewer bytes of a session than a chunk starts at: the caller must resend from `committed`. */
export class UploadOffsetError extends GcsError {
  constructor(
    what: string,
    readonly committed: number,
  ) {
    super('INVALID', `${what}: GCS has committed only ${committed} bytes, before this chunk's start`);
  }
}

export function isSessionExpired(err: unknown): err is UploadSessionExpiredError {
  return err instanceof UploadSessionExpiredError;
}
