import pino, { type Logger } from 'pino';
import { textDestination } from './log-text.js';

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
}

/** A logger, and how to reopen its file after logrotate moved it (on SIGHUP). */
export function createLogger(cfg: LoggerConfig): { log: Logger; reopen(): void } {
  // Synchronous writes: a daemon that is SIGKILLed should leave its last lines in the log.
  const dest = pino.destination({ dest: cfg.file ?? 2, sync: true, mkdir: true });
  const log = pino({ level: PINO_LEVEL[cfg.severity], base: { pid: process.pid } }, cfg.format === 'text' ? textDestination(dest) : dest);
  return { log, reopen: () => (cfg.file ? dest.reopen() : undefined) };
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
