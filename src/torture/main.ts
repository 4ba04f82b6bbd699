import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { TorturePlumbing } from './case-plumbing.js';
import { runNamespaceSchedules } from './namespace-schedules.js';
import { runTorture } from './torture.js';
import { mountDifferentialCase, type MountCaseOptions } from './write-mount.js';

/**
 * `npm run torture -- --seconds N [--readers N] [--sweepers N] [--seed N]`: the namespace's random schedules, then the
 * read torture through real mounts, then the write differential through real mounts (plain, under
 * faults, across a SIGKILL), each for about N seconds (`--schedules-only`, `--writes-only` run one
 * alone). Prints the reports; exits 1 on any mismatch or violation.
 */
async function main(): Promise<number> {
  const args = process.argv.slice(2);
  const num = (flag: string, fallback: number): number => {
    const i = args.indexOf(flag);
    if (i < 0) return fallback;
    const n = Number(args[i + 1]);
    if (!Number.isInteger(n) || n <= 0) {
      process.stderr.write(`torture: ${flag} takes a positive whole number\n`);
      process.exit(2);
    }
    return n;
  };
  const seconds = num('--seconds', 60);
  const seed = num('--seed', Date.now() % 100_000);
  if (args.includes('--writes-only')) return writeDifferentials(seconds, seed);
  const schedules = await namespaceSchedules(seconds, seed);
  if (args.includes('--schedules-only')) return schedules;
  const report = await runTorture({ seconds, readers: num('--readers', 6), sweepers: num('--sweepers', 2), objects: num('--objects', 16), seed, log: (l) => process.stderr.write(`${l}\n`) });
  process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
  process.stdout.write(`${report.reads} reads, ${(report.bytesCompared / 2 ** 20).toFixed(0)} MiB compared, ${report.errors} errors (${report.unexplainedErrors} unexplained), ${report.mismatches} mismatches, ${report.restarts} restarts, ${report.replacements} replacements; native reads ${report.native.reads} (${report.native.waited} waited for their block, ${report.native.lent} blocks lent from their download, ${report.native.fallbacks} given back)\n`);
  const writes = await writeDifferentials(seconds, seed);
  return report.mismatches === 0 && schedules === 0 && writes === 0 ? 0 : 1;
}

/**
 * The cases taken in turn; the last has two mounts of the bucket take turns (MountCaseOptions.secondMount).
 * Each round of them runs with big writes or without, alternately.
 */
const WRITE_CASES: Array<Pick<MountCaseOptions, 'variant' | 'secondMount'> & { label: string }> = [
  { label: 'plain', variant: 'plain' },
  { label: 'faults', variant: 'faults' },
  { label: 'sigkill', variant: 'sigkill' },
  { label: 'two mounts', variant: 'plain', secondMount: true },
];

/**
 * Write differential cases from `seed` on, one kind after another, until `seconds` have passed (each
 * kind at least once); 1 if any answer, file or object differed, or a crash left what it must not.
 */
async function writeDifferentials(seconds: number, seed: number): Promise<number> {
  const until = Date.now() + seconds * 1000;
  let cases = 0;
  let steps = 0;
  let failed = 0;
  for (let i = 0; i < WRITE_CASES.length || Date.now() < until; i++) {
    const { label, ...kind } = WRITE_CASES[i % WRITE_CASES.length]!;
    const plumbing = new TorturePlumbing(mkdtempSync(join(tmpdir(), 'gcsmount-wtorture-')));
    try {
      const r = await mountDifferentialCase(plumbing, { seed: seed + i, ...kind, ops: 1000, bigWrites: Math.floor(i / WRITE_CASES.length) % 2 === 1 });
      cases++;
      steps += r.report.steps;
      const crash = r.crash ?? [];
      if (r.report.mismatchCount + crash.length > 0) {
        failed++;
        const first = [...r.report.mismatches.map((m) => JSON.stringify(m)), ...crash].slice(0, 3).join('; ');
        process.stdout.write(`write differential: seed ${seed + i} (${label}): ${r.report.mismatchCount} mismatches, ${crash.length} crash violations, first: ${first}\n`);
      }
    } finally {
      await plumbing.cleanup();
    }
  }
  process.stdout.write(`write differential: ${cases} cases from seed ${seed} (${WRITE_CASES.map((c) => c.label).join(', ')}), ${steps} steps, ${failed} with differences\n`);
  return failed === 0 ? 0 : 1;
}

/** Runs batches of the namespace's schedules from `seed` on for `seconds`; 1 if any broke a rule. */
async function namespaceSchedules(seconds: number, seed: number): Promise<number> {
  const until = Date.now() + seconds * 1000;
  let next = seed;
  let ran = 0;
  let operations = 0;
  while (Date.now() < until) {
    const r = await runNamespaceSchedules({ firstSeed: next, count: 100 });
    next += r.schedules;
    ran += r.schedules;
    operations += r.operations;
    if (r.violations.length > 0) {
      process.stdout.write(`namespace schedules: ${r.violations.length} violations, first: ${JSON.stringify(r.violations.slice(0, 5))}\n`);
      return 1;
    }
  }
  process.stdout.write(`namespace schedules: ${ran} schedules from seed ${seed}, ${operations} operations, 0 violations\n`);
  return 0;
}

main().then(
  (code) => process.exit(code),
  (err: Error) => {
    process.stderr.write(`torture failed: ${err.message}\n`);
    process.exit(1);
  },
);
