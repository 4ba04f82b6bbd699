import { controlRequest, type MountInfo } from '../observe/control-server.js';
import { controlSocketFor } from '../observe/runtime-dir.js';
import { EXIT, UserError } from './exit.js';
import { parseMountArgs } from './options.js';
import { OptionError } from './values.js';

const USAGE = 'usage: gcsmount wait (MOUNTPOINT | --config-file FILE) [--timeout SECONDS]';

/**
 * `gcsmount wait`: exits 0 once the daemon for a mount answers on its control socket, which it opens
 * only after the kernel has accepted the mount. systemd's ExecStartPost uses it as the readiness check.
 */
export async function runWait(args: string[]): Promise<number> {
  let mountPoint: string | undefined;
  let configFile: string | undefined;
  let timeoutS = 60;
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!;
    if (a === '--config-file' && args[i + 1]) configFile = args[++i];
    else if (a === '--timeout' && args[i + 1] && Number(args[i + 1]) > 0) timeoutS = Number(args[++i]);
    else if (!a.startsWith('-') && !mountPoint) mountPoint = a;
    else throw new UserError(`unexpected argument ${a}; ${USAGE}`, EXIT.usage);
  }
  if (!mountPoint && configFile) {
    try {
      mountPoint = parseMountArgs(['--config-file', configFile]).mountPoint;
    } catch (err) {
      if (err instanceof OptionError) throw new UserError(err.message, EXIT.usage);
      throw err;
    }
  }
  if (!mountPoint) throw new UserError(USAGE, EXIT.usage);
  const deadline = Date.now() + timeoutS * 1000;
  const socketPath = await controlSocketFor(mountPoint);
  for (;;) {
    const info = await controlRequest<MountInfo>(socketPath, '/info', 'GET', 1000);
    if (info) return EXIT.ok;
    if (Date.now() > deadline) throw new UserError(`${mountPoint} did not come up within ${timeoutS} s`, EXIT.mountPoint);
    await new Promise((r) => setTimeout(r, 200));
  }
}
