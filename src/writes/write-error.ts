import { GcsError } from '../gcs/errors.js';

/** Why a write or close failed, as the kernel is to be told. */
export class WriteError extends Error {
  constructor(
    readonly errno: 'ESTALE' | 'EIO' | 'ENOSPC' | 'EFBIG',
    message: string,
  ) {
    super(message);
  }
}

/** A change the mount refuses, with the errno the kernel gets. */
export class RefusedError extends Error {
  constructor(
    readonly errno: 'EEXIST' | 'ENOTEMPTY' | 'ENOENT' | 'EMFILE' | 'EISDIR' | 'ENOTDIR' | 'ESTALE',
    message: string,
  ) {
    super(message);
  }
}

/** A 412: the object changed hands since the file was opened (ESTALE, the other writer's object kept). */
export function isPrecondition(err: unknown): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === 'PRECONDITION';
}

/** The errno a failed write-side operation answers with. */
export function writeErrno(err: unknown): string {
  if (err instanceof RefusedError || err instanceof WriteError) return err.errno;
  if (err instanceof GcsError) {
    if (err.code === 'NOT_FOUND') return 'ENOENT';
    if (err.code === 'FORBIDDEN' || err.code === 'UNAUTHENTICATED') return 'EACCES';
    if (err.code === 'PRECONDITION') return 'ESTALE';
  }
  return 'EIO';
}
