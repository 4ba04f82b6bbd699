import { execFileSync } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { BlockBuffers } from '../src/blocks/block-buffers.js';
import { MemoryBudget } from '../src/memory/memory-budget.js';
import { StagedCopy } from '../src/writes/staged-copy.js';
import type { StagingDir as StagingDirT } from '../src/writes/staging.js';
import { UploadBuffers } from '../src/writes/upload-buffers.js';

const MIB = 1024 * 1024;
const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await fsp.rm(d, { recursive: true, force: true });
});

async function staging(dir?: string) {
  const at = dir ?? (await fsp.mkdtemp(join(tmpdir(), 'staged-copy-')));
  if (!dir) dirs.push(at);
  let n = 0;
  return { create: async () => ({ path: join(at, `f${n}`), handle: await fsp.open(join(at, `f${n++}`), 'w+') }) };
}

function pattern(length: number, seed: number): Buffer {
  const b = Buffer.allocUnsafe(length);
  for (let i = 0; i < length; i++) b[i] = (i * 31 + seed * 7 + (i >> 12)) & 0xff;
  return b;
}

/** A streamed file's writes, as WriteState makes them: appends flagged, `size` followed. */
async function appendAll(copy: StagedCopy, data: Buffer, piece: number): Promise<void> {
  for (let at = 0; at < data.length; at += piece) await copy.write(at, data.subarray(at, Math.min(data.length, at + piece)), true);
}

/** A memory budget of `limitMib` (leaving `headroomMib` to demand), 1 MiB chunks, and a staged copy using them. */
async function setup(opts: { limitMib?: number; headroomMib?: number; dir?: string } = {}) {
  const memory = new MemoryBudget({ limitBytes: (opts.limitMib ?? 64) * MIB, demandHeadroomBytes: (opts.headroomMib ?? 0) * MIB, idleReclaimAfterMs: 10 });
  const buffers = new UploadBuffers(memory, MIB, 4, 60_000);
  const copy = await StagedCopy.create(await staging(opts.dir), { buffers, whenIdle: () => undefined });
  return { memory, buffers, copy };
}

