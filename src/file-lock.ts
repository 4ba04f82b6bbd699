import Database from 'better-sqlite3';
import { closeSync, constants as fsConstants, openSync, statSync, unlinkSync } from 'node:fs';

/** Another process holds the lock. */
export class FileLockBusyError extends Error {
  override readonly name = 'FileLockBusyError';
}

/** A lock held until released or until this process ends (the kernel lets go of it then, however it ends). */
export interface FileLock {
  release(): void;
}

/**
 * How long a busy lock is tried for before it counts as held by another process. Two processes taking a
 * free lock at the same moment each made the other fail (each held SQLite's shared lock while asking for
 * the exclusive one, and an exclusive-mode connection keeps what it took): both starts of one mount point
 * were refused, 55 times in 60 such races. A failed try closes its connection, letting go of everything,
 * and the next comes after a random pause, so two contenders fall out of step and one of them wins.
 */
const CONTENDED_MS = 250;
const sleeper = new Int32Array(new SharedArrayBuffer(4));

function pauseSync(ms: number): void {
  Atomics.wait(sleeper, 0, 0, ms);
}

/**
 * Opens a connection with `open` and takes its exclusive lock, held until it closes (locking_mode
 * EXCLUSIVE): `lock` runs the statements that take it (its pragmas, then `takeExclusiveLock`). When
 * another process holds the lock for `CONTENDED_MS`, throws `busy()`. Any other failure closes the
 * connection and is thrown as it is.
 */
export function lockExclusively(open: () => Database.Database, lock: (db: Database.Database) => void, busy: () => Error, patienceMs = CONTENDED_MS): Database.Database {
  const deadline = Date.now() + patienceMs;
  for (;;) {
    const db = open();
    try {
      lock(db);
      return db;
    } catch (err) {
      db.close();
      if ((err as { code?: string }).code !== 'SQLITE_BUSY') throw err;
      if (Date.now() >= deadline) throw busy();
      pauseSync(2 + Math.random() * 18);
    }
  }
}

/** The statements that take a connection's exclusive lock for as long as it is open. */
export function takeExclusiveLock(db: Database.Database): void {
  db.pragma('locking_mode = EXCLUSIVE');
  db.exec('BEGIN EXCLUSIVE; COMMIT;');
}

/** The inode now at `path`, or null when there is none. */
function inodeAt(path: string): bigint | null {
  try {
    return statSync(path, { bigint: true }).ino;
  } catch {
    return null;
  }
}

/**
 * Takes an exclusive lock on the file at `path`, made 0600 if missing (never through a planted symlink),
 * or throws FileLockBusyError when another process holds it. SQLite's exclusive lock is an fcntl lock:
 * unlike a pid in a file it is right across pid namespaces and needs no stale-lock clean-up.
 *
 * `removeOnRelease`: the file goes when the lock is released (a SIGKILL still leaves it, to be reused).
 * A process that opened the file just before its holder removed it would then lock a file no longer at
 * `path`: each lock taken is checked to be on the file at `path`, and taken again if it is not.
 *
 * `patienceMs`: how long a busy lock is tried for (0: once, for a probe that must never win a lock its
 * owner is taking right now: see staging.ts).
 */
export function holdFileLock(path: string, removeOnRelease = false, patienceMs = CONTENDED_MS): FileLock {
  for (;;) {
    // Made before SQLite opens it, and closed at once: closing a descriptor of a file drops every fcntl
    // lock this process holds on it, so none of ours may be closed once SQLite has its lock.
    closeSync(openSync(path, fsConstants.O_RDWR | fsConstants.O_CREAT | fsConstants.O_NOFOLLOW, 0o600));
    const before = inodeAt(path);
    const db = lockExclusively(
      () => new Database(path, { timeout: 0 }),
      (d) => {
        d.pragma('journal_mode = OFF');
        takeExclusiveLock(d);
      },
      () => new FileLockBusyError(`${path} is locked by another process`),
      patienceMs,
    );
    if (before === null || inodeAt(path) !== before) {
      db.close();
      continue;
    }
    return {
      release: () => {
        if (!db.open) return;
        if (removeOnRelease) {
          try {
            unlinkSync(path);
          } catch {
            // already gone: nothing to remove
          }
        }
        db.close();
      },
    };
  }
}
