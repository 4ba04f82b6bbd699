import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { EXIT, UserError } from './exit.js';
import { runCache } from './cache-command.js';
import { runMount } from './mount-command.js';
import { formatHelp, subcommandHelp } from './help.js';
import { wantsHelp } from './options.js';
import { runStats } from './stats-command.js';
import { runUnmount } from './unmount-command.js';
import { runWait } from './wait-command.js';
import { runWarm } from './warm-command.js';

const SUBCOMMANDS: Record<string, (args: string[]) => Promise<number>> = {
  unmount: runUnmount,
  cache: runCache,
  stats: runStats,
  warm: runWarm,
  wait: runWait,
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
      process.stdout.write('gcsmount 0.1.0\n');
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
      } else code = await runMount(argv);
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
