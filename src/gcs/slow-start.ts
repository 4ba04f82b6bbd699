/**
 * The request rate's slow start (rate-controller.ts says why it starts from the floor and ends where it
 * does): the rate doubles at each multiple of `slowStartStepMs` of the wall clock, so that daemons on
 * other machines step together and hold the same rate until their slow starts end; and each step is
 * earned by use.
 */
import { MEASURABLE_GRANTS } from './rate-window.js';

export interface SlowStartConfig {
  /** While slow-starting, the rate grows by `slowStartGrowth` at each multiple of this many ms of the wall clock. */
  slowStartStepMs: number;
  /** The factor of each slow-start step. */
  slowStartGrowth: number;
}

/** Wall-clock steps passed since the last taken, and the grants made in them. */
export interface StepsTaken {
  steps: number;
  grants: number;
}

export class SlowStart {
  /** The wall-clock step the slow start last grew at, and the grants since. */
  private lastStep = 0;
  private grants = 0;

  constructor(
    private readonly cfg: SlowStartConfig,
    /** The wall clock (ms), shared by daemons on other machines. */
    private readonly wallNow: () => number,
  ) {}

  /** Counts steps from the wall clock's current one. */
  begin(): void {
    this.lastStep = this.currentStep();
    this.grants = 0;
  }

  granted(): void {
    this.grants++;
  }

  /** The steps passed since the last taken (null: none), and counts afresh from now. */
  take(): StepsTaken | null {
    const step = this.currentStep();
    if (step <= this.lastStep) return null;
    const taken = { steps: step - this.lastStep, grants: this.grants };
    this.grants = 0;
    this.lastStep = step;
    return taken;
  }

  /**
   * What `rate` grows to over `taken`: a step is earned by using the rate, no more than
   * `slowStartGrowth` times what was granted in the steps since the last (readers slower than the rate
   * would otherwise let it double to nonsense, and the 429 that ends the slow start would halve
   * nonsense). Below a few tokens per step the count says nothing, and waiting is enough.
   */
  grown(rate: number, taken: StepsTaken): number {
    const ms = taken.steps * this.cfg.slowStartStepMs;
    const used = (taken.grants * 1000) / ms;
    const full = rate * this.cfg.slowStartGrowth ** taken.steps;
    return (rate * ms) / 1000 < MEASURABLE_GRANTS ? full : Math.min(full, Math.max(rate, this.cfg.slowStartGrowth * used));
  }

  /** Milliseconds until the next wall-clock step. */
  untilNextStep(): number {
    return this.cfg.slowStartStepMs - (this.wallNow() % this.cfg.slowStartStepMs);
  }

  private currentStep(): number {
    return Math.floor(this.wallNow() / this.cfg.slowStartStepMs);
  }
}
