/**
 * Background list requests across the whole mount (gcsfuse's --metadata-prefetch-max-workers): a
 * prefetch never takes more than this many at once. Requests someone waits on (a lookup, a readdir) do
 * not queue here.
 */
export class ListWorkers {
  private running = 0;
  private readonly queue: { start: () => void }[] = [];

  constructor(private readonly limit: number) {}

  get inFlight(): number {
    return this.running;
  }

  get queued(): number {
    return this.queue.length;
  }

  /** Runs `work` when a worker is free; `promote()` runs it at once, outside the limit. */
  run(work: () => Promise<void>): { promote(): void } {
    let started = false;
    const task = {
      start: () => {
        if (started) return;
        started = true;
        this.running++;
        void work().finally(() => {
          this.running--;
          this.pump();
        });
      },
    };
    this.queue.push(task);
    this.pump();
    return {
      promote: () => {
        const i = this.queue.indexOf(task);
        if (i < 0) return;
        this.queue.splice(i, 1);
        task.start();
      },
    };
  }

  private pump(): void {
    while (this.running < this.limit && this.queue.length > 0) this.queue.shift()!.start();
  }
}
