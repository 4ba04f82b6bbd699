import { promises as fsp } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { OP_SERVER_SCRIPT } from '../src/torture/op-server.js';
import { checkAfterCrash, generateWriteOps, runWriteDifferential, WriteDifferential } from '../src/torture/write-ops.js';

/**
 * The differential write harness, validated against itself: two local folders must never differ, and a
 * planted difference must be reported. The case against a real mount is mountDifferentialCase
 * (test/helpers/write-mount.ts), not enabled until the mount writes.
 */

const dirs: string[] = [];
async function freshDir(label: string): Promise<string> {
  const d = await fsp.mkdtemp(join(tmpdir(), `wdiff-${label}-`));
  dirs.push(d);
  return d;
}
afterAll(async () => {
  for (const d of dirs) await fsp.rm(d, { recursive: true, force: true });
});

describe('the operation generator', () => {
  it('is reproducible per seed and reaches the cases it is for', () => {
    const a = generateWriteOps({ seed: 11, count: 2000 });
    expect(generateWriteOps({ seed: 11, count: 2000 })).toEqual(a);
    expect(generateWriteOps({ seed: 12, count: 2000 })).not.toEqual(a);
    const kinds = new Set(a.map((o) => o.op));
    for (const k of ['open', 'write', 'pwrite', 'read', 'ftruncate', 'truncate', 'fsync', 'close', 'unlink', 'mkdir', 'rmdir', 'rename', 'stat', 'listdir', 'readall']) {
      expect(kinds, k).toContain(k);
    }
    const flags = a.flatMap((o) => (o.op === 'open' ? o.flags : []));
    expect(flags).toContain('append');
    expect(flags).toContain('excl');
  });

  it('with bigWrites, writes across a 32 MiB chunk now and then, within the byte budget', () => {
    const ops = generateWriteOps({ seed: 5, count: 3000, bigWrites: true, maxBytes: 400 * 2 ** 20 });
    const lens = ops.flatMap((o) => (o.op === 'write' || o.op === 'pwrite' ? [o.len] : []));
    expect(lens.some((l) => l > 32 * 2 ** 20)).toBe(true);
    // The budget caps big writes; once spent, writes are at most 64 KiB each.
    expect(lens.reduce((s, l) => s + l, 0)).toBeLessThan(400 * 2 ** 20 + lens.length * 64 * 1024);
  });
});

