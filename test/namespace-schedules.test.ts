import { describe, expect, it } from 'vitest';
import { runNamespaceSchedules, runSchedule } from '../src/torture/namespace-schedules.js';

describe('namespace property test: random concurrent schedules against a model bucket', () => {
  // Seeds that found bugs, kept: 8, runs of a walk's parts overlapping in a folder's listing (names twice,
  // out of order, and "no such file" from the binary search); 33, a walk answering for a folder it no
  // longer held with an empty listing; 1 and 6, an empty page with a token taken for the end of a part.
  it.each([1, 6, 8, 33])('seed %i, which once found a bug, passes', async (seed) => {
    const one = await runSchedule(seed, 6, 25);
    expect(one.violations).toEqual([]);
  });

  it('never reports an existing name missing, a missing one found, or a name twice in a listing', async () => {
    const report = await runNamespaceSchedules({ firstSeed: 100, count: 2000 });
    expect(report.violations.slice(0, 10)).toEqual([]);
    // It did what it says: many operations, GCS asked many times.
    expect(report.operations).toBeGreaterThan(250_000);
    expect(report.requests).toBeGreaterThan(200_000);
  }, 240_000);
});
