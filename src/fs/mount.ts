import { execFile, spawn } from 'node:child_process';
import { promises as fsp, readFileSync } from 'node:fs';
import { promisify } from 'node:util';
import type { Logger } from '../observe/logger.js';
import { timerDelay } from '../units.js';
import { OP, type FuseAddon, type RequestListener, type SessionHandle } from './kernel.js';
import { canonicalMountPoint, startLockFor } from '../observe/runtime-dir.js';
import { FileLockBusyError, holdFileLock, type FileLock } from '../file-lock.js';

const run = promisify(execFile);

export class MountPointError extends Error {
  override readonly name = 'MountPointError';
}

/** One line of the mount table. */
interface MountEntry {
  /** The mount's ID in the table (mountinfo's first field). */
  id: string;
  path: string;
  /** "major:minor" of the mounted file system: a FUSE connection's own (its number under /sys/fs/fuse/connections). */
  device: string;
  type: string;
}

/** The mount table, oldest mount first, with the kernel's octal escapes undone. */
function parseMountInfo(text: string): MountEntry[] {
  const entries: MountEntry[] = [];
  for (const line of text.split('\n')) {
    const fields = line.split(' ');
    const id = fields[0];
    const path = fields[4];
    const device = fields[2];
    // After the optional fields, a lone "-", then the type.
    const separator = fields.indexOf('-', 6);
    const type = separator > 0 ? fields[separator + 1] : undefined;
    if (id && path && device && type) entries.push({ id, path: path.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8))), device, type });
  }
  return entries;
}

async function mountTable(): Promise<MountEntry[]> {
  return parseMountInfo(await fsp.readFile('/proc/self/mountinfo', 'utf8'));
}

/**
 * What is mounted on top at `path` (what a lookup of it reaches), as "mount ID/device", or null. Both
 * numbers are reused once free; a successor would need both of a mount's to be taken for it.
 */
function topIdentity(table: MountEntry[], path: string): string | null {
  let identity: string | null = null;
  for (const e of table) if (e.path === path) identity = identityOf(e);
  return identity;
}

function identityOf(e: MountEntry): string {
  return `${e.id}/${e.device}`;
}

/** Mount points currently in the mount table. */
export async function mountedPaths(): Promise<Set<string>> {
  return new Set((await mountTable()).map((e) => e.path));
}

/** The file system type of each mount point in the mount table (`fuse.gcsmount` for ours); the last mount of a path wins. */
export async function mountedTypes(): Promise<Map<string, string>> {
  const types = new Map<string, string>();
  for (const e of await mountTable()) types.set(e.path, e.type);
  return types;
}

/**
 * Holds the mount point's start lock while a daemon checks and mounts it. Two starts at once both found
 * it free and both mounted, one over the other. The second is refused at once: waiting would only find
 * the first one's mount.
 */
export async function holdStartLock(path: string): Promise<FileLock> {
  try {
    return holdFileLock(await startLockFor(path), true);
  } catch (err) {
    if (err instanceof FileLockBusyError) throw new MountPointError(`mountpoint ${path} is being mounted by another gcsmount right now`);
    throw err;
  }
}

async function lazyUnmount(path: string): Promise<void> {
  try {
    await run('fusermount3', ['-u', '-z', path]);
  } catch {
    await run('umount', ['-l', path]);
  }
}

/**
 * Checks that `path` can take a new mount, and clears a stale one: a daemon killed without unmounting
 * leaves its mount behind, answering "Transport endpoint is not connected" to everything.
 * Returns the absolute path to mount on.
 */