describe('the differential runner, local folder against local folder', () => {
  for (const seed of [1, 2, 3]) {
    it(`finds no difference in 2,000 operations (seed ${seed})`, async () => {
      const ops = generateWriteOps({ seed, count: 2000 });
      const report = await runWriteDifferential({ mountRoot: await freshDir('a'), localRoot: await freshDir('b'), ops, seed });
      expect(report.mismatches).toEqual([]);
      expect(report.mismatchCount).toBe(0);
      expect(report.steps).toBe(ops.length);
      expect(report.snapshots).toBeGreaterThan(50);
      expect(report.maxOpenHandles).toBeGreaterThanOrEqual(2);
      expect(report.maxOpenHandles).toBeLessThanOrEqual(3);
      // The sequence reached its edge cases: errors that both sides gave alike.
      expect(Object.keys(report.errnos).length).toBeGreaterThan(5);
    }, 180_000);
  }

  it('reports a file that differs by one byte', async () => {
    const mountRoot = await freshDir('a');
    const localRoot = await freshDir('b');
    await fsp.writeFile(join(mountRoot, 'z'), 'abc');
    await fsp.writeFile(join(localRoot, 'z'), 'abd');
    const ops = generateWriteOps({ seed: 4, count: 300 });
    const report = await runWriteDifferential({ mountRoot, localRoot, ops, seed: 4 });
    expect(report.mismatchCount).toBeGreaterThan(0);
    expect(report.mismatches[0]!.kind).toBe('snapshot');
    expect(report.mismatches[0]!.detail!.join('\n')).toContain('file z:');
  });

  // A second "mount" that is a folder of its own sees nothing the first one did: the first switch to it
  // must report that, so a second mount that keeps old state is caught too.
  it('with a second mount, takes turns at points with no open handle and reports what the other does not show', async () => {
    const ops = generateWriteOps({ seed: 2, count: 600 });
    const same = await freshDir('same');
    const twin = await runWriteDifferential({ mountRoot: same, otherMountRoot: same, localRoot: await freshDir('b'), ops, seed: 2 });
    expect(twin.mismatches).toEqual([]);
    expect(twin.mountSwitches).toBeGreaterThan(5);
    const apart = await runWriteDifferential({ mountRoot: await freshDir('a'), otherMountRoot: await freshDir('c'), localRoot: await freshDir('b'), ops, seed: 2 });
    expect(apart.mismatchCount).toBeGreaterThan(0);
    expect(JSON.stringify(apart.mismatches[0])).toMatch(/second mount|"answer"/);
  });

  it('allows a directory rename that fails on the mount only when told to', async () => {
    const ops = generateWriteOps({ seed: 13, count: 1500 });
    const refusing = await serverWrapper(REFUSE_DIR_RENAMES);
    const run = async (allow: boolean, dirRenames = true) =>
      runWriteDifferential({
        mountRoot: await freshDir('a'),
        localRoot: await freshDir('b'),
        ops: dirRenames ? ops : generateWriteOps({ seed: 13, count: 1500, dirRenames: false }),
        seed: 13,
        mountServerScript: refusing,
        allow: { dirRenameFails: allow },
      });
    const strict = await run(false);
    expect(strict.mismatchCount).toBeGreaterThan(0);
    expect(strict.mismatches[0]!.op.op).toBe('rename');
    const allowed = await run(true);
    expect(allowed.mismatches).toEqual([]);
    expect(allowed.allowed.dirRenameFails).toBeGreaterThan(0);
    // Without directory renames in the sequence, the refusal never shows.
    expect((await run(false, false)).mismatches).toEqual([]);
  }, 120_000);

  it('reports a byte the mount side stored wrong, at or after the write that stored it', async () => {
    const ops = generateWriteOps({ seed: 6, count: 400 });
    // The mount side runs the same server with a byte flipped in its 5th write and each after, as a daemon that
    // stored a wrong byte would.
    const wrapper = await serverWrapper(CORRUPT_WRITES);
    const report = await runWriteDifferential({ mountRoot: await freshDir('a'), localRoot: await freshDir('b'), ops, seed: 6, mountServerScript: wrapper });
    const fifthWrite = ops.map((o, i) => [o, i] as const).filter(([o]) => o.op === 'write' || o.op === 'pwrite')[4]![1];
    expect(report.mismatchCount).toBeGreaterThan(0);
    expect(report.mismatches[0]!.index).toBeGreaterThanOrEqual(fifthWrite);
    // The first place it shows is a read or a snapshot, and both sides' views are in the report.
    const first = report.mismatches[0]!;
    expect(first.kind === 'snapshot' ? first.detail!.length : JSON.stringify(first.mount) !== JSON.stringify(first.local)).toBeTruthy();
  });

  it('reports a bucket that lacks a closed file, and ignores directory placeholders', async () => {
    const localRoot = await freshDir('b');
    const mountRoot = await freshDir('a');
    const ops = generateWriteOps({ seed: 8, count: 300 });
    let checks = 0;
    const report = await runWriteDifferential({
      mountRoot,
      localRoot,
      ops,
      seed: 8,
      // The "bucket" is the mount-side folder, minus one file and plus a placeholder.
      bucketSnapshot: async () => {
        checks++;
        const snap = await snapshotOf(mountRoot);
        delete snap[Object.keys(snap).sort()[0]!];
        return { ...snap, 'd1/': 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855' };
      },
    });
    expect(checks).toBeGreaterThan(5);
    expect(report.mismatches.some((m) => m.kind === 'bucket' && m.detail!.some((d) => d.includes('bucket absent')))).toBe(true);
    expect(report.mismatches.every((m) => m.kind === 'bucket')).toBe(true);
  });
});

describe('the crash model', () => {
  it('takes a tree stopped mid-run as it is, and rejects a partial file', async () => {
    const ops = generateWriteOps({ seed: 9, count: 600 });
    const localRoot = await freshDir('b');
    const diff = new WriteDifferential({ mountRoot: await freshDir('a'), localRoot, ops, seed: 9, trackCrashStates: true });
    // Stop where a written handle is still open, as a SIGKILL would find it.
    let i = 0;
    const openWith = new Set<string>();
    for (; i < ops.length; i++) {
      const op = ops[i]!;
      await diff.step(i, op);
      if (op.op === 'write' || op.op === 'pwrite') openWith.add(op.h);
      if (op.op === 'close') openWith.delete(op.h);
      if (i > 300 && openWith.size > 0) break;
    }
    const model = await diff.crashModel();
    await diff.close();
    const open = Object.entries(model.files).filter(([, f]) => 'anyOf' in f);
    expect(open.length).toBeGreaterThan(0);
    // The tree as it stands passes: closed files exact, open ones absent or in a complete state. The
    // local tree holds the open files' newest bytes, which may be partial: drop those (absent is allowed).
    const now = await snapshotOf(localRoot);
    for (const [p] of open) delete now[p];
    expect(checkAfterCrash(model, { files: now })).toEqual([]);
    const [closedPath] = Object.entries(model.files).find(([, f]) => 'sha' in f) ?? [];
    if (closedPath) expect(checkAfterCrash(model, { files: { ...now, [closedPath]: 'f'.repeat(64) } })).toHaveLength(1);
    expect(checkAfterCrash(model, { files: { ...now, [open[0]![0]]: 'e'.repeat(64) } })).toHaveLength(1);
  });
});

/** fs_op_server.py, changed by `patch` (python that sees the loaded module as `server`). */
async function serverWrapper(patch: string): Promise<string> {
  const path = join(await freshDir('w'), 'wrapped_server.py');
  const load = `import errno, importlib.util, os
spec = importlib.util.spec_from_file_location("fs_op_server", ${JSON.stringify(OP_SERVER_SCRIPT)})
server = importlib.util.module_from_spec(spec)
spec.loader.exec_module(server)
`;
  await fsp.writeFile(path, `${load}${patch}\nserver.main()\n`);
  return path;
}

/** Every data buffer from the 5th on has one byte flipped. */
const CORRUPT_WRITES = `
plain = server.data
calls = [0]
def corrupted(seed, length):
    calls[0] += 1
    b = bytearray(plain(seed, length))
    if calls[0] >= 5 and b:
        b[len(b) // 2] ^= 0x40
    return bytes(b)
server.data = corrupted
`;

/** Directory renames fail as gcsfuse's do beyond --rename-dir-limit. */
const REFUSE_DIR_RENAMES = `
real_rename = os.rename
def rename(src, dst):
    if os.path.isdir(src):
        raise OSError(errno.EXDEV, "directory rename refused")
    return real_rename(src, dst)
os.rename = rename
`;

/** {path: sha256} of every file under `root`, read here: only for local folders, never for a mount. */
async function snapshotOf(root: string): Promise<Record<string, string>> {
  const { createHash } = await import('node:crypto');
  const out: Record<string, string> = {};
  for (const e of await fsp.readdir(root, { recursive: true, withFileTypes: true })) {
    if (!e.isFile()) continue;
    const p = join(e.parentPath, e.name);
    out[p.slice(root.length + 1)] = createHash('sha256').update(await fsp.readFile(p)).digest('hex');
  }
  return out;
}
