import { randomBytes } from 'node:crypto';
import { existsSync, promises as fsp, readdirSync, readFileSync, renameSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { FreeSpaceMargin } from '../blocks/free-space.js';
import type { Logger } from '../observe/logger.js';
import { FileLockBusyError, holdFileLock, type FileLock } from '../file-lock.js';
import { preparePrivateSubdir } from '../private-dir.js';

/** A staged file would leave less free space than the margin: the write that grows it gets ENOSPC. */
export class StagingFullError extends Error {
  override readonly name = 'StagingFullError';
}

/** How much a staged file may grow between two looks at the file system's free space. */
const FREE_CHECK_BYTES = 8 * 2 ** 20;

/**
 * A file in each daemon's subfolder whose lock the daemon holds for its life (SQLite's exclusive lock:
 * an fcntl lock, the kernel's). A pid and a start time say whether a daemon lives only within one pid
 * namespace: two containers sharing a temp dir, each daemon pid 1, took each other's folder for a dead
 * one's and removed it (the other's writes then failed until it restarted). A held lock says it anywhere.
 */
const ALIVE = '.alive';

function holdAlive(dir: string): FileLock {
  return holdFileLock(join(dir, ALIVE));
}

/**
 * Whether another process holds `dir`'s lock (a live daemon, whatever pid it has here). Tried once: a
 * probe that waited out a busy lock (as a daemon taking its own does) could win it from a daemon taking
 * it this moment, and then remove that live daemon's folder; once, a lock being taken reads as held.
 */
function heldByAnother(dir: string): boolean {
  if (!existsSync(join(dir, ALIVE))) return false;
  try {
    holdFileLock(join(dir, ALIVE), false, 0).release();
    return false;
  } catch (err) {
    return err instanceof FileLockBusyError;
  }
}

/**
 * The folder where files open for writing are staged (a local copy of the whole file, uploaded on close
 * or fsync): `staging/` in gcsmount's cache folder, `--temp-dir DIR`'s `gcsmount-staging/`, or one in the
 * system's temporary folder, each private (0700). Every daemon has a subfolder of its own named by its
 * pid and start time; a subfolder whose daemon is gone holds what a crash left: those files are never
 * uploaded (nobody knows whether they were complete), only reported and removed at the next start.
 */
export class StagingDir {
  private next = 0;
  private readonly margin: FreeSpaceMargin | null;
  private grownSinceCheck = 0;

  /** This daemon's hold on its subfolder (see ALIVE); null where SQLite could not make the file. */
  private alive: FileLock | null = null;

  private constructor(
    readonly dir: string,
    private readonly log: Logger,
  ) {
    this.margin = FreeSpaceMargin.of(dir);
  }

  /** Prepares `parent/name` (private), clears what dead daemons left there, and makes this daemon's subfolder. */
  static open(parent: string, name: string, log: Logger): StagingDir {
    const root = preparePrivateSubdir(parent, name, { create: true, what: 'temp dir' });
    clearLeftovers(root, log);
    // Made under a name clearLeftovers passes over, locked, then renamed into place: under its own name
    // it is never without its lock (another daemon's probe between the two took it for a dead one's and
    // removed it). The random part: two daemons of one pid and start tick (pid 1 of two containers
    // sharing the folder) each had the other's folder, and cleared it as their own.
    const tag = randomBytes(6).toString('hex');
    const making = preparePrivateSubdir(root, `${MAKING}${tag}`, { create: true, what: 'temp dir' });
    let alive: FileLock | null = null;
    try {
      alive = holdAlive(making);
    } catch (err) {
      log.warn({ dir: making, err: String(err) }, 'temp dir: no lock could be taken on this daemon\'s folder; a daemon in another pid namespace could take it for a dead one\'s');
    }
    const dir = join(root, `${process.pid}-${processStart(process.pid) ?? Date.now()}-${tag}`);
    // The lock is on the open file, which the rename keeps.
    renameSync(making, dir);
    const staging = new StagingDir(dir, log);
    staging.alive = alive;
    return staging;
  }

  /** A new empty staged file, open for reading and writing. */
  async create(): Promise<{ path: string; handle: fsp.FileHandle }> {
    const path = join(this.dir, String(this.next++));
    const handle = await fsp.open(path, 'w+', 0o600);
    return { path, handle };
  }

  /**
   * Called before a staged file grows by `bytes`: throws StagingFullError when that would leave less
   * than the margin free (5% of the file system, at most 4 GiB), so a full disk is an ENOSPC to the
   * writer, never a silently short file.
   */
  reserve(bytes: number): void {
    this.grownSinceCheck += bytes;
    if (this.grownSinceCheck < FREE_CHECK_BYTES || !this.margin) return;
    this.grownSinceCheck = 0;
    const free = this.margin.freeBytes();
    if (free !== null && free - FREE_CHECK_BYTES < this.margin.bytes) {
      // Refused: the next growth, however small, is checked again (not after another 8 MiB).
      this.grownSinceCheck = FREE_CHECK_BYTES;
      throw new StagingFullError(`temp dir ${this.dir} is down to ${free} bytes free (the margin is ${this.margin.bytes})`);
    }
  }

  /** Removes this daemon's subfolder (at exit; the files in it are closed). */
  close(): void {
    this.alive?.release();
    this.alive = null;
    try {
      rmSync(this.dir, { recursive: true, force: true });
    } catch (err) {
      this.log.warn({ dir: this.dir, err: String(err) }, 'temp dir could not be removed');
    }
  }
}

/** A process's start time (clock ticks since boot), to tell a live daemon from a pid reused since. */
function processStart(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19] ?? null;
  } catch {
    return null;
  }
}

/** The name a daemon's folder has while it is made (StagingDir.open); one of a daemon that died then holds nothing staged. */
const MAKING = '.making-';
/** A folder still under MAKING's name this long after it was made: its daemon died making it. */
const MAKING_ABANDONED_MS = 60_000;

function clearLeftovers(root: string, log: Logger): void {
  for (const name of readdirSync(root)) {
    if (name.startsWith(MAKING)) {
      const dir = join(root, name);
      const age = Date.now() - (statSync(dir, { throwIfNoEntry: false })?.mtimeMs ?? Date.now());
      if (age > MAKING_ABANDONED_MS && !heldByAnother(dir)) rmSync(dir, { recursive: true, force: true });
      continue;
    }
    // pid-start, and (since the random part) pid-start-tag.
    const m = /^(\d+)-(\d+)(?:-[0-9a-f]+)?$/.exec(name);
    if (!m) continue;
    if (processStart(Number(m[1])) === m[2]) continue; // a live daemon's
    const dir = join(root, name);
    if (heldByAnother(dir)) continue; // a live daemon's, in another pid namespace
    let files = 0;
    let bytes = 0;
    try {
      for (const f of readdirSync(dir)) {
        if (f.startsWith(ALIVE)) continue;
        files++;
        bytes += statSync(join(dir, f)).size;
      }
    } catch {
      // counted what could be
    }
    if (files > 0) log.warn({ dir, files, bytes }, 'staged files left by a daemon that stopped without closing them: not uploaded (their writers never closed them), removed');
    rmSync(dir, { recursive: true, force: true });
  }
}