export async function prepareMountPoint(path: string): Promise<string> {
  let abs = path;
  try {
    abs = await fsp.realpath(path);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOTCONN') {
      // A stale mount: resolved without touching it, as the clients resolve it (symlinks included).
      abs = await canonicalMountPoint(path);
    } else if (code === 'ENOENT') {
      throw new MountPointError(`mountpoint ${path} does not exist`);
    } else {
      throw new MountPointError(`mountpoint ${path} cannot be used: ${code ?? String(err)}`);
    }
  }
  try {
    const st = await fsp.stat(abs);
    if (!st.isDirectory()) throw new MountPointError(`mountpoint ${path} is not a directory`);
  } catch (err) {
    if (err instanceof MountPointError) throw err;
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== 'ENOTCONN' && code !== 'ECONNABORTED') throw new MountPointError(`mountpoint ${path} cannot be used: ${code ?? String(err)}`);
    await lazyUnmount(abs).catch((e: Error) => {
      throw new MountPointError(`mountpoint ${path} holds a stale mount that could not be removed: ${e.message.split('\n')[0]}`);
    });
    return prepareMountPoint(path);
  }
  if ((await mountedPaths()).has(abs)) {
    // stat may be answered from the kernel's cached attributes for a while after its daemon died;
    // statfs always asks the daemon, so a dead one shows here.
    const dead = await fsp.statfs(abs).then(
      () => false,
      (err: NodeJS.ErrnoException) => err.code === 'ENOTCONN' || err.code === 'ECONNABORTED',
    );
    if (!dead) throw new MountPointError(`mountpoint ${path} is already mounted (busy); unmount it first`);
    await lazyUnmount(abs).catch((e: Error) => {
      throw new MountPointError(`mountpoint ${path} holds a stale mount that could not be removed: ${e.message.split('\n')[0]}`);
    });
    return prepareMountPoint(path);
  }
  return abs;
}

/**
 * A value inside libfuse's `-o` list, which is split at commas and takes a backslash to escape the next
 * character: unescaped, a bucket named `b,allow_other` would add a mount option.
 */
export function escapeOption(value: string): string {
  return value.replace(/[\\,]/g, (c) => `\\${c}`);
}

export interface KernelOptions {
  /** -o ro: the kernel refuses every change (EROFS) before it reaches us. */
  readOnly: boolean;
  /** Shown as the mount's source in `mount` and `df`. */
  fsName: string;
  allowOther: boolean;
  /** Further mount options (name or name=value) passed to libfuse. */
  extra: string[];
  /** Kernel requests queued to us at once (FUSE max_background): readahead and async reads. */
  maxBackground: number;
  /** Past this many, the kernel holds back readahead (FUSE congestion_threshold); 0: three quarters of maxBackground. */
  congestionThreshold: number;
  /** Lookups and listings of one folder may reach us in parallel (FUSE_PARALLEL_DIROPS). */
  parallelDirops: boolean;
  /** See MountTuning.readHandlesBelow. */
  readHandlesBelow: number;
}

/** What an unmount did: unmounted, or detached while busy and then ended within the grace or not. */
export type UnmountOutcome = 'ended' | 'detached-ended' | 'detached-timed-out';

/** How long an unmount waits for the session to end, unless told otherwise. */
const DEFAULT_GRACE_MS = 5_000;

/** EIO, for requests that arrive once the daemon has stopped serving (after the grace period). */
const EIO = 5;

function within(p: Promise<void>, ms: number): Promise<boolean> {
  return new Promise((resolve) => {
    const t = setTimeout(() => resolve(false), timerDelay(ms));
    void p.then(() => {
      clearTimeout(t);
      resolve(true);
    });
  });
}

/**
 * A live FUSE mount of our operations. It lives as long as the kernel's session, not as long as the
 * mount table entry: a lazy unmount (`umount -l`, or ours when busy) takes the mount out of the table at
 * once, but processes with files open there keep reading, and the kernel ends the session (the receive
 * loop returns) only when the last of them lets go.
 */
export class FuseMount {
  private watcher: NodeJS.Timeout | null = null;
  private unmounting: Promise<UnmountOutcome> | null = null;
  private onGone: (() => void) | null = null;
  /** The session has ended. */
  private over = false;

