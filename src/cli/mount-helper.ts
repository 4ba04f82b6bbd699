import { spawn } from 'node:child_process';
import { constants } from 'node:os';
import { basename } from 'node:path';
import { fileURLToPath } from 'node:url';
import { EXIT, UserError } from './exit.js';
import { GCSFUSE_ONLY_PARAMS, PARAMS, type Param } from './params.js';

// `mount.gcsmount`: what mount(8) runs for `mount -t gcsmount` and for fstab lines of type gcsmount,
// as gcsfuse's mount.gcsfuse does for gcsfuse. mount(8) calls it as
//   mount.gcsmount BUCKET MOUNTPOINT [-s] [-f] [-n] [-v] [-o OPTIONS]
// and it runs `gcsmount [flags] BUCKET MOUNTPOINT`, which returns once the mount answers.

const USAGE = 'usage: mount.gcsmount BUCKET MOUNTPOINT [-s] [-f] [-n] [-v] [-o OPTIONS]';

/**
 * Options that are mount(8)'s or systemd's business, not the file system's: dropped, as gcsfuse's helper
 * drops user, nouser, auto, noauto, _netdev and no_netdev (fusermount refuses them).
 */
const MOUNT_ONLY = new Set(['defaults', 'auto', 'noauto', 'user', 'nouser', 'users', 'owner', 'group', '_netdev', 'no_netdev', 'nofail', 'comment']);

/** Generic kernel and FUSE mount options: passed on as `-o NAME`; gcsmount uses or logs each (README "Using it"). */
const KERNEL = new Set([
  'ro', 'rw', 'allow_other', 'allow_root', 'default_permissions',
  'dev', 'nodev', 'suid', 'nosuid', 'exec', 'noexec',
  'atime', 'noatime', 'relatime', 'norelatime', 'strictatime', 'diratime', 'nodiratime',
  'sync', 'async', 'dirsync', 'lazytime', 'nolazytime', 'silent', 'loud',
]);

/** What the helper may not set: the bucket and mountpoint come from mount(8)'s arguments, -o from the rest. */
const NOT_AN_OPTION = new Set(['o', 'bucket', 'mount-point']);

// gcsfuse's options that do nothing here too: gcsmount takes them (a warning names each), so an fstab line
// written for gcsfuse (machine_type=..., disable_autoconfig) must not fail in the helper alone.
const PARAM_BY_FLAG = new Map<string, Param>([...PARAMS, ...GCSFUSE_ONLY_PARAMS].map((p) => [p.flag, p as Param]));

/** gcsmount's parameter for an option name: underscores as dashes (as gcsfuse's helper), or the name as is (debug_fuse). */
function paramFor(name: string): Param | undefined {
  for (const flag of [name.replace(/_/g, '-'), name]) {
    const param = PARAM_BY_FLAG.get(flag);
    if (param && !NOT_AN_OPTION.has(param.flag)) return param;
  }
  return undefined;
}

export interface HelperInvocation {
  bucket: string;
  mountPoint: string;
  /** gcsmount's arguments, bucket and mountpoint last. */
  args: string[];
  /** -f: show what would run, mount nothing. */
  fake: boolean;
  /** -v: say what runs. */
  verbose: boolean;
  /** Options left out under -s (sloppy), to be reported. */
  skipped: string[];
}

