import { constants } from 'node:os';
import { GcsError, type GcsErrorCode } from '../gcs/errors.js';

const E = constants.errno;

/** Errno numbers (positive), as the kernel is answered with them. */
export const Errno = {
  ENOENT: E.ENOENT,
  EIO: E.EIO,
  EACCES: E.EACCES,
  EROFS: E.EROFS,
  EISDIR: E.EISDIR,
  ENOTDIR: E.ENOTDIR,
  EBADF: E.EBADF,
  ESTALE: E.ESTALE,
  ENOSYS: E.ENOSYS,
  EINVAL: E.EINVAL,
  ENAMETOOLONG: E.ENAMETOOLONG,
} as const;

/** The one place a failure becomes an errno. Exhaustive: a new code will not compile until mapped. */
function errnoForCode(code: GcsErrorCode): number {
  switch (code) {
    case 'NOT_FOUND':
      return Errno.ENOENT;
    case 'FORBIDDEN':
    case 'UNAUTHENTICATED':
      return Errno.EACCES;
    case 'PRECONDITION':
      return Errno.ESTALE;
    case 'RANGE':
    case 'INVALID':
    case 'TRANSIENT':
    case 'CORRUPT':
    case 'CLOSED':
      return Errno.EIO;
    default: {
      const unreachable: never = code;
      return unreachable;
    }
  }
}

/**
 * Errno for a failed read of an open file, as gcsfuse answers it: ESTALE when the generation it opened is
 * gone (changed or deleted under it: a stale file handle, not "no such file", since the file was there),
 * EACCES when GCS refuses the credentials, EIO for anything else.
 */
export function readErrno(err: unknown): number {
  if (!(err instanceof GcsError)) return Errno.EIO;
  if (err.code === 'NOT_FOUND') return Errno.ESTALE;
  if (err.code === 'FORBIDDEN' || err.code === 'UNAUTHENTICATED') return Errno.EACCES;
  return Errno.EIO;
}

/** Errno for a failed metadata operation (a read of an open file: readErrno). */
export function errnoFor(err: unknown): number {
  return err instanceof GcsError ? errnoForCode(err.code) : Errno.EIO;
}