  private constructor(
    readonly path: string,
    /**
     * This mount's identity (mount ID and device), read from the mount table as it appeared (null if
     * it could not be): after a lazy unmount another daemon may mount on the same path, and a path
     * alone took that one for ours (our stop then unmounted it).
     */
    private readonly identity: string | null,
    /** Resolves when the kernel connection has ended (unmounted from anywhere, or aborted). */
    readonly ended: Promise<void>,
    /** The addon's session: for notifications to the kernel (invalidations). */
    readonly session: SessionHandle,
    /** Set once the daemon stops serving: every request still arriving is answered EIO, not handled. */
    private readonly gate: { closed: boolean },
  ) {
    void ended.then(() => {
      this.over = true;
      if (!this.unmounting && this.onGone) {
        const gone = this.onGone;
        this.onGone = null;
        this.stopWatching();
        gone();
      }
    });
  }

  static mount(path: string, fuse: FuseAddon, onRequest: RequestListener, k: KernelOptions): FuseMount {
    // Entry, attribute and negative timeouts are per reply in the low-level API, not mount options. No
    // max_read: the kernel's requests are bounded by max_pages (1 MiB), which libfuse 3.14 negotiates.
    const options = [k.readOnly ? 'ro' : 'rw', `fsname=${escapeOption(k.fsName)}`, 'subtype=gcsmount', 'default_permissions', ...k.extra];
    if (k.allowOther) options.push('allow_other');
    let exited!: () => void;
    const ended = new Promise<void>((r) => (exited = r));
    const gate = { closed: false };
    const listener: RequestListener = (op, req, ino, a, b, c, name, reason, name2, data) => {
      if (op === OP.EXITED) exited();
      else if (gate.closed) {
        if (req) fuse.replyErr(req, EIO);
      } else onRequest(op, req, ino, a, b, c, name, reason, name2, data);
    };
    let session: SessionHandle;
    try {
      session = fuse.mount(path, ['-o', options.join(',')], listener, {
        maxBackground: k.maxBackground,
        congestionThreshold: k.congestionThreshold > 0 ? k.congestionThreshold : Math.max(1, Math.floor((k.maxBackground * 3) / 4)),
        parallelDirops: k.parallelDirops,
        readHandlesBelow: k.readHandlesBelow,
      });
    } catch (err) {
      throw new MountPointError(`cannot mount ${path}: ${(err as Error).message}`);
    }
    // Read at once, synchronously: no other mount can be made on this path meanwhile (its daemon's start
    // finds this one mounted).
    let identity: string | null = null;
    try {
      identity = topIdentity(parseMountInfo(readFileSync('/proc/self/mountinfo', 'utf8')), path);
    } catch {
      // no mount table to read: known by path alone
    }
    return new FuseMount(path, identity, ended, session, gate);
  }

  /** Whether this mount is in the mount table (not detached by a lazy unmount). */
  private attached(table: MountEntry[]): boolean {
    return table.some((e) => e.path === this.path && (this.identity === null || identityOf(e) === this.identity));
  }

  /** Whether a lookup of the path reaches this mount, so that unmounting the path unmounts it and nothing else. */
  private onTop(table: MountEntry[]): boolean {
    const top = topIdentity(table, this.path);
    return top !== null && (this.identity === null || top === this.identity);
  }

  /**
   * Calls `onGone` once when the kernel ends the session (an unmount from anywhere, once nothing holds
   * the mount any more, or an abort), and `onDetached` once if the mount leaves the mount table while
   * the session goes on (a lazy unmount with files still open: they are served until closed).
   */
  watch(onGone: () => void, onDetached: () => void = () => undefined, intervalMs = 1000): void {
    this.onGone = onGone;
    this.watcher = setInterval(() => {
      if (this.unmounting) return;
      mountTable().then((table) => {
        if (!this.attached(table) && !this.unmounting && this.onGone) {
          this.stopWatching();
          onDetached();
        }
      }, () => undefined);
    }, intervalMs);
    this.watcher.unref();
  }

