/** Exit codes, stable for scripts and systemd: each bad-input class gets its own. */
export const EXIT = {
  ok: 0,
  internal: 1,
  usage: 2,
  mountPoint: 3,
  bucket: 4,
  credentials: 5,
  cacheDir: 6,
} as const;

export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

/** A problem the user can fix; printed as one line, never with a stack trace. */
export class UserError extends Error {
  override readonly name = 'UserError';
  constructor(message: string, readonly exitCode: ExitCode) {
    super(message);
  }
}
