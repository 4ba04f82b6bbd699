import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, mount, run, startBucket, tempDir, unmount, type Mounted, type TestBucket } from './helpers/harness.js';
import { upload } from './helpers/objects.js';

// Symbolic links and mtimes as gcsfuse keeps them in object metadata, so a bucket written by either
// tool reads the same through both: links made by gcsfuse (its own form, and the standard form of newer
// releases) and by gcsmount, and `gcsfuse_mtime` shown as the file's mtime.

afterAll(cleanupAll);

const PY = '/usr/bin/python3';

async function py(script: string, ...args: string[]): Promise<string> {
  const r = await run(PY, ['-c', script, ...args]);
  if (r.code !== 0) throw new Error(`python failed (${r.code}): ${r.stderr}`);
  return r.stdout.trim();
}

async function resource(tb: TestBucket, name: string): Promise<{ size: string; metadata?: Record<string, string> } | null> {
  const res = await fetch(`${tb.emulator.url}/storage/v1/b/${tb.bucket}/o/${encodeURIComponent(name)}`);
  if (res.status === 404) return null;
  return (await res.json()) as { size: string; metadata?: Record<string, string> };
}

function mediaRequests(tb: TestBucket): number {
  return tb.emulator.stats().requests.media ?? 0;
}

/** Each name's kind as lstat, readdir's d_type and readlink tell it, from another process. */
const DESCRIBE = `import os,sys,stat,json
root=sys.argv[1]
out={}
for e in sorted(os.scandir(root), key=lambda e: e.name):
  st=os.lstat(e.path)
  kind='link' if stat.S_ISLNK(st.st_mode) else 'dir' if stat.S_ISDIR(st.st_mode) else 'file'
  out[e.name]={'kind':kind,'dtype_link':e.is_symlink(),'size':st.st_size,'mtime':st.st_mtime,
    'target':os.readlink(e.path) if kind=='link' else None}
print(json.dumps(out))`;

interface Described {
  kind: string;
  dtype_link: boolean;
  size: number;
  mtime: number;
  target: string | null;
}

