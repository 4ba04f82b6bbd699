import { spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { FuseMount } from '../src/fs/mount.js';
import { loadFuse, OP, type Attr, type FuseRequest } from '../src/fs/kernel.js';
import { cleanupAll, eventually, run, tempDir } from './helpers/harness.js';

/**
 * The addon on its own, mounted by this process with handlers that hold requests on purpose. Only other
 * processes touch the mount (this one answers it).
 */
describe('the FUSE addon', () => {
  let dir: string | null = null;
  /** Every mount point a test mounted on: whatever is still mounted there goes at the end. */
  const mountPoints: string[] = [];

  afterAll(async () => {
    const text = await fsp.readFile('/proc/self/mountinfo', 'utf8');
    for (const d of mountPoints) if (text.split('\n').some((l) => l.split(' ')[4] === d)) await run('fusermount3', ['-u', '-z', d]);
    await cleanupAll();
  });

  it('answers a request once, and an answer after an interrupt or after the mount is gone is harmless', async () => {
    const fuse = loadFuse();
    dir = await tempDir('addon');
    mountPoints.push(dir);
    const held: FuseRequest[] = [];
    let exited!: () => void;
    const ended = new Promise<void>((r) => (exited = r));
    fuse.mount(
      dir,
      ['-o', 'ro,fsname=addon-test,subtype=gcsmount'],
      (op, req) => {
        if (op === OP.EXITED) return exited();
        if (!req) return;
        if (op === OP.GETATTR) return fuse.replyAttr(req, [1, 0o040755, 2, 0, 0, 4096, 0], 0);
        if (op === OP.LOOKUP) return void held.push(req); // answered by the test
        fuse.replyErr(req, 38);
      },
      { maxBackground: 16, congestionThreshold: 12, parallelDirops: true, readHandlesBelow: 0 },
    );
    const stat = (name: string) => {
      const child = spawn('stat', [join(dir!, name)], { stdio: 'ignore' });
      const code = new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
      return { child, code };
    };

    // Answered once; a second answer is refused, not sent.
    const first = stat('a');
    await eventually(async () => held.length === 1);
    fuse.replyErr(held[0]!, 2);
    expect(() => fuse.replyErr(held[0]!, 2)).toThrow(/answered twice/);
    expect(await first.code).not.toBe(0);

    // Interrupted: the process is killed while the daemon holds its lookup; the late answer is harmless.
    const second = stat('b');
    await eventually(async () => held.length === 2);
    second.child.kill('SIGKILL');
    await new Promise((r) => setTimeout(r, 200));
    fuse.replyErr(held[1]!, 2);
    expect(await second.code).toBe(null);

    // The connection is aborted (umount -f) while a lookup is held: answering it afterwards is harmless.
    const third = stat('c');
    await eventually(async () => held.length === 3);
    await run('umount', ['-f', dir]);
    await ended;
    expect(await third.code).not.toBe(0);
    // The kernel did not take it, and says so (the lookup must not be counted).
    expect(fuse.replyEntry(held[2]!, [5, 0o100644, 1, 0, 0, 1, 0], 1, 1)).not.toBe(0);
    expect(() => fuse.replyErr(held[2]!, 2)).toThrow(/answered twice/);
  });

  it('sends a read reply from a pool thread, calls back once the kernel has it, and refuses a second answer', async () => {
    const fuse = loadFuse();
    const mnt = await tempDir('later');
    const SIZE = 3 * 1024 * 1024 + 123;
    const data = Buffer.alloc(SIZE);
    for (let i = 0; i + 4 <= SIZE; i += 4) data.writeUInt32LE(i * 2654435761 >>> 0, i);
    let sent = 0;
    let queued = 0;
    let refused = 0;
    let exited!: () => void;
    const ended = new Promise<void>((r) => (exited = r));
    const file: Attr = [2, 0o100644, 1, 0, 0, SIZE, 0];
    fuse.mount(
      mnt,
      ['-o', 'ro,fsname=later-test,subtype=gcsmount'],
      (op, req, ino, _fh, off, size) => {
        if (op === OP.EXITED) return exited();
        if (!req) return;
        if (op === OP.GETATTR) return fuse.replyAttr(req, ino === 1 ? [1, 0o040755, 2, 0, 0, 4096, 0] : file, 0);
        if (op === OP.LOOKUP) return void fuse.replyEntry(req, file, 0, 0);
        if (op === OP.OPEN) return void fuse.replyOpen(req, 7, 4 /* direct_io: each read reaches us */);
        if (op === OP.RELEASE) return fuse.replyErr(req, 0);
        if (op === OP.READ) {
          const bytes = data.subarray(Math.min(SIZE, off!), Math.min(SIZE, off! + size!));
          queued++;
          fuse.replyBufLater(req, bytes, bytes.length, () => sent++);
          try {
            fuse.replyErr(req, 5);
          } catch {
            refused++;
          }
          return;
        }
        fuse.replyErr(req, 38);
      },
      { maxBackground: 16, congestionThreshold: 12, parallelDirops: true, readHandlesBelow: 0 },
    );
    mountPoints.push(mnt);
    const copy = join(await tempDir('later-copy'), 'f');
    const r = await run('dd', [`if=${join(mnt, 'f')}`, `of=${copy}`, 'bs=256k']);
    expect(r.code, r.stderr).toBe(0);
    expect((await fsp.readFile(copy)).equals(data)).toBe(true);
    // Every reply was queued, refused a second answer, and called back once sent.
    expect(queued).toBeGreaterThanOrEqual(Math.ceil(SIZE / (256 * 1024)));
    expect(refused).toBe(queued);
    await eventually(async () => sent === queued);
    // The session still ends cleanly once the mount goes.
    await run('fusermount3', ['-u', mnt]);
    await ended;
  });

  it("answers a read handle's and a folder's release itself and tells the listener after, in the kernel's order", async () => {
    const fuse = loadFuse();
    const mnt = await tempDir('deferred');
    const events: string[] = [];
    let nextFh = 7;
    let exited!: () => void;
    const ended = new Promise<void>((r) => (exited = r));
    const file: Attr = [2, 0o100644, 1, 0, 0, 5, 0];
    fuse.mount(
      mnt,
      ['-o', 'ro,fsname=deferred-test,subtype=gcsmount'],
      (op, req, ino, fh, off) => {
        if (op === OP.EXITED) return exited();
        if (op === OP.RELEASE || op === OP.RELEASEDIR || op === OP.OPEN) events.push(`${op === OP.OPEN ? 'open' : op === OP.RELEASE ? 'release' : 'releasedir'} ${op === OP.OPEN ? nextFh : fh} ${req ? 'asked' : 'told'}`);
        if (!req) return;
        if (op === OP.GETATTR) return fuse.replyAttr(req, ino === 1 ? [1, 0o040755, 2, 0, 0, 4096, 0] : file, 0);
        if (op === OP.LOOKUP) return void fuse.replyEntry(req, file, 0, 0);
        if (op === OP.OPEN) return void fuse.replyOpen(req, nextFh, 4);
        if (op === OP.OPENDIR) return void fuse.replyOpen(req, 9, 0);
        if (op === OP.READDIR || op === OP.READDIRPLUS) return fuse.replyBuf(req, Buffer.alloc(0), 0);
        if (op === OP.READ) return fuse.replyBuf(req, Buffer.from('hello').subarray(Math.min(5, off!)), Math.max(0, 5 - off!));
        if (op === OP.RELEASE || op === OP.RELEASEDIR) return fuse.replyErr(req, 0);
        fuse.replyErr(req, 38);
      },
      // Handles 0-99 are read handles: their releases are the addon's to answer.
      { maxBackground: 16, congestionThreshold: 12, parallelDirops: true, readHandlesBelow: 100 },
    );
    mountPoints.push(mnt);
    try {
      // Two files one after the other: the first's release reaches the listener before the second's open.
      const two = await run('sh', ['-c', `cat ${join(mnt, 'f')} ${join(mnt, 'f')}; cat ${join(mnt, 'f')}`]);
      expect(two.stdout).toBe('hellohellohello');
      // With no request after it, the last release is told all the same, soon (deferred.c: 20 ms).
      const quiet = Date.now();
      await eventually(async () => events.length === 6, 2_000);
      expect(Date.now() - quiet).toBeLessThan(1_500);
      expect(events).toEqual(['open 7 asked', 'release 7 told', 'open 7 asked', 'release 7 told', 'open 7 asked', 'release 7 told']);
      // A handle past the read handles' numbers (a write handle's, in the daemon) is asked as before.
      nextFh = 100;
      expect((await run('cat', [join(mnt, 'f')])).stdout).toBe('hello');
      await eventually(async () => events.length === 8, 2_000);
      expect(events.slice(6)).toEqual(['open 100 asked', 'release 100 asked']);
      // A folder's release is told too.
      expect((await run('ls', [mnt])).code).toBe(0);
      await eventually(async () => events.length === 9, 2_000);
      expect(events[8]).toBe('releasedir 9 told');
    } finally {
      await run('fusermount3', ['-u', mnt]);
      await ended;
    }
  });

  it('gives libfuse a mount name holding commas and backslashes as the name, never as mount options', async () => {
    // A bucket name goes into fsname=; GCS refuses commas in one, but a custom endpoint need not.
    const fuse = loadFuse();
    const mnt = await tempDir('fsname');
    const name = 'in\\j,allow_other,noexec';
    const m = FuseMount.mount(
      mnt,
      fuse,
      (op, req) => {
        if (!req) return;
        if (op === OP.GETATTR) return fuse.replyAttr(req, [1, 0o040755, 2, 0, 0, 4096, 0], 0);
        fuse.replyErr(req, 38);
      },
      { readOnly: true, fsName: name, allowOther: false, extra: [], maxBackground: 16, congestionThreshold: 0, parallelDirops: true, readHandlesBelow: 0 },
    );
    try {
      const line = (await fsp.readFile('/proc/self/mountinfo', 'utf8')).split('\n').find((l) => l.split(' ')[4] === mnt)!;
      const [own, shared] = line.split(' - ') as [string, string];
      const [, source, superOptions] = shared.split(' ') as [string, string, string];
      // mountinfo writes a backslash as \134.
      expect(source.replace(/\\134/g, '\\')).toBe(name);
      expect(own.split(' ')[5]!.split(',')).not.toContain('noexec');
      expect(superOptions.split(',')).not.toContain('allow_other');
    } finally {
      await m.unmount();
    }
  });
});
