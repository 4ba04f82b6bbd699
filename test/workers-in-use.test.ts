import { describe, expect, it } from 'vitest';
import { WorkersInUse } from '../src/gcs/workers-in-use.js';

let cpus = 16;
const LIMITS = { grow: 0.7, busyWindows: 4, shrink: 0.2, idleWindows: 8, cpus: () => cpus };

/** Feeds `n` windows at `utilization` with `total` workers; returns how many are in use after. */
function feed(w: WorkersInUse, utilization: number, n: number, total = 4): number {
  for (let i = 0; i < n; i++) w.observe(utilization, total);
  return w.of(total);
}

describe('download workers in use', () => {
  it('starts with one, and adds one per run of busy windows, never past the workers there are', () => {
    const w = new WorkersInUse(LIMITS);
    expect(w.of(4)).toBe(1);
    expect(feed(w, 0.95, 3)).toBe(1); // a burst
    expect(feed(w, 0.95, 1)).toBe(2);
    expect(feed(w, 0.95, 4)).toBe(3);
    expect(feed(w, 0.95, 40)).toBe(4);
    expect(w.of(0)).toBe(0);
  });

  it('a window that is not busy starts the run again', () => {
    const w = new WorkersInUse(LIMITS);
    for (let i = 0; i < 10; i++) {
      feed(w, 0.9, 3);
      feed(w, 0.5, 1);
    }
    expect(w.of(4)).toBe(1);
  });

  it('lets one go after a run of idle windows, keeps one always, and holds between the thresholds', () => {
    const w = new WorkersInUse(LIMITS);
    feed(w, 0.9, 8);
    expect(w.of(4)).toBe(3);
    expect(feed(w, 0.4, 100)).toBe(3); // neither busy nor idle
    expect(feed(w, 0.1, 7)).toBe(3);
    expect(feed(w, 0.3, 1)).toBe(3); // the idle run is broken
    expect(feed(w, 0.1, 8)).toBe(2);
    expect(feed(w, 0.0, 100)).toBe(1);
  });

  it('uses no more workers than the CPUs it may run on, less the main thread\'s', () => {
    cpus = 3;
    const w = new WorkersInUse(LIMITS);
    expect(feed(w, 0.95, 40)).toBe(2);
    cpus = 1; // pinned to one core
    expect(feed(w, 0.95, 1)).toBe(1);
    cpus = 16;
    expect(feed(w, 0.95, 4)).toBe(2);
  });

  it('follows the workers there are when one is lost', () => {
    const w = new WorkersInUse(LIMITS);
    feed(w, 0.9, 12, 4);
    expect(w.of(4)).toBe(4);
    expect(w.of(2)).toBe(2);
    w.observe(0.5, 2);
    expect(w.of(4)).toBe(2);
  });
});
