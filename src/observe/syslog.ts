import { optionalAddon } from '../native-addon.js';

/**
 * The daemon's log sent to syslog, as gcsfuse logs when it runs in the background without a log file
 * (facility local7, tag `gcsmount`): `journalctl -t gcsmount` or rsyslog's files show it. Each line is
 * one datagram to the system's log socket (/dev/log), `<PRI>TIME gcsmount[PID]: LINE`, sent without
 * waiting: a syslog too busy to take a line now loses it (counted), the daemon never stalls on it.
 */
interface LogSocketAddon {
  logSocketOpen(path: string): number;
  logSocketSend(fd: number, line: Buffer): number;
}

/** The system's log socket. */
export const SYSLOG_SOCKET = '/dev/log';

/** local7, gcsfuse's facility. */
const FACILITY = 23;

/** rsyslog's default largest message; a longer line is cut there. */
const MAX_DATAGRAM = 8192;

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];

/** RFC 3164's timestamp, `Mmm dd hh:mm:ss` in local time (what syslog(3) sends). */
function stamp(d: Date): string {
  const two = (n: number) => String(n).padStart(2, '0');
  return `${MONTHS[d.getMonth()]} ${String(d.getDate()).padStart(2, ' ')} ${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}

export class Syslog {
  /** Lines the socket did not take (full, or gone). */
  lost = 0;

  private constructor(
    private readonly addon: LogSocketAddon,
    private readonly fd: number,
  ) {}

  /** Connects to `path`; null when there is no such socket (no syslog here: the log goes nowhere, as gcsfuse's). */
  static open(path = SYSLOG_SOCKET): Syslog | null {
    const addon = optionalAddon() as Partial<LogSocketAddon>;
    if (typeof addon.logSocketOpen !== 'function' || typeof addon.logSocketSend !== 'function') return null;
    const fd = addon.logSocketOpen(path);
    return fd < 0 ? null : new Syslog(addon as LogSocketAddon, fd);
  }

  /** A pino destination for the lines of one syslog severity (0 emergency .. 7 debug). */
  severity(severity: number): { write(line: string): void } {
    const prefix = `<${FACILITY * 8 + severity}>`;
    return { write: (line) => this.send(prefix, line) };
  }

  private send(prefix: string, line: string): void {
    const text = `${prefix}${stamp(new Date())} gcsmount[${process.pid}]: ${line.endsWith('\n') ? line.slice(0, -1) : line}`;
    let bytes = Buffer.from(text, 'utf8');
    if (bytes.length > MAX_DATAGRAM) bytes = bytes.subarray(0, MAX_DATAGRAM);
    if (this.addon.logSocketSend(this.fd, bytes) < 0) this.lost++;
  }
}

/** pino's levels as syslog severities: trace and debug 7, info 6, warn 4, error 3, fatal 2. */
export const SYSLOG_SEVERITY_OF_LEVEL: { level: 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal'; severity: number }[] = [
  { level: 'trace', severity: 7 },
  { level: 'debug', severity: 7 },
  { level: 'info', severity: 6 },
  { level: 'warn', severity: 4 },
  { level: 'error', severity: 3 },
  { level: 'fatal', severity: 2 },
];