/** mount(8)'s arguments -> gcsmount's. Throws a UserError (exit 2) for an option gcsmount does not know. */
export function translateMountArgs(argv: readonly string[]): HelperInvocation {
  const positionals: string[] = [];
  const options: string[] = [];
  let sloppy = false;
  let fake = false;
  let verbose = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '-o') {
      const list = argv[++i];
      if (list === undefined) throw new UserError(`-o needs a list of options; ${USAGE}`, EXIT.usage);
      options.push(...list.split(','));
    } else if (a.startsWith('-o')) {
      options.push(...a.slice(2).split(','));
    } else if (a === '-t') {
      i++; // the type (gcsmount, or fuse.gcsmount): we are its helper
    } else if (/^-[sfnv]+$/.test(a)) {
      // -n (do not write /etc/mtab) needs nothing: the kernel's mount table is the only one.
      sloppy ||= a.includes('s');
      fake ||= a.includes('f');
      verbose ||= a.includes('v');
    } else if (a.startsWith('-') && a !== '-') {
      throw new UserError(`unknown argument ${a}; ${USAGE}`, EXIT.usage);
    } else {
      positionals.push(a);
    }
  }
  if (positionals.length !== 2) throw new UserError(USAGE, EXIT.usage);
  const [device, mountPoint] = positionals as [string, string];
  // mount(8) turns the device into a path when a folder of the bucket's name is where it runs
  // (`mount -t gcsmount era5 /mnt/era5` from a folder holding era5/); bucket names have no '/', so a
  // device with one is such a path and its last part the bucket, as gcsfuse's helper takes it.
  const bucket = device.includes('/') ? basename(device) : device;

  const args: string[] = [];
  const skipped: string[] = [];
  for (const option of options) {
    if (option === '') continue;
    const eq = option.indexOf('=');
    const name = eq >= 0 ? option.slice(0, eq) : option;
    const value = eq >= 0 ? option.slice(eq + 1) : null;
    // x-* options (x-systemd.automount, x-mount.mkdir) are comments for userspace tools by definition.
    if (MOUNT_ONLY.has(name) || name.startsWith('x-')) continue;
    if (KERNEL.has(name) && value === null) {
      args.push('-o', name);
      continue;
    }
    const param = paramFor(name);
    if (!param) {
      if (sloppy) {
        skipped.push(option);
        continue;
      }
      throw new UserError(`unknown mount option ${option}: neither a mount option nor a gcsmount flag (see gcsmount --help)`, EXIT.usage);
    }
    if (param.type === 'bool') {
      // A bool flag takes its value only in the --flag=value form.
      args.push(value === null ? `--${param.flag}` : `--${param.flag}=${value}`);
    } else if (value === null) {
      throw new UserError(`mount option ${name} needs a value (${name}=VALUE)`, EXIT.usage);
    } else {
      args.push(`--${param.flag}`, value);
    }
  }
  args.push(bucket, mountPoint);
  return { bucket, mountPoint, args, fake, verbose, skipped };
}

/** The gcsmount entry script next to this helper's: bin/gcsmount of the same installation. */
function gcsmountEntry(): string {
  return fileURLToPath(new URL('../../bin/gcsmount', import.meta.url));
}

/** Runs gcsmount with the translated arguments and returns its exit code (it returns once mounted). */
export async function runMountHelper(argv: readonly string[]): Promise<number> {
  if (argv.length === 1 && (argv[0] === '--help' || argv[0] === '-h')) {
    process.stdout.write(`${USAGE}\n`);
    return EXIT.ok;
  }
  const call = translateMountArgs(argv);
  for (const option of call.skipped) process.stderr.write(`mount.gcsmount: ignoring unknown mount option ${option} (-s)\n`);
  if (call.verbose || call.fake) process.stderr.write(`mount.gcsmount: gcsmount ${call.args.join(' ')}\n`);
  if (call.fake) return EXIT.ok;
  const child = spawn(process.execPath, [gcsmountEntry(), ...call.args], { stdio: 'inherit' });
  return new Promise<number>((resolve) => {
    child.on('exit', (code, signal) => resolve(code ?? 128 + (signal ? constants.signals[signal] : 0)));
    child.on('error', (err) => {
      process.stderr.write(`mount.gcsmount: cannot run gcsmount: ${err.message}\n`);
      resolve(EXIT.internal);
    });
  });
}

/** bin/mount.gcsmount's entry: a problem is one line on stderr and an exit code (README "Exit codes"). */
export async function mountHelperMain(argv: readonly string[]): Promise<void> {
  let code: number;
  try {
    code = await runMountHelper(argv);
  } catch (err) {
    const message = err instanceof UserError ? err.message : `internal error: ${err instanceof Error ? err.message : String(err)}`;
    process.stderr.write(`mount.gcsmount: ${message}\n`);
    code = err instanceof UserError ? err.exitCode : EXIT.internal;
  }
  process.exitCode = code;
}
