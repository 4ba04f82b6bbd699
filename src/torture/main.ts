import { runTorture } from './torture.js';

/** `npm run torture -- --seconds N [--readers N] [--seed N]`: prints the report; exits 1 on any mismatch. */
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
  const report = await runTorture({ seconds, readers: num('--readers', 6), objects: num('--objects', 16), seed: num('--seed', Date.now() % 100_000), log: (l) => process.stderr.write(`${l}\n`) });
  process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
  process.stdout.write(`${report.reads} reads, ${(report.bytesCompared / 2 ** 20).toFixed(0)} MiB compared, ${report.errors} errors (${report.unexplainedErrors} unexplained), ${report.mismatches} mismatches, ${report.restarts} restarts, ${report.replacements} replacements\n`);
  return report.mismatches === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err: Error) => {
    process.stderr.write(`torture failed: ${err.message}\n`);
    process.exit(1);
  },
);
