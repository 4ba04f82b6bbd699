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
 * Errno for a failed metadata operation. Data reads are different: a reader of an open file can only be
 * told EIO (the file it opened existed), so `read` uses EIO for everything.
 */
export function errnoFor(err: unknown): number {
  return err instanceof GcsError ? errnoForCode(err.code) : Errno.EIO;
}
