import { describe, expect, it } from 'vitest';
import { runTorture } from '../src/torture/torture.js';

describe('the differential torture test (short run)', () => {
  it('never returns a wrong byte under faults, replacements, eviction and SIGKILLs', async () => {
    const report = await runTorture({ seconds: 30, readers: 3, objects: 11, seed: 7 });
    console.log('torture', JSON.stringify({ reads: report.reads, errors: report.errors, replacements: report.replacements, restarts: report.restarts, native: report.native }));
    expect(report.mismatchSamples, `daemon log: ${report.keptLog}`).toEqual([]);
    expect(report.mismatches).toBe(0);
    // It did what it says: many reads compared, faults of every kind, new generations, restarts.
    expect(report.reads).toBeGreaterThan(100);
    expect(report.bytesCompared).toBeGreaterThan(50 * 1024 * 1024);
    expect(report.faultsInjected['429']! + report.faultsInjected['503']!).toBeGreaterThan(0);
    expect(report.faultsInjected.reset! + report.faultsInjected.short!).toBeGreaterThan(0);
    expect(report.replacements).toBeGreaterThanOrEqual(10);
    expect(report.restarts).toBeGreaterThanOrEqual(1);
    expect(report.latencySpikes).toBeGreaterThan(0);
    // Sweepers of a chunk folder opened files the prefetch still had on their way: reads waited in the
    // addon for blocks to land, or for the download's memory to be lent, under the same faults,
    // replacements, eviction and SIGKILLs.
    expect(report.native.reads).toBeGreaterThan(0);
    expect(report.native.waited).toBeGreaterThan(0);
    expect(report.native.lent).toBeGreaterThan(0);
    // The injected faults (~14% of requests) must all be retried away: no request given up on but for
    // a replaced generation, and no failed read that a restart or a replacement does not explain.
    expect(report.daemonDeaths).toEqual([]);
    expect(report.gcsGaveUp).toBe(0);
    expect(report.unexplainedSamples, `daemon log: ${report.keptLog}`).toEqual([]);
    expect(report.unexplainedErrors).toBe(0);
    // Every read is checked against a generation still kept: none too old to judge.
    expect(report.unverifiable).toBe(0);
  }, 120_000);
});
