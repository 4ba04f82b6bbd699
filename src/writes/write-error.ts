/** Why a write or close failed, as the kernel is to be told. */
export class WriteError extends Error {
  constructor(
    readonly errno: 'ESTALE' | 'EIO' | 'ENOSPC' | 'EFBIG',
    message: string,
  ) {
    super(message);
  }
}

/** A 412: the object changed hands since the file was opened (ESTALE, the other writer's object kept). */
export function isPrecondition(err: unknown): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === 'PRECONDITION';
}
