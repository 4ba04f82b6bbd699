import { daemonize } from './daemon.js';
import { EXIT, UserError } from './exit.js';
import { parseMountArgs, type MountOptions } from './options.js';
import { OptionError } from './values.js';

/** `gcsmount [flags] BUCKET MOUNTPOINT`. */
export async function runMount(argv: string[]): Promise<number> {
  let opts: MountOptions;
  try {
    opts = parseMountArgs(argv, process.env);
  } catch (err) {
    if (err instanceof OptionError) throw new UserError(`${err.message} (see gcsmount --help)`, EXIT.usage);
    throw err;
  }
  if (!opts.values.foreground) {
    // The daemonised child logs only to --log-file or syslog: say here, on the terminal, which settings do nothing.
    for (const notice of opts.notices) process.stderr.write(`gcsmount: ${notice}\n`);
    return daemonize(argv, opts.values['start-timeout']);
  }
  // The daemon's modules (the file system, the GCS client, the block cache) load only here: the parent of
  // a daemonised mount needs none of them to start its child and wait for it.
  return (await import('./foreground.js')).runForeground(opts);
}
