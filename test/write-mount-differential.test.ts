import { afterAll, describe, expect, it } from 'vitest';
import { cleanupAll } from './helpers/harness.js';
import { mountDifferentialCase } from './helpers/write-mount.js';

afterAll(cleanupAll);

describe('the write differential against a real mount', () => {
  it('plain: the mount, the bucket and a local folder agree after every step', async () => {
    const r = await mountDifferentialCase({ seed: 1, variant: 'plain', ops: 600, log: (l) => console.log(l) });
    expect(r.report.mismatches.slice(0, 3)).toEqual([]);
  }, 900_000);
});
