import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { promisify } from 'node:util';
import type { Logger } from '../observe/logger.js';
import { OP, type FuseAddon, type RequestListener, type SessionHandle } from './kernel.js';
import { canonicalMountPoint } from '../observe/runtime-dir.js';

const run = promisify(execFile);

export class MountPointError extends Error {
  override readonly name = 'MountPointError';
}

/** Mount points currently in the mount table, with the kernel's octal escapes undone. */
export async function mountedPaths(): Promise<Set<string>> {
  const text = await fsp.readFile('/proc/self/mountinfo', 'utf8');
  const paths = new Set<string>();
  for (const line of text.split('\n')) {
    const field = line.split(' ')[4];
    if (field) paths.add(field.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8))));
  }
  return paths;
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
  if ((await mountedPaths()).has(abs)) throw new MountPointError(`mountpoint ${path} is already mounted (busy); unmount it first`);
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
  /** Shown as the mount's source in `mount` and `df`. */
  fsName: string;
  allowOther: boolean;
  /** Further mount options (name or name=value) passed to libfuse. */
  extra: string[];
  /** Kernel requests queued to us at once (FUSE max_background): readahead and async reads. */
  maxBackground: number;
}

/** How long an unmount waits for the receive thread to see the mount go. */
const EXIT_WAIT_MS = 5_000;

/** A live FUSE mount of our operations. */
export class FuseMount {
  private watcher: NodeJS.Timeout | null = null;
  private unmounting: Promise<void> | null = null;
  private onGone: (() => void) | null = null;

  private constructor(
    readonly path: string,
    /** Resolves when the kernel connection has ended (unmounted from anywhere, or aborted). */
    readonly ended: Promise<void>,
    /** The addon's session: for notifications to the kernel (invalidations). */
    readonly session: SessionHandle,
  ) {
    void ended.then(() => {
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
    const options = ['ro', `fsname=${escapeOption(k.fsName)}`, 'subtype=gcsmount', 'default_permissions', ...k.extra];
    if (k.allowOther) options.push('allow_other');
    let exited!: () => void;
    const ended = new Promise<void>((r) => (exited = r));
    const listener: RequestListener = (op, req, ino, a, b, c, name, reason) => {
      if (op === OP.EXITED) exited();
      else onRequest(op, req, ino, a, b, c, name, reason);
    };
    let session: SessionHandle;
    try {
      session = fuse.mount(path, ['-o', options.join(',')], listener, {
        maxBackground: k.maxBackground,
        congestionThreshold: Math.max(1, Math.floor((k.maxBackground * 3) / 4)),
        parallelDirops: true,
      });
    } catch (err) {
      throw new MountPointError(`cannot mount ${path}: ${(err as Error).message}`);
    }
    return new FuseMount(path, ended, session);
  }

  /** Calls `onGone` once if the mount disappears under us (fusermount -u, umount, or an abort). */
  watch(onGone: () => void, intervalMs = 1000): void {
    this.onGone = onGone;
    this.watcher = setInterval(() => {
      if (this.unmounting) return;
      mountedPaths().then((paths) => {
        if (!paths.has(this.path) && !this.unmounting && this.onGone) {
          this.stopWatching();
          const gone = this.onGone;
          this.onGone = null;
          gone();
        }
      }, () => undefined);
    }, intervalMs);
    this.watcher.unref();
  }

  unmount(): Promise<void> {
    this.stopWatching();
    this.unmounting ??= (async () => {
      if ((await mountedPaths()).has(this.path)) {
        try {
          await run('fusermount3', ['-u', this.path]);
        } catch {
          // Busy (a process has a file open or its cwd inside): detach now, the kernel ends it when let go.
          await lazyUnmount(this.path).catch(() => undefined);
          return;
        }
      }
      await Promise.race([this.ended, new Promise((r) => setTimeout(r, EXIT_WAIT_MS).unref())]);
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
 */
export async function setReadAhead(path: string, kb: number, log: Logger): Promise<void> {
  if (kb <= 0) return;
  const dev = await deviceOf(path);
  if (!dev) return;
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
