import { usableCpus } from '../machine-share.js';

/**
 * How many of the download workers take new attempts: the first alone until the workers in use are
 * busy, one more each time they are, one fewer after they have been idle a while.
 *
 * Why not all of them, spread evenly: spreading costs CPU. A worker reads every socket that has data
 * each time it wakes, so one worker with 16 downloads makes fewer, larger reads per byte than two with 8
 * each; and each worker's code is compiled (and warmed) on its own. Measured (`npm run bench --
 * scaling`, a cold GiB): two workers spent 2.44-2.60 CPU-s where one spent 1.73-1.82, and on one core
 * read 282 MiB/s to one's 326. A second worker pays only when the first is the limit, and only on a
 * core of its own beside the main thread's: on fewer, a busy worker is one waiting for the CPU (its
 * loop's time stretched by the threads it shares the core with), and another would wait too.
 */
export interface WorkersInUseLimits {
  /** Mean event-loop utilization (0-1) of the workers in use above which a window counts as busy. */
  grow: number;
  /** Busy windows in a row after which one more is used (a few are a burst: a cold reader's first GETs, while the worker's code warms up). */
  busyWindows: number;
  /** Utilization below which a window counts as idle. */
  shrink: number;
  /** Idle windows in a row after which one fewer is used. */
  idleWindows: number;
  /** The CPUs this process may run on now (taskset, cpuset, a cgroup's CPU quota): at most this less one are used. */
  cpus: () => number;
}

export const WORKERS_IN_USE: WorkersInUseLimits = { grow: 0.7, busyWindows: 4, shrink: 0.2, idleWindows: 8, cpus: usableCpus };

export class WorkersInUse {
  private inUse = 1;
  private idle = 0;
  private busy = 0;

  constructor(private readonly limits: WorkersInUseLimits = WORKERS_IN_USE) {}

  /** Workers taking new attempts now, of `total`: always at least one (while there is one). */
  of(total: number): number {
    return Math.max(0, Math.min(this.inUse, total));
  }

  /** One window's mean utilization of the workers in use, and how many workers there are. */
  observe(utilization: number, workers: number): void {
    const total = Math.min(workers, Math.max(1, this.limits.cpus() - 1));
    this.inUse = Math.max(1, Math.min(this.inUse, total));
    if (utilization > this.limits.grow) {
      this.idle = 0;
      if (++this.busy >= this.limits.busyWindows && this.inUse < total) {
        this.busy = 0;
        this.inUse++;
      }
      return;
    }
    this.busy = 0;
    if (utilization >= this.limits.shrink || this.inUse === 1) {
      this.idle = 0;
      return;
    }
    if (++this.idle >= this.limits.idleWindows) {
      this.idle = 0;
      this.inUse--;
    }
  }
}
