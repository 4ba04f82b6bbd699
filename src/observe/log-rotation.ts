import { createReadStream, createWriteStream, promises as fsp, lstatSync, readdirSync, renameSync, statSync, unlinkSync } from 'node:fs';
import { basename, dirname, extname, join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { createGzip } from 'node:zlib';

/** gcsfuse's `logging.log-rotate` settings, as its logger (lumberjack) takes them. */
export interface LogRotationConfig {
  /** The file is rotated once it holds this many bytes. */
  maxBytes: number;
  /** Rotated files kept, newest first; 0 keeps all. */
  backups: number;
  /** Rotated files are gzipped (`NAME-TIME.EXT.gz`). */
  compress: boolean;
}

/** What rotation needs of the log's destination (pino's sonic-boom): to start a fresh file at the path. */
export interface Reopenable {
  reopen(): void;
}

/**
 * The backup's time as lumberjack writes it (UTC, `2006-01-02T15-04-05.000`), so a log directory rotated
 * by gcsfuse and then by gcsmount holds one series, and tools that clean up gcsfuse's logs find these.
 */
function stamp(ms: number): string {
  return new Date(ms).toISOString().slice(0, 23).replace(/:/g, '-');
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/**
 * Rotates a log file by size, as gcsfuse does (`--log-rotate-max-file-size-mb`, 512 MiB by default):
 * without it a daemon that runs for months fills the disk with its log. The full file is renamed
 * `NAME-TIME.EXT` and the destination reopened at the path (synchronous: no line is lost or written
 * between); gzipping and removing the oldest backups run afterwards, off the main thread's way (zlib
 * on libuv's pool), one rotation's at a time. Only files of exactly the backup name's shape are ever
 * removed. A problem (no room to gzip) is reported through `problem` and leaves the backup as it is.
 */
export class LogRotation {
  private bytes: number;
  private rotating = false;
  private lastStamp = 0;
  /** The gzips and clean-ups of rotations so far, in order. */
  private chores: Promise<void> = Promise.resolve();
  private readonly dir: string;
  private readonly stem: string;
  private readonly ext: string;
  private readonly backupName: RegExp;

  constructor(
    private readonly file: string,
    private readonly cfg: LogRotationConfig,
    private readonly dest: Reopenable,
    private readonly problem: (fields: Record<string, unknown>, msg: string) => void,
  ) {
    this.dir = dirname(file);
    this.ext = extname(file);
    this.stem = basename(file).slice(0, basename(file).length - this.ext.length);
    // A backup, its gzip, or a gzip being written (left by a daemon that died meanwhile).
    this.backupName = new RegExp(`^${escapeRegExp(this.stem)}-\\d{4}-\\d{2}-\\d{2}T\\d{2}-\\d{2}-\\d{2}\\.\\d{3}${escapeRegExp(this.ext)}((\\.gz)?(\\.tmp)?)$`);
    this.bytes = this.sizeNow();
  }

  /** `n` bytes went to the file. A rotation is not done from inside the destination's own write. */
  wrote(n: number): void {
    this.bytes += n;
    if (this.bytes < this.cfg.maxBytes || this.rotating) return;
    this.rotating = true;
    setImmediate(() => this.rotate());
  }

  /** The destination was reopened by someone else (SIGHUP after logrotate moved the file). */
  reopened(): void {
    this.bytes = this.sizeNow();
  }

  /** The rotations' gzips and clean-ups, finished (for a clean stop and for tests). */
  settled(): Promise<void> {
    return this.chores;
  }

  private sizeNow(): number {
    try {
      return statSync(this.file).size;
    } catch {
      return 0;
    }
  }

  private rotate(): void {
    this.rotating = false;
    // Only a regular file is renamed: `--log-file /dev/stdout` (a symlink into /proc) or a FIFO moved
    // aside would move a name that is not ours (and a FIFO's gzip would wait for ever for its end).
    const st = lstatSync(this.file, { throwIfNoEntry: false });
    if (st && !st.isFile()) {
      this.problem({ file: this.file }, 'log rotation: the log is not a regular file; it is not rotated');
      this.bytes = -Infinity;
      return;
    }
    // Within one millisecond of the last one a rotation would take its name: the next millisecond's.
    const ms = Math.max(Date.now(), this.lastStamp + 1);
    this.lastStamp = ms;
    const backup = join(this.dir, `${this.stem}-${stamp(ms)}${this.ext}`);
    try {
      renameSync(this.file, backup);
    } catch (err) {
      // Moved away meanwhile (logrotate): the file at the path is another one now.
      this.problem({ err: String(err) }, 'log rotation: could not rename the full log file; writing on to it');
      this.bytes = this.sizeNow();
      return;
    }
    try {
      this.dest.reopen();
    } catch (err) {
      // No file could be opened at the path (out of descriptors, a quota): the destination still
      // writes to the file just renamed, which goes back to its name, and the next line tries again.
      try {
        renameSync(backup, this.file);
      } catch {
        // something else is at the path now: the lines go on into the backup
      }
      this.bytes = this.sizeNow();
      this.problem({ err: String(err) }, 'log rotation: could not open a fresh log file; writing on to the full one');
      return;
    }
    this.bytes = 0;
    this.chores = this.chores.then(() => this.afterRotation(backup));
  }

  private async afterRotation(backup: string): Promise<void> {
    if (this.cfg.compress) await this.gzip(backup);
    this.removeOldest();
  }

  private async gzip(backup: string): Promise<void> {
    const gz = `${backup}.gz`;
    // Written under another name and renamed: a gzip under its own name is always whole.
    const partial = `${gz}.tmp`;
    try {
      const { mode } = await fsp.stat(backup);
      await pipeline(createReadStream(backup), createGzip(), createWriteStream(partial, { flags: 'wx', mode: mode & 0o777 }));
      renameSync(partial, gz);
      unlinkSync(backup);
    } catch (err) {
      try {
        unlinkSync(partial);
      } catch {
        // never made, or already gone
      }
      // Rotations faster than their gzips: an earlier one's clean-up removed this backup as past the count.
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
      this.problem({ err: String(err), backup }, 'log rotation: could not gzip the rotated log; kept as it is');
    }
  }

  /** Backups past the count, oldest first (their names sort by time); a backup and its gzip are one. */
  private removeOldest(): void {
    if (this.cfg.backups <= 0) return;
    let names: string[];
    try {
      names = readdirSync(this.dir);
    } catch {
      return;
    }
    const byTime = new Map<string, string[]>();
    for (const n of names) {
      const m = this.backupName.exec(n);
      if (!m) continue;
      const key = m[1] ? n.slice(0, -m[1].length) : n;
      byTime.set(key, [...(byTime.get(key) ?? []), n]);
    }
    const oldest = [...byTime.keys()].sort().slice(0, Math.max(0, byTime.size - this.cfg.backups));
    for (const key of oldest) {
      for (const n of byTime.get(key)!) {
        try {
          unlinkSync(join(this.dir, n));
        } catch {
          // removed by someone else meanwhile
        }
      }
    }
  }
}