describe('StagedCopy: a streamed file in memory, then on disk', () => {
  it('keeps appends past 1 MiB in chunk memory, lends whole chunks to the upload, and reads and spills the right bytes', async () => {
    const { memory, buffers, copy } = await setup();
    const data = pattern(3 * MIB + 5000, 1);
    await appendAll(copy, data, 192 * 1024);
    // The first MiB went through the page cache; chunks 1 and 2 and the tail are in memory.
    expect(copy.memoryBytes).toBe(data.length - MIB);
    const chunk = copy.borrow(MIB, 2 * MIB);
    expect(chunk).not.toBeNull();
    expect(chunk!.bytes.equals(data.subarray(MIB, 2 * MIB))).toBe(true);
    chunk!.release();
    expect(copy.borrow(0, MIB)).toBeNull(); // not in memory: the upload reads the file
    // Reads across the file, the full chunks and the tail.
    for (const [pos, len] of [[0, data.length], [MIB - 10, 20], [2 * MIB - 100, MIB + 300], [3 * MIB, 6000]] as const) {
      const into = Buffer.alloc(len);
      await copy.read(pos, into);
      const want = Buffer.alloc(len);
      data.copy(want, 0, pos, Math.min(data.length, pos + len));
      expect(into.equals(want)).toBe(true);
    }
    copy.sent(2 * MIB);
    expect(copy.memoryBytes).toBe(data.length - 2 * MIB);
    await copy.spill();
    expect(copy.memoryBytes).toBe(0);
    expect((await fsp.readFile(copy.path)).equals(data)).toBe(true);
    await copy.remove();
    buffers.close();
    expect(memory.inUse).toBe(0);
  });

  it('a write that is not an append, and a truncate, first put the memory on disk: the bytes stay right', async () => {
    const { memory, buffers, copy } = await setup();
    // Up to a chunk's end: no tail, only full chunks in memory (their disk writes maybe still on their way).
    const data = pattern(4 * MIB, 2);
    await appendAll(copy, data, 256 * 1024);
    expect(copy.memoryBytes).toBe(3 * MIB);
    const patch = pattern(70_000, 3);
    await copy.write(2 * MIB - 1000, patch); // into a full chunk still in memory
    patch.copy(data, 2 * MIB - 1000);
    expect(copy.memoryBytes).toBe(0);
    const back = Buffer.alloc(data.length);
    await copy.read(0, back);
    expect(back.equals(data)).toBe(true);
    expect((await fsp.readFile(copy.path)).equals(data)).toBe(true);
    // From then on the file's bytes go through the page cache: no chunk is put on disk and read back
    // again for each write out of order.
    const more = pattern(2 * MIB, 4);
    for (let at = 0; at < more.length; at += 256 * 1024) await copy.write(data.length + at, more.subarray(at, at + 256 * 1024), true);
    expect(copy.memoryBytes).toBe(0);
    expect((await fsp.readFile(copy.path)).equals(Buffer.concat([data, more]))).toBe(true);
    await copy.remove();
    // A truncate into bytes in memory: they go to disk first, then the cut.
    const other = await StagedCopy.create(await staging(), { buffers, whenIdle: () => undefined });
    await appendAll(other, data, 300_000);
    expect(other.memoryBytes).toBeGreaterThan(0);
    await other.truncate(3 * MIB + 7);
    expect(other.memoryBytes).toBe(0);
    expect((await fsp.readFile(other.path)).equals(data.subarray(0, 3 * MIB + 7))).toBe(true);
    await other.remove();
    buffers.close();
    expect(memory.inUse).toBe(0);
  });

  it('a chunk stays readable from memory until the file holds it: sent or spilled, never a moment without', async () => {
    const { memory, buffers, copy } = await setup();
    const data = pattern(3 * MIB + 4096 + 10, 9);
    await appendAll(copy, data, MIB);
    // The chunk [2, 3) MiB was sealed by the last whole-MiB write: its write to the file has not had a
    // turn of the event loop yet. The upload saying it sent it must not drop it.
    copy.sent(3 * MIB);
    expect(copy.memoryBytes).toBe(data.length - MIB);
    // A spill under way: the bytes it is writing are still read from memory.
    const spilling = copy.spill();
    const into = Buffer.alloc(data.length);
    await copy.read(0, into);
    expect(into.equals(data)).toBe(true);
    await spilling;
    expect(copy.memoryBytes).toBe(0);
    expect((await fsp.readFile(copy.path)).equals(data)).toBe(true);
    await copy.remove();
    buffers.close();
    expect(memory.inUse).toBe(0);
  });

  it('a writer that pauses puts what it holds in memory on disk', async () => {
    const memory = new MemoryBudget({ limitBytes: 64 * MIB, demandHeadroomBytes: 0, idleReclaimAfterMs: 10 });
    const buffers = new UploadBuffers(memory, MIB, 0, 60_000);
    let idle = 0;
    let copy: StagedCopy | null = null;
    copy = await StagedCopy.create(await staging(), {
      buffers,
      idleMs: 80,
      whenIdle: () => {
        idle++;
        void copy!.spill();
      },
    });
    const data = pattern(2 * MIB + 300_000, 8);
    await appendAll(copy, data, 100_000);
    expect(copy.memoryBytes).toBeGreaterThan(0);
    await new Promise((r) => setTimeout(r, 40));
    expect(idle).toBe(0); // appends 40 ms ago: not idle yet
    await new Promise((r) => setTimeout(r, 200));
    expect(idle).toBe(1);
    expect(copy.memoryBytes).toBe(0);
    expect(memory.inUse).toBe(buffers.idleBytes); // every chunk back in the pool, none held by the file
    expect((await fsp.readFile(copy.path)).equals(data)).toBe(true);
    await copy.remove();
    buffers.close();
  });

  it('with no memory to spare, writes go through the page cache, the same bytes', async () => {
    const { buffers, copy } = await setup({ limitMib: 4, headroomMib: 4 });
    const data = pattern(3 * MIB, 5);
    await appendAll(copy, data, 128 * 1024);
    expect(copy.memoryBytes).toBe(0);
    expect(copy.borrow(MIB, 2 * MIB)).toBeNull();
    expect((await fsp.readFile(copy.path)).equals(data)).toBe(true);
    await copy.remove();
    buffers.close();
  });

  it('reads for the block cache with O_DIRECT into aligned block memory, the same bytes', async () => {
    const { buffers, copy } = await setup();
    const data = pattern(5 * MIB + 999, 6);
    await appendAll(copy, data, MIB);
    await copy.spill();
    const blocks = new BlockBuffers({ blockSize: 2 * MIB, maxBytes: 8 * MIB, poison: false, idleTrimMs: 1000 });
    for (let pos = 0; pos < data.length; pos += 2 * MIB) {
      const lease = blocks.lease(Math.min(2 * MIB, data.length - pos));
      await copy.readForCache(pos, lease.bytes, lease.directCapacity);
      expect(lease.bytes.equals(data.subarray(pos, pos + 2 * MIB))).toBe(true);
      lease.release();
    }
    blocks.close();
    await copy.remove();
    buffers.close();
  });

  it.skipIf(process.getuid?.() !== 0)('bytes held in memory that the disk refuses fail every later write and read, never a file with a hole', async () => {
    const at = await fsp.mkdtemp(join(tmpdir(), 'staged-full-'));
    dirs.push(at);
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=2m', 'tmpfs', at]);
    try {
      const { buffers, copy } = await setup({ dir: at });
      const data = pattern(4 * MIB, 7);
      // 2 MiB fit; the chunk of [2, 3) MiB is sealed in memory and its write fails (ENOSPC) in the background.
      let failed: unknown = null;
      try {
        await appendAll(copy, data, 256 * 1024);
        await copy.spill();
      } catch (err) {
        failed = err;
      }
      expect(String(failed)).toMatch(/lost bytes held in memory/);
      await expect(copy.read(0, Buffer.alloc(10))).rejects.toThrow(/lost bytes/);
      await expect(copy.write(4 * MIB, Buffer.alloc(10), true)).rejects.toThrow(/lost bytes/);
      await copy.remove();
      buffers.close();
    } finally {
      execFileSync('umount', [at]);
    }
  });
});

