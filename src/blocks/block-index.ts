import Database from 'better-sqlite3';
import { chmodSync, closeSync, constants as fsConstants, lstatSync, openSync, renameSync, statSync } from 'node:fs';
import { lockExclusively, takeExclusiveLock } from '../file-lock.js';

/** One cached block as the index knows it. `key` also names the block's file. */
export interface BlockRow {
  key: string;
  bucket: string;
  object: string;
  generation: string;
  block: number;
  size: number;
  crc32c: number;
  lastAccess: number;
}

export class IndexLockedError extends Error {
  override readonly name = 'IndexLockedError';
}

/**
 * The version is part of the table name (and of the block folder): a format change starts a fresh
 * cache instead of misreading an old one. v2: see BLOCKS_DIR in disk-cache.ts.
 */
export const BLOCK_TABLE = 'blocks_v2';
const TABLE = BLOCK_TABLE;
/** Tables of older layouts, dropped on open (their block folders are removed by the disk cache). */
const OLD_TABLES = ['blocks_v1'];

const SCHEMA = `
  CREATE TABLE IF NOT EXISTS ${TABLE} (
    key TEXT PRIMARY KEY,
    bucket TEXT NOT NULL,
    object TEXT NOT NULL,
    generation TEXT NOT NULL,
    block INTEGER NOT NULL,
    size INTEGER NOT NULL,
    crc32c INTEGER NOT NULL,
    last_access INTEGER NOT NULL
  ) WITHOUT ROWID;
  CREATE INDEX IF NOT EXISTS ${TABLE}_lru ON ${TABLE}(last_access);
  CREATE TABLE IF NOT EXISTS settings (k TEXT PRIMARY KEY, v TEXT NOT NULL);
  ${OLD_TABLES.map((t) => `DROP TABLE IF EXISTS ${t};`).join('\n  ')}
`;

/**
 * SQLite's own checkpoints are off: it runs one on the committing call every thousand WAL pages, and
 * its fsyncs under a stream of block writes took 0.2-0.9 s (measured, 1 GiB of 1 MiB blocks), all of
 * it time the event loop, and every FUSE request waiting on it, stood still. The index checkpoints
 * instead when the WAL has grown this large (a stall every hundred thousand rows or so, not every few
 * hundred), or once no row has been written for `idleCheckpointMs`: a pause of a second is no sign
 * that reads have paused too (a checkpoint after one took 0.57 s in the middle of a Zarr load).
 */
const CHECKPOINT_WAL_BYTES = 64 * 2 ** 20;
const IDLE_CHECKPOINT_MS = 30_000;

export interface BlockIndexOptions {
  /** Checkpoint the WAL after this long without writes (tests shorten it). */
  idleCheckpointMs?: number;
}

/**
 * How long a row waits for others to share its transaction: rows of blocks landing together commit
 * once. Rows are visible to get/has at once, so only the commit waits (a commit was 11% of a cold chunk
 * file's main thread at 5 ms: one per file).
 */
const PUT_BATCH_MS = 20;

/**
 * Rows (and absences) asked about lately, kept so each cold block is not looked up in SQLite five times
 * (open, read, fetch, write, register). True because every write of the table passes through this
 * class, and the connection's exclusive lock keeps other processes out. Forgotten all at once when full.
 */
const RECENT_ROWS = 16_384;
/** How often the WAL's size is looked at after writes (a stat per commit was measurable). */
const WAL_CHECK_MS = 100;

interface PendingPut {
  row: BlockRow;
  settled: { resolve: () => void; reject: (err: Error) => void };
}

/**
 * The SQLite index of the block cache. better-sqlite3 is synchronous, so every statement here is
 * prepared once and small; access times are batched in memory and written in one transaction, never one
 * write per read; rows are committed in batches (putSoon). The connection holds an exclusive lock for its whole life: a second daemon (or a
 * `cache clear`) on the same directory is refused, and a SIGKILLed holder releases it with its process.
 */
export class BlockIndex {
  private readonly db: Database.Database;
  private readonly pendingAccess = new Map<string, number>();
  /** Rows written by putSoon and not yet committed: visible to get/has at once. */
  private readonly pendingPuts = new Map<string, PendingPut>();
  private putTimer: NodeJS.Timeout | null = null;
  /** Committed rows by key, null where the key has no row; see RECENT_ROWS. */
  private readonly recent = new Map<string, BlockRow | null>();
  private walCheckedAt = 0;
  private readonly walPath: string;
  private readonly idleCheckpointMs: number;
  private idleCheckpoint: NodeJS.Timeout | null = null;
  private readonly stmt;
  /**
   * writeRows' transaction, made once: better-sqlite3's transaction() builds a new function with its
   * variants per call, which was most of a small batch's commit (perf of a cold GiB's main thread).
   */
  private readonly insertRows: (rows: readonly BlockRow[]) => void;
  /** True when the previous owner did not close cleanly: its files and rows may disagree. */
  readonly wasDirty: boolean;
  /** True when no owner had it before (made just now): there was no stop, clean or not. */
  readonly fresh: boolean;
  /** Set when the index file was unreadable and has been replaced by an empty one. */
  readonly rebuiltFrom: string | null;

