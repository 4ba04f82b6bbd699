import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { VERSION } from '../version.js';
import { EXIT, UserError } from './exit.js';
import { formatHelp, subcommandHelp } from './help.js';
import { wantsHelp } from './options.js';

/**
 * Each command's module is loaded when it runs: loading them all (undici, the GCS client, SQLite, pino,
 * prom-client) took 0.7 s before `gcsmount stats` or `--help` could answer, and before the parent of a
 * daemonised mount could start its child.
 */
const SUBCOMMANDS: Record<string, (args: string[]) => Promise<number>> = {
  unmount: async (args) => (await import('./unmount-command.js')).runUnmount(args),
  cache: async (args) => (await import('./cache-command.js')).runCache(args),
  stats: async (args) => (await import('./stats-command.js')).runStats(args),
  warm: async (args) => (await import('./warm-command.js')).runWarm(args),
  wait: async (args) => (await import('./wait-command.js')).runWait(args),
  emulator: async (args) => (await import('../emulator/cli.js')).runEmulatorCli(args),
};

/** Entry point: every failure ends as one line on stderr and a non-zero exit code, never a stack trace. */
export async function main(argv: string[]): Promise<void> {
  let code: number;
  try {
    const [first, ...rest] = argv;
    if (first === undefined || first === '--help' || first === '-h' || first === 'help') {
      process.stdout.write(formatHelp());
      code = first === undefined ? EXIT.usage : EXIT.ok;
    } else if (first === '--version' || first === '-v') {
      process.stdout.write(`gcsmount ${VERSION}\n`);
      code = EXIT.ok;
    } else {
      // Own keys only: a bucket named `constructor` is a mount, not Object's constructor.
      const sub = Object.hasOwn(SUBCOMMANDS, first) ? SUBCOMMANDS[first] : undefined;
      // The emulator has a help of its own; the others print their usage line.
      const subHelp = sub && first !== 'emulator' && wantsHelp(rest) ? subcommandHelp(first) : null;
      if (subHelp !== null) {
        process.stdout.write(subHelp);
        code = EXIT.ok;
      } else if (sub) code = await sub(rest);
      else if (wantsHelp(argv)) {
        // gcsfuse users type --help anywhere on a mount command line.
        process.stdout.write(formatHelp());
        code = EXIT.ok;
      } else code = await (await import('./mount-command.js')).runMount(argv);
    }
  } catch (err) {
    if (err instanceof UserError) {
      process.stderr.write(`gcsmount: ${err.message}\n`);
      code = err.exitCode;
    } else {
      const detail = err instanceof Error ? (process.env.GCSMOUNT_DEBUG ? err.stack : err.message) : String(err);
      process.stderr.write(`gcsmount: internal error: ${detail}\n`);
      code = EXIT.internal;
    }
  }
  // Let pending log writes and IPC drain, then leave even if a handle (a pool socket) lingers.
  process.exitCode = code;
  setTimeout(() => process.exit(code), 50).unref();
}

// `node dist/cli/main.js ...` runs the CLI too, not only bin/gcsmount (which imports this module and calls
// main itself): run main only when this file is the process's entry script (realpath: npm links are symlinks).
function isEntryScript(): boolean {
  const entry = process.argv[1];
  if (!entry) return false;
  try {
    return realpathSync(entry) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}
if (isEntryScript()) void main(process.argv.slice(2));
