import { readFileSync } from 'node:fs';
import { afterAll, it } from 'vitest';
import { cleanupAll } from './helpers/harness.js';
import { mountDifferentialCase } from './helpers/write-mount.js';
import { generateWriteOps } from '../src/torture/write-ops.js';
afterAll(async () => { if (!process.env.KEEP) await cleanupAll(); });
const seed = Number(process.env.SEED ?? 4);
const variant = (process.env.VARIANT ?? 'plain') as 'plain';
const n = Number(process.env.OPS ?? 2000);
it('debug', async () => {
  const logs: string[] = [];
  const r = await mountDifferentialCase({ seed, variant, ops: n, bigWrites: !!process.env.BIG, mountArgs: process.env.MOUNTARGS ? process.env.MOUNTARGS.split(' ') : undefined });
  const m = r.report.mismatches[0];
  if (!m) return console.log('NO MISMATCH');
  console.log(JSON.stringify(m).slice(0, 1500));
  const ops = generateWriteOps({ seed, count: n, bigWrites: !!process.env.BIG });
  const words = (process.env.WORDS ?? '').split(',').filter(Boolean);
  ops.slice(0, m.index + 1).forEach((o, i) => {
    const s = JSON.stringify(o);
    if (words.length === 0 || words.some((w) => s.includes(w)) || /rename|rmdir|mkdir/.test(s)) console.log(i, s.slice(0, 180));
  });
  void logs;
}, 900_000);
