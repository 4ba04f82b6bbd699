import { afterAll, describe, expect, it } from 'vitest';
import { cleanupAll } from './helpers/harness.js';
import { mountDifferentialCase } from './helpers/write-mount.js';
afterAll(cleanupAll);
describe('seeds', () => {
  for (const seed of [2, 3, 4, 5]) {
    it(`seed ${seed}`, async () => {
      const r = await mountDifferentialCase({ seed, variant: 'plain', ops: 2000 });
      expect(r.report.mismatches.slice(0, 2)).toEqual([]);
    }, 900_000);
  }
  it('faults', async () => {
    const r = await mountDifferentialCase({ seed: 7, variant: 'faults', ops: 1000 });
    expect(r.report.mismatches.slice(0, 2)).toEqual([]);
  }, 900_000);
  it('sigkill', async () => {
    const r = await mountDifferentialCase({ seed: 8, variant: 'sigkill', ops: 1000 });
    expect(r.report.mismatches.slice(0, 2)).toEqual([]);
    expect(r.crash).toEqual([]);
  }, 900_000);
});