  /**
   * Unmounts, and resolves once the kernel has ended the session, so that nothing the handlers use is
   * closed while it still sends requests. Busy (files open, a cwd inside): detached lazily, and the open
   * files are served for up to `graceMs`; past that, requests are answered EIO from here on and the
   * caller may close up (the process's exit then ends the session).
   */
  unmount(graceMs = DEFAULT_GRACE_MS, onBusy: () => void = () => undefined): Promise<UnmountOutcome> {
    this.stopWatching();
    this.unmounting ??= (async (): Promise<UnmountOutcome> => {
      // Not on top (detached, or something mounted over it): unmounting the path would take another mount.
      let detached = !this.onTop(await mountTable());
      if (!detached) {
        try {
          await run('fusermount3', ['-u', this.path]);
        } catch {
          await lazyUnmount(this.path).catch(() => undefined);
          detached = true;
        }
      }
      if (detached && !this.over) onBusy();
      if (await within(this.ended, graceMs)) return detached ? 'detached-ended' : 'ended';
      this.gate.closed = true;
      return 'detached-timed-out';
    })();
    return this.unmounting;
  }

  private stopWatching(): void {
    if (this.watcher) clearInterval(this.watcher);
    this.watcher = null;
  }
}

/** The mount's "major:minor", as /sys/class/bdi names its readahead settings. */
async function deviceOf(path: string): Promise<string | null> {
  const text = await fsp.readFile('/proc/self/mountinfo', 'utf8');
  for (const line of text.split('\n')) {
    const f = line.split(' ');
    if (f[4]?.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8))) === path) return f[2] ?? null;
  }
  return null;
}

/**
 * Sets the mount's read_ahead_kb, so that buffered sequential reads reach us as requests of up to
 * 1 MiB, not the kernel's default 128 KiB. Only root may write it: otherwise says so, once.
 *
 * Only once the kernel has taken our INIT reply: it lowers read_ahead_kb to the reply's max_readahead
 * (the 128 KiB it offered), and a value written before that was undone in 3 of 11 starts of a probe
 * (then every 1 MiB chunk file came as four reads of 256 KiB, not one; 0 of 14 since). Any request on the
 * mount waits for INIT: a statfs (see initialized). Not a stat: the root's attributes would stay in the
 * kernel, which then answers a stat of a dead mount itself.
 */
export async function setReadAhead(path: string, kb: number, log: Logger): Promise<void> {
  if (kb <= 0) return;
  const dev = await deviceOf(path);
  if (!dev) return;
  await initialized(path);
  try {
    await fsp.writeFile(`/sys/class/bdi/${dev}/read_ahead_kb`, `${kb}\n`);
    log.debug({ device: dev, readAheadKb: kb }, 'raised the mount\'s read_ahead_kb');
  } catch (err) {
    log.info(
      { device: dev, err: (err as NodeJS.ErrnoException).code ?? String(err) },
      `--max-read-ahead-kb ${kb} not applied: /sys/class/bdi/${dev}/read_ahead_kb cannot be written (needs root); sequential reads arrive in the kernel's default 128 KiB requests`,
    );
  }
}

/**
 * Waits (5 s at most) until the kernel has the mount's INIT reply: until a statfs of it is answered.
 *
 * The statfs is made by a child process (`stat -f`), never by a thread of this one. A process's thread
 * waiting on its own mount for an answer the daemon has read but not yet sent waits uninterruptibly: a
 * SIGKILL then leaves that thread behind, holding /dev/fuse open, so the daemon never finishes exiting
 * and its mount hangs instead of failing with ENOTCONN (seen: a daemon killed as it started, one thread
 * left in fuse_statfs, state D, until the connection was aborted). A child holds no /dev/fuse: the
 * daemon's death ends the connection and the child's request with it.
 */
async function initialized(path: string): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<void>((resolve) => (timer = setTimeout(resolve, 5_000)));
  const child = spawn('stat', ['-f', '--', path], { stdio: 'ignore' });
  const answered = new Promise<void>((resolve) => {
    child.once('exit', () => resolve());
    // No `stat` here (not a coreutils system): go on; INIT may then undo read_ahead_kb (a slower mount, not a wrong one).
    child.once('error', () => resolve());
  });
  await Promise.race([answered, late]);
  clearTimeout(timer);
  if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
}
