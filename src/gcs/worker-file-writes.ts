// The block file writes given to download workers (range-workers.ts) and not yet told back: who holds
// each, and how each ends. A worker tells its outcomes in batches (a FilesReply), so the main thread
// takes them in the same wake-up as the worker's next reply.
import { BlockWriteError } from '../block-file-write.js';
import type { FileOutcome } from './range-jobs.js';

/** What a worker slot must carry for its writes to be counted: the ones given to it and not yet told. */
export interface HoldsFiles {
  files: number;
}

interface PendingFile<S extends HoldsFiles> {
  slot: S;
  tmp: string;
  final: string;
  resolve: () => void;
  reject: (err: Error) => void;
}

export class WorkerFileWrites<S extends HoldsFiles> {
  private readonly pending = new Map<number, PendingFile<S>>();

  /** Write `id`, given to `slot`: settles when the slot tells its outcome, or fails it (below). */
  add(slot: S, id: number, tmp: string, final: string): Promise<void> {
    return new Promise((resolve, reject) => {
      this.pending.set(id, { slot, tmp, final, resolve, reject });
      slot.files++;
    });
  }

  /** Outcomes told by `slot`: a failed write rejects as the addon's own write does (BlockWriteError). */
  told(slot: S, done: FileOutcome[]): void {
    for (const o of done) {
      const p = this.pending.get(o.id);
      if (!p || p.slot !== slot) continue;
      this.pending.delete(o.id);
      slot.files--;
      if (o.code === null) p.resolve();
      else if (o.stage === 'worker' || o.stage === null) p.reject(new Error(`a download worker could not write a block file: ${o.code}`));
      else p.reject(new BlockWriteError(o.code, o.stage, o.stage === 'rename' ? p.final : p.tmp));
    }
  }

  /**
   * The writes `slot` holds (every slot's, when null) end untold. `gone`: its thread has ended, and with
   * it every write it had started (a worker's thread ends only once its thread-pool jobs have: a 1 GiB
   * write begun just before terminate() was whole when 'exit' came, 2.7 s later), so they fail as not
   * run and their callers write them themselves. Otherwise (a worker that did not stop in time) one may
   * still be under way, so none is written again beside it: they fail as failed writes, which their
   * callers do not index. Such a late write may still leave a block file (of memory the daemon reused
   * meanwhile) that no row names: never served (every read of a block file is checked against its
   * row's CRC32C), renamed over by the block's next write, removed by the next start's reconcile.
   */
  fail(slot: S | null, why: string, gone: boolean): void {
    for (const [id, p] of this.pending) {
      if (slot && p.slot !== slot) continue;
      this.pending.delete(id);
      p.slot.files--;
      p.reject(gone ? new Error(why) : new BlockWriteError('ETIMEDOUT', 'write', p.tmp));
    }
  }
}
