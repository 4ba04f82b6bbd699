import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPO, run, tempDir } from './helpers/harness.js';

const FIXTURE = join(REPO, 'test/fixtures/take_lock_at.mjs');

/** Two processes take one lock at the same moment, `rounds` times; what each said, round by round. */
async function race(kind: 'file' | 'index', rounds: number): Promise<string[][]> {
  const dir = await tempDir('locks');
  const said: string[][] = [];
  for (let i = 0; i < rounds; i++) {
    const path = join(dir, `lock-${i}`);
    // Far enough ahead for both node processes to have loaded the modules and be spinning.
    const at = String(Date.now() + 500);
    const both = await Promise.all([0, 1].map(() => run(process.execPath, [FIXTURE, join(REPO, 'dist'), kind, path, at])));
    said.push(both.map((r) => r.stdout.trim() || `exit ${r.code}: ${r.stderr.trim()}`).sort());
  }
  return said;
}

/**
 * Two gcsmount starts on one mount point (or on one cache dir) at the same moment: exactly one takes the
 * lock and the other is told it is held. Before, each made the other fail (both held SQLite's shared lock
 * while asking for the exclusive one) and neither mounted: 55 of 60 such races.
 */
describe('an exclusive lock asked for by two processes at once', () => {
  it('is held by exactly one of them: a start lock', async () => {
    const said = await race('file', 5);
    expect(said).toEqual(Array(5).fill(['busy FileLockBusyError', 'held']));
  }, 60_000);

  it('is held by exactly one of them: a block cache index', async () => {
    const said = await race('index', 3);
    expect(said).toEqual(Array(3).fill(['busy IndexLockedError', 'held']));
  }, 60_000);
});
