import { runNamespaceSchedules } from './namespace-schedules.js';
import { runTorture } from './torture.js';

/**
 * `npm run torture -- --seconds N [--readers N] [--seed N]`: the read torture, through real mounts;
 * then the namespace's random schedules for as long again (`--schedules-only` runs those alone).
 * Prints the reports; exits 1 on any mismatch or violation.
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
  const schedules = await namespaceSchedules(seconds, seed);
  if (args.includes('--schedules-only')) return schedules;
  const report = await runTorture({ seconds, readers: num('--readers', 6), objects: num('--objects', 16), seed, log: (l) => process.stderr.write(`${l}\n`) });
  process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
  process.stdout.write(`${report.reads} reads, ${(report.bytesCompared / 2 ** 20).toFixed(0)} MiB compared, ${report.errors} errors (${report.unexplainedErrors} unexplained), ${report.mismatches} mismatches, ${report.restarts} restarts, ${report.replacements} replacements\n`);
  return report.mismatches === 0 && schedules === 0 ? 0 : 1;
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
