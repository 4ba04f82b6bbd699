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
 * Takes `db`'s exclusive lock, held until `db` closes (locking_mode EXCLUSIVE), running `first` before
 * and `then` after it; when another process holds it, closes `db` and throws `busy()`. Any other failure
 * closes `db` and is thrown as it is.
 */
export function lockExclusively(db: Database.Database, busy: () => Error, steps: { first?: () => void; then?: () => void } = {}): void {
  try {
    steps.first?.();
    db.pragma('locking_mode = EXCLUSIVE');
    db.exec('BEGIN EXCLUSIVE; COMMIT;');
    steps.then?.();
  } catch (err) {
    db.close();
    if ((err as { code?: string }).code === 'SQLITE_BUSY') throw busy();
    throw err;
  }
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
 */
export function holdFileLock(path: string, removeOnRelease = false): FileLock {
  for (;;) {
    // Made before SQLite opens it, and closed at once: closing a descriptor of a file drops every fcntl
    // lock this process holds on it, so none of ours may be closed once SQLite has its lock.
    closeSync(openSync(path, fsConstants.O_RDWR | fsConstants.O_CREAT | fsConstants.O_NOFOLLOW, 0o600));
    const before = inodeAt(path);
    const db = new Database(path, { timeout: 0 });
    lockExclusively(db, () => new FileLockBusyError(`${path} is locked by another process`), { first: () => db.pragma('journal_mode = OFF') });
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
