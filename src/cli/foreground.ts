import type { FuseMount } from '../fs/mount.js';
import { CredentialsError } from '../gcs/auth.js';
import { GcsError } from '../gcs/errors.js';
import { MountPointError } from '../fs/mount.js';
import { PrivateDirError } from '../private-dir.js';
import { createLogger, severityFrom } from '../observe/logger.js';
import { Syslog, SYSLOG_SOCKET } from '../observe/syslog.js';
import { reportToParent } from './daemon.js';
import { StartInterruptedError } from './gcs-wiring.js';
import { EXIT, UserError } from './exit.js';
import type { MountOptions } from './options.js';
import { startDaemon } from './wiring.js';

/** Start-up failures the user can act on, as one line each with their own exit code. */
function asUserError(err: unknown, bucket: string): UserError | null {
  if (err instanceof UserError) return err;
  if (err instanceof MountPointError) return new UserError(err.message, EXIT.mountPoint);
  // The cache dir's, or the control socket's runtime dir: private state in a folder that is not private.
  if (err instanceof PrivateDirError) return new UserError(err.message, EXIT.cacheDir);
  if (err instanceof CredentialsError) return new UserError(err.message, EXIT.credentials);
  // Stopped (systemctl stop, Ctrl-C) while the bucket check retried: a stop asked for, not a failure.
  if (err instanceof StartInterruptedError) return new UserError(err.message, EXIT.ok);
  if (err instanceof GcsError) {
    if (err.code === 'NOT_FOUND') return new UserError(`bucket ${bucket} does not exist`, EXIT.bucket);
    if (err.code === 'FORBIDDEN') return new UserError(`no access to bucket ${bucket}: ${err.message}`, EXIT.credentials);
    if (err.code === 'UNAUTHENTICATED') return new UserError(`credentials rejected for bucket ${bucket}: ${err.message}`, EXIT.credentials);
    // GCS says so only in its message (status 400, reason "required"): the flag is what the user needs.
    if (err.status === 400 && /requester pays/i.test(err.message)) return new UserError(`bucket ${bucket} is a Requester Pays bucket: name the project to bill with --billing-project (${err.message})`, EXIT.bucket);
    return new UserError(`cannot reach bucket ${bucket}: ${err.message}`, EXIT.bucket);
  }
  return null;
}

/** The daemon's life in this process: mount, serve until a signal or the mount's removal, stop cleanly. */
export async function runForeground(opts: MountOptions): Promise<number> {
  const { log, reopen, lostLines, rotationsSettled } = createLogger({
    severity: severityFrom(opts.values['log-severity']),
    file: opts.values['log-file'] || null,
    // In the background without a log file (stderr is /dev/null there), as gcsfuse: syslog, where there is one.
    syslog: !opts.values['log-file'] && process.env.GCSMOUNT_DAEMONIZED === '1' ? Syslog.open(process.env.GCSMOUNT_SYSLOG_SOCKET || SYSLOG_SOCKET) : null,
    format: opts.values['log-format'] === 'text' ? 'text' : 'json',
    rotation: {
      maxBytes: opts.values['log-rotate-max-file-size-mb'] * 2 ** 20,
      backups: opts.values['log-rotate-backup-file-count'],
      compress: opts.values['log-rotate-compress'],
    },
  });
  for (const notice of opts.notices) log.warn({ notice }, notice);
  // A promise that fails with nobody listening would end Node 20 at once, silently (a daemon's stderr
  // goes nowhere): seen while stopping, as the GCS client failed its attempts in flight, so the block
  // cache's index and the final counters were never written. Logged instead, with what it was.
  process.on('unhandledRejection', (reason) => {
    log.error({ err: reason instanceof Error ? (reason.stack ?? reason.message) : String(reason) }, 'a failure nobody waited for (logged, not fatal)');
  });
  // logrotate moves the file and sends SIGHUP: write to a fresh file from here on.
  process.on('SIGHUP', () => {
    reopen();
    log.info('log file reopened');
  });

  // Signals are taken from the first moment: one that arrives while mounting is acted on once the
  // mount is up, so it still ends in a clean unmount rather than the default kill; while the bucket
  // check retries (a throttled bucket, up to --startup-check-timeout) it stops the start there.
  let pendingSignal: string | null = null;
  let onSignal: ((why: string) => void) | null = null;
  const starting = new AbortController();
  const signalled = (sig: string): void => {
    if (onSignal) onSignal(sig);
    else if (pendingSignal) process.exit(EXIT.internal);
    else {
      pendingSignal = sig;
      starting.abort();
    }
  };
  process.on('SIGINT', () => signalled('SIGINT'));
  process.on('SIGTERM', () => signalled('SIGTERM'));

  let mount: FuseMount;
  let stop: () => Promise<void>;
  try {
    ({ mount, stop } = await startDaemon(opts, log, lostLines, starting.signal));
  } catch (err) {
    const userError = asUserError(err, opts.bucket);
    const message = userError?.message ?? `start-up failed: ${err instanceof Error ? err.message : String(err)}`;
    log.error({ err: err instanceof Error ? err.message : String(err) }, message);
    const exitCode = userError?.exitCode ?? EXIT.internal;
    reportToParent({ type: 'error', message, exitCode });
    throw new UserError(message, exitCode);
  }
  log.info({ bucket: opts.bucket, mountPoint: mount.path }, 'mounted');
  reportToParent({ type: 'ready', mountPoint: mount.path });

  return new Promise<number>((resolve) => {
    let stopping = false;
    const shutdown = (why: string): void => {
      if (stopping) {
        // A second signal means now: the mount is left for the next start to clean up.
        log.warn({ why }, 'second signal: exiting at once');
        process.exit(EXIT.internal);
      }
      stopping = true;
      log.info({ why }, 'unmounting');
      // A rotated log being gzipped is finished first: otherwise it is left as a backup and half a gzip.
      stop().then(
        () => rotationsSettled().then(() => resolve(EXIT.ok)),
        (err: Error) => {
          log.error({ err: err.message }, 'clean shutdown failed');
          resolve(EXIT.internal);
        },
      );
    };
    onSignal = shutdown;
    // The kernel ends the session once nothing holds the mount: after a lazy unmount (umount -l), the
    // files still open are served until they close, and the daemon stops only then.
    mount.watch(
      () => shutdown('mount removed from outside'),
      () => log.info('mount detached (lazy unmount): serving the files still open until the last one closes'),
    );
    if (pendingSignal) shutdown(pendingSignal);
  });
}
