/**
 * Blocks held in memory ahead of readers, across all open files (gcsfuse's --read-global-max-blocks):
 * what bounds the daemon's memory however many files are streamed at once. Demand reads never wait on
 * it; only readahead is skipped when it is spent.
 */
export class ReadaheadBudget {
  private used = 0;

  constructor(private readonly max: number) {}

  tryTake(): boolean {
    if (this.used >= this.max) return false;
    this.used++;
    return true;
  }

  give(): void {
    this.used--;
  }

  get inUse(): number {
    return this.used;
  }
}
