import { execFile } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { promisify } from 'node:util';
import Fuse, { type FuseOps } from 'fuse-native';
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
    await run('fusermount', ['-u', '-z', path]);
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

export interface KernelOptions {
  /** Shown as the mount's source in `mount` and `df`. */
  fsName: string;
  attrTimeoutSec: number;
  entryTimeoutSec: number;
  negativeTimeoutSec: number;
  allowOther: boolean;
  /** Further libfuse options (name or name=value) that fuse-native has no field for. */
  extra: string[];
}

/** A live FUSE mount of our operations. */
export class FuseMount {
  private watcher: NodeJS.Timeout | null = null;
  private unmounting: Promise<void> | null = null;

  private constructor(
    readonly path: string,
    private readonly fuse: Fuse,
  ) {}

  static async mount(path: string, ops: FuseOps, k: KernelOptions): Promise<FuseMount> {
    // fuse-native drops numeric options whose value is 0, so every number goes in as a string. Options it
    // has no field for ride along in fsname, which it passes through unescaped as one -o list.
    const riders = ['ro', `negative_timeout=${k.negativeTimeoutSec}`, 'max_background=64', 'congestion_threshold=48', ...k.extra];
    const fuse = new Fuse(path, ops, {
      fsname: [k.fsName, ...riders].join(','),
      subtype: 'gcsmount',
      // A slow download must never become EIO after fuse-native's 15 s default.
      timeout: false,
      allowOther: k.allowOther,
      defaultPermissions: true,
      attrTimeout: String(k.attrTimeoutSec),
      entryTimeout: String(k.entryTimeoutSec),
      // The data is immutable once written: keep the page cache across opens unless size or mtime moved.
      autoCache: true,
      maxRead: String(128 * 1024),
    });
    await new Promise<void>((resolve, reject) =>
      fuse.mount((err) => (err ? reject(new MountPointError(`cannot mount ${path}: ${err.message}`)) : resolve())),
    );
    return new FuseMount(path, fuse);
  }

  /** Calls `onGone` once if the mount disappears under us (fusermount -u, umount, or an abort). */
  watch(onGone: () => void, intervalMs = 1000): void {
    this.watcher = setInterval(() => {
      if (this.unmounting) return;
      mountedPaths().then((paths) => {
        if (!paths.has(this.path) && !this.unmounting) {
          this.stopWatching();
          onGone();
        }
      }, () => undefined);
    }, intervalMs);
    this.watcher.unref();
  }

  unmount(): Promise<void> {
    this.stopWatching();
    this.unmounting ??= new Promise<void>((resolve) => {
      this.fuse.unmount((err) => {
        // Already gone (unmounted from outside) is success; anything else gets the lazy way out.
        if (err) lazyUnmount(this.path).then(resolve, () => resolve());
        else resolve();
      });
    });
    return this.unmounting;
  }

  private stopWatching(): void {
    if (this.watcher) clearInterval(this.watcher);
    this.watcher = null;
  }
}