describe('symlinks and mtimes in gcsfuse metadata', () => {
  let tb: TestBucket;
  let m: Mounted;

  beforeAll(async () => {
    tb = await startBucket('symlinks');
    await upload(tb, 'data/real.txt', 'the bytes');
    // gcsfuse's own form: an empty object, the target in metadata.
    await upload(tb, 'data/legacy', '', { metadata: { gcsfuse_symlink_target: 'real.txt' } });
    // The standard form (newer gcsfuse, --enable-standard-symlinks): the target is the object's bytes.
    await upload(tb, 'data/standard', '../data/real.txt', { metadata: { 'goog-reserved-file-is-symlink': 'true' } });
    // The same key set to anything but "true" is no link.
    await upload(tb, 'data/not-a-link', 'plain', { metadata: { 'goog-reserved-file-is-symlink': 'false' } });
    // A file whose mtime gcsfuse kept (utimes, or its upload).
    await upload(tb, 'data/stamped', 'x', { metadata: { gcsfuse_mtime: '2023-11-14T22:13:20.25Z' } });
    await upload(tb, 'other/stamped', 'x', { metadata: { gcsfuse_mtime: '2001-02-03T04:05:06Z' } });
    m = await mount({ tb, args: ['--cache-dir', await tempDir('cache')] });
  });

  it('shows links made by gcsfuse as links, in a listing and by lookup, and follows them', async () => {
    const listed = JSON.parse(await py(DESCRIBE, join(m.path, 'data'))) as Record<string, Described>;
    expect(listed.legacy).toMatchObject({ kind: 'link', dtype_link: true, size: 8, target: 'real.txt' });
    expect(listed.standard).toMatchObject({ kind: 'link', dtype_link: true, size: 16, target: '../data/real.txt' });
    expect(listed['not-a-link']).toMatchObject({ kind: 'file', dtype_link: false, size: 5 });
    expect(listed['real.txt']).toMatchObject({ kind: 'file', size: 9 });
    // Through each link, the file it names.
    const through = await py(`import sys; print(open(sys.argv[1]).read(), open(sys.argv[2]).read())`, join(m.path, 'data/legacy'), join(m.path, 'data/standard'));
    expect(through).toBe('the bytes the bytes');
    // `find -type l` goes by the listing's types.
    const found = await run('find', [join(m.path, 'data'), '-type', 'l']);
    expect(found.stdout.trim().split('\n').sort()).toEqual([join(m.path, 'data/legacy'), join(m.path, 'data/standard')]);
  });

  it('a standard link is read once, then from the block cache', async () => {
    const before = mediaRequests(tb);
    for (let i = 0; i < 3; i++) expect(await py(`import os,sys; print(os.readlink(sys.argv[1]))`, join(m.path, 'data/standard'))).toBe('../data/real.txt');
    expect(mediaRequests(tb) - before).toBeLessThanOrEqual(1);
  });

  it("shows gcsfuse_mtime as the file's mtime", async () => {
    const listed = JSON.parse(await py(DESCRIBE, join(m.path, 'data'))) as Record<string, Described>;
    expect(listed.stamped!.mtime).toBeCloseTo(1700000000.25, 2);
    // And by lookup alone, in a folder nobody listed.
    expect(Number(await py(`import os,sys; print(os.stat(sys.argv[1]).st_mtime)`, join(m.path, 'other/stamped')))).toBe(981173106);
  });

  it('symlink(2) makes an empty object with the target in gcsfuse_symlink_target; rename and unlink carry it', async () => {
    const out = await py(
      `import os,sys,errno
d=sys.argv[1]
os.symlink('real.txt', os.path.join(d,'mine'))
print(os.readlink(os.path.join(d,'mine')), open(os.path.join(d,'mine')).read())
try:
  os.symlink('elsewhere', os.path.join(d,'mine'))
except OSError as e: print(errno.errorcode[e.errno])
try:
  os.symlink('x'*5000, os.path.join(d,'long'))
except OSError as e: print(errno.errorcode[e.errno])
os.rename(os.path.join(d,'mine'), os.path.join(d,'moved'))
print(os.readlink(os.path.join(d,'moved')), os.path.lexists(os.path.join(d,'mine')))`,
      join(m.path, 'data'),
    );
    expect(out.split('\n')).toEqual(['real.txt the bytes', 'EEXIST', 'ENAMETOOLONG', 'real.txt False']);
    expect(await resource(tb, 'data/mine')).toBeNull();
    const moved = await resource(tb, 'data/moved');
    expect(moved).toMatchObject({ size: '0', metadata: { gcsfuse_symlink_target: 'real.txt' } });
    // The link goes, not what it names.
    await py(`import os,sys; os.unlink(sys.argv[1])`, join(m.path, 'data/moved'));
    expect(await resource(tb, 'data/moved')).toBeNull();
    expect(await resource(tb, 'data/real.txt')).not.toBeNull();
  });

  it('ln -s is one upload request (a multipart upload of the empty object, nothing else written)', async () => {
    const before = tb.emulator.stats().requests;
    await py(`import os,sys; os.symlink('real.txt', sys.argv[1])`, join(m.path, 'data/counted'));
    const after = tb.emulator.stats().requests;
    expect(after.upload - before.upload).toBe(1);
    for (const k of ['patch', 'copy', 'compose', 'move', 'delete'] as const) expect(after[k] - before[k]).toBe(0);
    expect(await resource(tb, 'data/counted')).toMatchObject({ size: '0', metadata: { gcsfuse_symlink_target: 'real.txt' } });
  });

  it('a new mount reads the links gcsmount made', async () => {
    await py(`import os,sys; os.symlink('/an/absolute/target', sys.argv[1])`, join(m.path, 'abs'));
    const fresh = await mount({ tb, args: ['-o', 'ro'] });
    try {
      expect(await py(`import os,sys; print(os.readlink(sys.argv[1]))`, join(fresh.path, 'abs'))).toBe('/an/absolute/target');
      // A read-only mount reads links, and makes none.
      const r = await run(PY, ['-c', `import os,sys\ntry: os.symlink('a', sys.argv[1])\nexcept OSError as e: print(e.strerror)`, join(fresh.path, 'nope')]);
      expect(r.stdout.trim()).toBe('Read-only file system');
    } finally {
      await unmount(fresh.path);
    }
  });

  it('unmounts cleanly', async () => {
    await unmount(m.path);
  });
});
