import pino, { type Logger } from 'pino';
import { LogRotation, type LogRotationConfig } from './log-rotation.js';
import { textDestination } from './log-text.js';
import { SYSLOG_SEVERITY_OF_LEVEL, type Syslog } from './syslog.js';

export type { Logger };

/** gcsfuse's severities, mapped onto pino levels. OFF silences everything. */
export const SEVERITIES = ['trace', 'debug', 'info', 'warning', 'error', 'off'] as const;
export type Severity = (typeof SEVERITIES)[number];

const PINO_LEVEL: Record<Severity, string> = {
  trace: 'trace',
  debug: 'debug',
  info: 'info',
  warning: 'warn',
  error: 'error',
  off: 'silent',
};

export function severityFrom(text: string): Severity {
  const s = text.toLowerCase() === 'warn' ? 'warning' : text.toLowerCase();
  if ((SEVERITIES as readonly string[]).includes(s)) return s as Severity;
  throw new Error(`unknown log severity "${text}": one of ${SEVERITIES.join(', ')}`);
}

export interface LoggerConfig {
  severity: Severity;
  /** A file to append to; null means stderr. */
  file: string | null;
  /** gcsfuse's --log-format: JSON lines, or `key=value` text lines. */
  format?: 'json' | 'text';
  /** Rotation of `file` by size (gcsfuse's `logging.log-rotate`); none when absent. */
  rotation?: LogRotationConfig;
  /** Without a file: the lines go to syslog instead of stderr (a daemon in the background, as gcsfuse's). */
  syslog?: Syslog | null;
}

/** Log bytes held while the log's disk refuses writes (full, or failing); lines past this are dropped, and counted. */
const LOG_BACKLOG_BYTES = 1024 * 1024;
const LOG_RETRY_MS = 2_000;

export interface DaemonLogger {
  log: Logger;
  /** Reopens the log file after logrotate moved it (on SIGHUP). */
  reopen(): void;
  /** Log lines dropped so far because the log could not be written. */
  lostLines(): number;
  /** The gzips and clean-ups of rotated logs, finished. */
  rotationsSettled(): Promise<void>;
}

export function createLogger(cfg: LoggerConfig): DaemonLogger {
  if (!cfg.file && cfg.syslog) return syslogLogger(cfg, cfg.syslog);
  // Synchronous writes: a daemon that is SIGKILLed should leave its last lines in the log.
  const dest = pino.destination({ dest: cfg.file ?? 2, sync: true, mkdir: true, maxLength: LOG_BACKLOG_BYTES });
  const log = pino({ level: PINO_LEVEL[cfg.severity], base: { pid: process.pid } }, cfg.format === 'text' ? textDestination(dest) : dest);
  // A write error (ENOSPC on a full disk) is emitted as 'error', which throws into whatever called the
  // logger when nobody listens: a read that logs would fail with EIO because the log's disk is full. The
  // unwritten lines stay buffered and go out with the next write; past the backlog they are dropped.
  // A quiet daemon may log nothing more for hours: the backlog is tried again every few seconds.
  let lost = 0;
  let reportedLost = 0;
  let failure: string | null = null;
  let retry: NodeJS.Timeout | null = null;
  dest.on('error', (err: NodeJS.ErrnoException) => {
    failure ??= err.code ?? err.message;
    retry ??= setTimeout(() => {
      retry = null;
      try {
        dest.write('');
      } catch {
        // Destroyed meanwhile (the daemon is exiting): nothing left to write to.
      }
    }, LOG_RETRY_MS).unref();
  });
  dest.on('drop', () => lost++);
  dest.on('write', () => {
    if (failure === null) return;
    const cause = failure;
    failure = null;
    // Not from inside the destination's own write: the line goes out once this write has finished.
    setImmediate(() => {
      log.warn({ cause, lostLines: lost - reportedLost }, 'the log could not be written for a while; lines past the backlog were dropped');
      reportedLost = lost;
    });
  });
  const rotation = cfg.file && cfg.rotation ? new LogRotation(cfg.file, cfg.rotation, dest, (fields, msg) => setImmediate(() => log.warn(fields, msg))) : null;
  if (rotation) dest.on('write', (n: number) => rotation.wrote(n));
  const reopen = (): void => {
    if (!cfg.file) return;
    try {
      dest.reopen();
    } catch (err) {
      // The old descriptor stays (sonic-boom keeps it): lines go on where they went; said once there.
      setImmediate(() => log.warn({ err: String(err) }, 'the log file could not be reopened; writing on to the one open'));
    }
    rotation?.reopened();
  };
  return { log, reopen, lostLines: () => lost, rotationsSettled: () => rotation?.settled() ?? Promise.resolve() };
}

/** The log as syslog lines, each level at its syslog severity (`journalctl -p err` shows the errors). */
function syslogLogger(cfg: LoggerConfig, syslog: Syslog): DaemonLogger {
  const streams = SYSLOG_SEVERITY_OF_LEVEL.map(({ level, severity }) => {
    const dest = syslog.severity(severity);
    return { level, stream: cfg.format === 'text' ? textDestination(dest) : dest };
  });
  const log = pino({ level: PINO_LEVEL[cfg.severity], base: { pid: process.pid } }, pino.multistream(streams, { dedupe: true }));
  return { log, reopen: () => undefined, lostLines: () => syslog.lost, rotationsSettled: () => Promise.resolve() };
}

export const silentLogger: Logger = pino({ level: 'silent' });

/** Logs a condition the first time a key is seen, so a bad object name read a million times costs one line. */
export class OnceLog {
  private readonly seen = new Set<string>();
  constructor(private readonly log: Logger, private readonly limit = 10_000) {}

  warn(key: string, fields: Record<string, unknown>, msg: string): void {
    if (this.seen.has(key) || this.seen.size >= this.limit) return;
    this.seen.add(key);
    this.log.warn(fields, msg);
  }
}
