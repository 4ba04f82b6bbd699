/**
 * Turns for renames: file renames run side by side (shared), a folder rename alone (exclusive). A file
 * rename holds its file and then waits for the target's (detach), while a folder rename holds every file
 * under it at once: run together, each could hold what the other waits for (rename(/d/a, /d/b) beside
 * rename(/d, /e) hung both, and every later write to the two files). The kernel already puts two file
 * renames of the same names in line (the folders' locks), so only folder renames need to wait here;
 * they are rare (--rename-dir-limit), file renames are a writer's every atomic save.
 */
export class RenameTurns {
  private shared = 0;
  private exclusive = false;
  private readonly waiting: { exclusive: boolean; go: () => void }[] = [];

  /** Runs `work` alone when `exclusive` (a folder rename), else beside other file renames, after any folder rename before it. */
  async run<T>(exclusive: boolean, work: () => Promise<T>): Promise<T> {
    if (!this.free(exclusive)) await new Promise<void>((go) => this.waiting.push({ exclusive, go }));
    else this.take(exclusive);
    try {
      return await work();
    } finally {
      if (exclusive) this.exclusive = false;
      else this.shared--;
      this.wake();
    }
  }

  /** In order of arrival: a folder rename waiting is not overtaken by file renames after it. */
  private free(exclusive: boolean): boolean {
    return this.waiting.length === 0 && !this.exclusive && (!exclusive || this.shared === 0);
  }

  private take(exclusive: boolean): void {
    if (exclusive) this.exclusive = true;
    else this.shared++;
  }

  private wake(): void {
    while (this.waiting.length > 0) {
      const next = this.waiting[0]!;
      if (this.exclusive || (next.exclusive && this.shared > 0)) return;
      this.waiting.shift();
      this.take(next.exclusive);
      next.go();
    }
  }
}
