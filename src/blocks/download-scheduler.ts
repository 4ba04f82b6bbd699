/**
 * A reader waiting on this block now, a guess about what an open file will want next, or a guess about
 * files not yet opened (src/prefetch), which only ever takes a slot nobody else wants.
 */
export type Priority = 'demand' | 'readahead' | 'prefetch';

/** Slots a prefetch leaves free, so a demand read arriving meanwhile never waits for one to end. */
const PREFETCH_SPARE_SLOTS = 2;

export interface SchedulerLimits {
  /** Range GETs in flight across all objects (gcsfuse's --file-cache-max-parallel-downloads). */
  global: number;
  /** Range GETs in flight for one object (--file-cache-parallel-downloads-per-file). */
  perFile: number;
}

interface Task {
  file: string;
  priority: Priority;
  start: () => void;
}

/** A queued download that can still be moved ahead. */
export interface Ticket {
  promote(): void;
}

/**
 * Decides when each range GET may start: within a global and a per-file limit, demand before readahead
 * before prefetch, first come first served within a priority. A readahead that a reader starts waiting on is promoted.
 */
export class DownloadScheduler {
  private readonly queues: Record<Priority, Task[]> = { demand: [], readahead: [], prefetch: [] };
  private running = 0;
  private readonly perFile = new Map<string, number>();

  constructor(private readonly limits: SchedulerLimits) {}

  /** Range GETs allowed in flight across all objects. */
  get limit(): number {
    return this.limits.global;
  }

  get inFlight(): number {
    return this.running;
  }

  get queued(): number {
    return this.queues.demand.length + this.queues.readahead.length + this.queues.prefetch.length;
  }

  run<T>(file: string, priority: Priority, work: () => Promise<T>): { result: Promise<T>; ticket: Ticket } {
    let task!: Task;
    const result = new Promise<T>((resolve, reject) => {
      task = {
        file,
        priority,
        start: () => {
          this.running++;
          this.perFile.set(file, (this.perFile.get(file) ?? 0) + 1);
          work()
            .then(resolve, reject)
            .finally(() => {
              this.running--;
              const n = this.perFile.get(file)! - 1;
              if (n === 0) this.perFile.delete(file);
              else this.perFile.set(file, n);
              this.pump();
            });
        },
      };
    });
    this.queues[priority].push(task);
    this.pump();
    return {
      result,
      ticket: {
        promote: () => {
          if (task.priority === 'demand') return;
          const queue = this.queues[task.priority];
          const i = queue.indexOf(task);
          if (i < 0) return;
          queue.splice(i, 1);
          task.priority = 'demand';
          this.queues.demand.push(task);
          this.pump();
        },
      },
    };
  }

  private pump(): void {
    for (const priority of ['demand', 'readahead', 'prefetch'] as const) {
      const queue = this.queues[priority];
      if (priority === 'prefetch' && this.queues.demand.length + this.queues.readahead.length > 0) return;
      const limit = priority === 'prefetch' ? Math.max(1, this.limits.global - PREFETCH_SPARE_SLOTS) : this.limits.global;
      for (let i = 0; i < queue.length && this.running < limit; ) {
        const task = queue[i]!;
        if ((this.perFile.get(task.file) ?? 0) >= this.limits.perFile) {
          i++;
          continue;
        }
        queue.splice(i, 1);
        task.start();
      }
    }
  }
}