  private constructor(db: Database.Database, path: string, rebuiltFrom: string | null, opts: BlockIndexOptions) {
    this.db = db;
    this.walPath = `${path}-wal`;
    this.idleCheckpointMs = opts.idleCheckpointMs ?? IDLE_CHECKPOINT_MS;
    this.rebuiltFrom = rebuiltFrom;
    db.exec(SCHEMA);
    this.stmt = {
      get: db.prepare<[string], Record<string, unknown>>(`SELECT * FROM ${TABLE} WHERE key = ?`),
      // Positional: binding by name looked each column up on the row object, per row.
      put: db.prepare<[string, string, string, string, number, number, number, number]>(
        `INSERT OR REPLACE INTO ${TABLE} (key, bucket, object, generation, block, size, crc32c, last_access) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
      ),
      delete: db.prepare<[string]>(`DELETE FROM ${TABLE} WHERE key = ?`),
      touch: db.prepare<[number, string]>(`UPDATE ${TABLE} SET last_access = ? WHERE key = ?`),
      oldest: db.prepare<[number, number], { key: string; size: number }>(`SELECT key, size FROM ${TABLE} ORDER BY last_access LIMIT ? OFFSET ?`),
      totals: db.prepare<[], { bytes: number; blocks: number }>(`SELECT COALESCE(SUM(size), 0) AS bytes, COUNT(*) AS blocks FROM ${TABLE}`),
      objects: db.prepare<[], { n: number }>(`SELECT COUNT(*) AS n FROM (SELECT DISTINCT bucket, object, generation FROM ${TABLE})`),
      all: db.prepare<[], Record<string, unknown>>(`SELECT * FROM ${TABLE}`),
      keys: db.prepare<[], { key: string }>(`SELECT key FROM ${TABLE}`),
      getSetting: db.prepare<[string], { v: string }>(`SELECT v FROM settings WHERE k = ?`),
      setSetting: db.prepare<[string, string]>(`INSERT OR REPLACE INTO settings (k, v) VALUES (?, ?)`),
      clear: db.prepare(`DELETE FROM ${TABLE}`),
    };
    this.insertRows = db.transaction((rows: readonly BlockRow[]) => {
      for (const r of rows) this.writeRow(r);
    });
    const clean = this.setting('clean');
    this.fresh = clean === undefined;
    this.wasDirty = clean === '0';
    // Durable before any block file goes in: with synchronous=NORMAL a WAL commit may roll back at a
    // power loss, and an index that then still said 'clean' would skip the reconcile that finds block
    // files whose rows were lost (kept on disk, outside the budget, for good).
    db.pragma('synchronous = FULL');
    this.setSetting('clean', '0');
    db.pragma('synchronous = NORMAL');
  }

  /**
   * Opens (creating) the index at `path` and takes its lock. An index that SQLite cannot read is moved
   * aside and replaced by an empty one: the cache is a cache, and losing it must not stop a mount.
   */
  static open(path: string, opts: BlockIndexOptions = {}): BlockIndex {
    try {
      return new BlockIndex(BlockIndex.connect(path), path, null, opts);
    } catch (err) {
      if (err instanceof IndexLockedError) throw err;
      const code = (err as { code?: string }).code ?? '';
      if (!/^SQLITE_(NOTADB|CORRUPT)/.test(code)) throw err;
      const aside = `${path}.corrupt-${Date.now()}`;
      renameSync(path, aside);
      for (const suffix of ['-wal', '-shm']) {
        try {
          renameSync(`${path}${suffix}`, `${aside}${suffix}`);
        } catch {
          // Not every index has them.
        }
      }
      return new BlockIndex(BlockIndex.connect(path), path, aside, opts);
    }
  }

  private static connect(path: string): Database.Database {
    // Made 0600 before SQLite sees it (SQLite would create it 0644), and SQLite gives its -wal and -shm
    // the mode of the database file: object names are nobody else's business. O_NOFOLLOW: never a
    // planted symlink. Creating the file is the one thing done in the cache dir before the lock.
    closeSync(openSync(path, fsConstants.O_RDWR | fsConstants.O_CREAT | fsConstants.O_NOFOLLOW, 0o600));
    // timeout 0: a locked index is reported within lockExclusively's short retries, not after a silent
    // five-second wait.
    const db = lockExclusively(
      () => new Database(path, { timeout: 0 }),
      (d) => {
        d.pragma('locking_mode = EXCLUSIVE');
        d.pragma('journal_mode = WAL');
        // A crash may lose the last transactions, never corrupt the file; each block is checked anyway.
        d.pragma('synchronous = NORMAL');
        d.pragma('wal_autocheckpoint = 0');
        takeExclusiveLock(d);
      },
      () => new IndexLockedError(`${path} is locked by another process`),
    );
    // Ours now: an index (and journal) left by an older gcsmount or another umask becomes owner-only too.
    for (const file of [path, `${path}-wal`, `${path}-shm`]) {
      try {
        if (lstatSync(file).isFile()) chmodSync(file, 0o600);
      } catch {
        // Not every index has a -wal or -shm.
      }
    }
    return db;
  }

  get(key: string): BlockRow | undefined {
    const pending = this.pendingPuts.get(key);
    if (pending) return pending.row;
    const known = this.recent.get(key);
    if (known !== undefined) return known ?? undefined;
    const r = this.stmt.get.get(key);
    const row = r ? toRow(r) : undefined;
    this.remember(key, row ?? null);
    return row;
  }

  has(key: string): boolean {
    return this.get(key) !== undefined;
  }

  private remember(key: string, row: BlockRow | null): void {
    if (this.recent.size >= RECENT_ROWS) this.recent.clear();
    this.recent.set(key, row);
  }

  /**
   * Adds a row now (get and has see it at once) and commits it within a few milliseconds in one
   * transaction with the rows that arrive meanwhile; resolves once it is committed, rejects with the
   * transaction's error (no row of that batch is then in the index).
   *
   * Why: one transaction per block cost ~30 us of CPU, and every thousand WAL pages SQLite checkpoints
   * on the committing call, fsync included: under a stream of block writes one put blocked the event
   * loop, and every FUSE request with it, for half a second (measured: 1,024 blocks of 1 MiB, 768 ms in
   * put, 492 ms in one call). A batch writes each page it touches once.
   */
  putSoon(row: BlockRow): Promise<void> {
    return new Promise((resolve, reject) => {
      this.pendingPuts.get(row.key)?.settled.resolve();
      this.pendingPuts.set(row.key, { row, settled: { resolve, reject } });
      this.pendingAccess.delete(row.key);
      if (!this.putTimer) {
        this.putTimer = setTimeout(() => this.commitPending(), PUT_BATCH_MS);
        this.putTimer.unref();
      }
    });
  }

  /** Commits the rows putSoon holds, settling their promises; never throws (the callers hear of it). */
  commitPending(): void {
    if (this.putTimer) clearTimeout(this.putTimer);
    this.putTimer = null;
    if (this.pendingPuts.size === 0) return;
    const batch = [...this.pendingPuts.values()];
    this.pendingPuts.clear();
    try {
      this.writeRows(batch.map((p) => p.row));
    } catch (err) {
      for (const p of batch) p.settled.reject(err as Error);
      return;
    }
    for (const p of batch) p.settled.resolve();
  }

  /** Checkpoints when the WAL is large; otherwise (re)arms the checkpoint for when writes pause. */
  private afterWrite(): void {
    if (this.idleCheckpoint) this.idleCheckpoint.refresh();
    const now = Date.now();
    if (now - this.walCheckedAt < WAL_CHECK_MS) return;
    this.walCheckedAt = now;
    let walBytes = 0;
    try {
      walBytes = statSync(this.walPath).size;
    } catch {
      // No WAL file: nothing to checkpoint.
    }
    if (walBytes >= CHECKPOINT_WAL_BYTES) {
      this.checkpoint();
    } else if (walBytes > 0) {
      if (this.idleCheckpoint) this.idleCheckpoint.refresh();
      else {
        this.idleCheckpoint = setTimeout(() => this.checkpoint(), this.idleCheckpointMs);
        this.idleCheckpoint.unref();
      }
    }
  }

  private checkpoint(): void {
    if (this.idleCheckpoint) clearTimeout(this.idleCheckpoint);
    this.idleCheckpoint = null;
    // The next write looks at the WAL again, so the idle checkpoint is armed anew.
    this.walCheckedAt = 0;
    try {
      this.db.pragma('wal_checkpoint(TRUNCATE)');
    } catch {
      // Left for the next one; the WAL still holds every committed row.
    }
  }

  delete(keys: readonly string[]): void {
    if (keys.length === 0) return;
    this.db.transaction(() => {
      for (const k of keys) this.stmt.delete.run(k);
    })();
    this.afterWrite();
    for (const k of keys) {
      // Through remember(), so an eviction of many rows cannot grow the memory past its bound.
      this.remember(k, null);
      this.pendingAccess.delete(k);
      const pending = this.pendingPuts.get(k);
      if (pending) {
        // Dropped before it was committed: the caller that put it has nothing left to do.
        this.pendingPuts.delete(k);
        pending.settled.resolve();
      }
    }
  }

  /** Records an access in memory; `flushAccess` writes the batch. */
  touch(key: string, now: number): void {
    this.pendingAccess.set(key, now);
  }

  get pendingAccessCount(): number {
    return this.pendingAccess.size;
  }

  flushAccess(): void {
    // A touch of a row still pending would update nothing.
    this.commitPending();
    if (this.pendingAccess.size === 0) return;
    const batch = [...this.pendingAccess];
    this.pendingAccess.clear();
    this.db.transaction(() => {
      for (const [key, at] of batch) this.stmt.touch.run(at, key);
    })();
    this.afterWrite();
  }

  /** Least recently used first; `offset` skips rows the caller could not evict (a reader holds them). */
  oldest(limit: number, offset = 0): { key: string; size: number }[] {
    this.flushAccess();
    return this.stmt.oldest.all(limit, offset);
  }

  totals(): { bytes: number; blocks: number; objects: number } {
    this.commitPending();
    const t = this.stmt.totals.get()!;
    return { ...t, objects: this.stmt.objects.get()!.n };
  }

  *rows(): IterableIterator<BlockRow> {
    this.commitPending();
    for (const r of this.stmt.all.iterate()) yield toRow(r);
  }

  *keys(): IterableIterator<string> {
    this.commitPending();
    for (const r of this.stmt.keys.iterate()) yield r.key;
  }

  clear(): void {
    this.commitPending();
    this.stmt.clear.run();
    this.recent.clear();
    this.pendingAccess.clear();
  }

  setting(k: string): string | undefined {
    return this.stmt.getSetting.get(k)?.v;
  }

  setSetting(k: string, v: string): void {
    this.stmt.setSetting.run(k, v);
  }

  /** Bulk insert for reconciliation and benchmarks: one transaction. */
  putMany(rows: readonly BlockRow[]): void {
    this.writeRows(rows);
  }

  /** One row's statement, inside writeRows' transaction. */
  private writeRow(row: BlockRow): void {
    this.stmt.put.run(row.key, row.bucket, row.object, row.generation, row.block, row.size, row.crc32c, row.lastAccess);
  }

  /** One transaction; the rows are remembered only once it commits (a failed one leaves no trace). */
  private writeRows(rows: readonly BlockRow[]): void {
    this.insertRows(rows);
    for (const r of rows) {
      this.pendingAccess.delete(r.key);
      this.remember(r.key, r);
    }
    this.afterWrite();
  }

  /**
   * Writes what is pending and lets go of the lock. `clean` says files and rows agree (so the next start
   * may skip reconciliation); an owner that did not finish reconciling must not claim it.
   */
  close(clean: boolean): void {
    this.flushAccess();
    if (this.idleCheckpoint) clearTimeout(this.idleCheckpoint);
    if (clean) this.setSetting('clean', '1');
    this.db.close();
  }
}

/**
 * Takes the lock of the index at `path` (an existing one) without using it, its WAL folded into the
 * file first, so the file alone is the whole index while it moves and no process can open it
 * meanwhile. Throws IndexLockedError when a process holds it, SQLite's error when it is no index.
 */
export function holdIndexLock(path: string): { release(): void } {
  // Locked before the first read: an exclusive WAL connection keeps its index in memory, no -shm file.
  const db = lockExclusively(
    () => new Database(path, { timeout: 0, fileMustExist: true }),
    (d) => {
      takeExclusiveLock(d);
      d.pragma('wal_checkpoint(TRUNCATE)');
    },
    () => new IndexLockedError(`${path} is locked by another process`),
  );
  return { release: () => db.close() };
}

function toRow(r: Record<string, unknown>): BlockRow {
  return {
    key: r.key as string,
    bucket: r.bucket as string,
    object: r.object as string,
    generation: r.generation as string,
    block: r.block as number,
    size: r.size as number,
    crc32c: r.crc32c as number,
    lastAccess: r.last_access as number,
  };
}