describe('the temp dir: folders of other daemons', () => {
  /** Runs `body` with the temp dir's module, a logger and a fresh parent folder, removed after. */
  async function inParent(body: (open: () => StagingDirT, parent: string) => Promise<void>): Promise<void> {
    const { StagingDir } = await import('../src/writes/staging.js');
    const { silentLogger } = await import('../src/observe/logger.js');
    const parent = await fsp.mkdtemp(join(tmpdir(), 'gcsmount-staging-'));
    try {
      await body(() => StagingDir.open(parent, 'st', silentLogger), parent);
    } finally {
      await fsp.rm(parent, { recursive: true, force: true });
    }
  }

  it('gives two daemons of one pid and start time folders of their own, and never clears one still being made', async () => {
    await inParent(async (open, parent) => {
      // pid 1 of two containers sharing the folder, started in the same tick, look alike here.
      const first = open();
      await fsp.writeFile(join(first.dir, '0'), 'first');
      const second = open();
      expect(second.dir).not.toBe(first.dir);
      expect(await fsp.readFile(join(first.dir, '0'), 'utf8')).toBe('first');
      // A folder being made (no lock yet, under its making name) stays; one abandoned a while ago goes.
      const fresh = join(parent, 'st', '.making-0f0f');
      const abandoned = join(parent, 'st', '.making-dead');
      await fsp.mkdir(fresh);
      await fsp.mkdir(abandoned);
      const old = new Date(Date.now() - 120_000);
      await fsp.utimes(abandoned, old, old);
      open().close();
      expect((await fsp.readdir(join(parent, 'st'))).sort()).toEqual([first.dir, second.dir, fresh].map((d) => d.slice(d.lastIndexOf('/') + 1)).sort());
      first.close();
      second.close();
    });
  });

  it("keeps a live daemon's folder whatever its pid says here (another pid namespace), and clears a dead one's", async () => {
    await inParent(async (open, parent) => {
      // A daemon that lives on, seen from another pid namespace: its folder says pid 1, started at 1.
      const other = open();
      await fsp.writeFile(join(other.dir, '0'), 'a staged file of a live daemon');
      const foreign = join(parent, 'st', '1-1');
      await fsp.rename(other.dir, foreign);
      // A daemon that starts now keeps it (it removed it before: pid 1 here is another process).
      open().close();
      expect(await fsp.readFile(join(foreign, '0'), 'utf8')).toBe('a staged file of a live daemon');
      // Once that daemon is gone (its lock let go), the next start clears its folder.
      other.close();
      open().close();
      await expect(fsp.stat(foreign)).rejects.toMatchObject({ code: 'ENOENT' });
    });
  });
});
