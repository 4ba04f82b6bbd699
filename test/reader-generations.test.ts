import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, eventually, mount, mountStats, run, startBucket, tempDir, unmount, type Mounted, type TestBucket } from './helpers/harness.js';
import { heldReader } from './helpers/held-reader.js';
import { bytes, sha256, upload } from './helpers/objects.js';

afterAll(cleanupAll);

const PY = '/usr/bin/python3';
const MIB = 1024 * 1024;

/**
 * A reader in its own process: reads the whole file once, says `opened`, waits, then reads it all again
 * through the same descriptor twice: as the kernel's page cache has it, and after dropping the cached
 * pages (so every byte comes from the daemon's handle, not the kernel). Prints each pass's sha256 and
 * length.
 */
const READ_TWICE = `import os,sys,hashlib
fd=os.open(sys.argv[1], os.O_RDONLY)
def whole():
  out=[]; off=0
  while True:
    b=os.pread(fd, 1<<20, off)
    if not b: break
    out.append(b); off+=len(b)
  d=b''.join(out); return hashlib.sha256(d).hexdigest()+' '+str(len(d))
print(whole()); print('opened', flush=True)
sys.stdin.readline()
print(whole())
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
print(whole(), flush=True)`;

describe('an open reader when its file gets a new generation', () => {
  let tb: TestBucket;
  let m: Mounted;

  beforeAll(async () => {
    tb = await startBucket('generations');
    await upload(tb, 'grown', bytes(6 * MIB, 1));
    // A disk cache: reads of blocks on disk are answered by the native path, whose file has a size too.
    m = await mount({ tb, args: ['--cache-dir', await tempDir('cache')] });
  });

  afterAll(async () => {
    if (m) await unmount(m.path);
  });

  it('a local writer changes and grows the file: the reader goes on with every byte of the new generation', async () => {
    const before = bytes(6 * MIB, 1);
    const head = bytes(MIB, 2);
    const tail = bytes(4 * MIB, 3);
    const after = Buffer.concat([head, before.subarray(MIB), tail]);
    const path = join(m.path, 'grown');
    const r = heldReader(READ_TWICE, [path]);
    await r.opened;
    // Another process overwrites the first MiB and appends 4 MiB; its close uploads the new generation.
    const writer = `import sys
with open(sys.argv[1],'r+b') as f:
  f.write(open(sys.argv[2],'rb').read())
  f.seek(0,2); f.write(open(sys.argv[3],'rb').read())`;
    const w = await run(PY, ['-c', writer, path, ...(await parts(head, tail))]);
    expect(w.code, w.stderr).toBe(0);
    // Until the writer's release is done its staged copy answers the reader; the handle's own state is
    // what is tested here.
    await eventually(async () => (await mountStats(m.path)).gauges.write_files_open === 0);
    r.proceed();
    const out = await r.done;
    expect(out.code, out.stderr).toBe(0);
    const want = `${sha256(after)} ${after.length}`;
    expect(out.stdout.trim().split('\n')).toEqual([`${sha256(before)} ${before.length}`, 'opened', want, want]);
  });
});

describe('an open reader when its object is replaced behind the mount, then renamed through it', () => {
  let tb: TestBucket;
  let m: Mounted;

  beforeAll(async () => {
    tb = await startBucket('renamed');
    await upload(tb, 'pinned', bytes(16 * MIB, 11));
    // Every lookup asks GCS: the rename's source is the generation uploaded behind the mount, not the
    // one the reader has open.
    m = await mount({ tb, args: ['--cache-dir', await tempDir('cache'), '--metadata-cache-ttl-secs', '0'] });
  });

  afterAll(async () => {
    if (m) await unmount(m.path);
  });

  it('the reader never gets bytes of the generation moved: it reads its own, or ESTALE once that is gone (as gcsfuse)', async () => {
    const old = bytes(16 * MIB, 11);
    const saved = join(await tempDir('saved'), 'read');
    // Reads the first MiB (its handle holds that block), waits, then reads the whole file into `saved`
    // (outside the mount) with the kernel's pages dropped, until EOF or an error, which it prints.
    const reader = `import os,sys,errno
fd=os.open(sys.argv[1], os.O_RDONLY)
os.pread(fd, 1<<20, 0)
print('opened', flush=True)
sys.stdin.readline()
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
off=0; err='EOF'
with open(sys.argv[2],'wb') as out:
  try:
    while True:
      b=os.pread(fd, 1<<20, off)
      if not b: break
      out.write(b); off+=len(b)
  except OSError as e: err=errno.errorcode[e.errno]
print(err, flush=True)`;
    const r = heldReader(reader, [join(m.path, 'pinned'), saved]);
    await r.opened;
    await upload(tb, 'pinned', bytes(16 * MIB, 12));
    const mv = await run(PY, ['-c', 'import os,sys\nos.rename(sys.argv[1], sys.argv[2])', join(m.path, 'pinned'), join(m.path, 'moved')]);
    expect(mv.code, mv.stderr).toBe(0);
    r.proceed();
    const out = await r.done;
    expect(out.code, out.stderr).toBe(0);
    const got = await fsp.readFile(saved);
    const err = out.stdout.trim().split('\n').pop();
    // What it read is a prefix of its own generation (at least the block it held), whole unless cut by ESTALE.
    expect(got.length).toBeGreaterThanOrEqual(MIB);
    expect(sha256(got), `the ${got.length} bytes read differ from the generation the reader opened`).toBe(sha256(old.subarray(0, got.length)));
    expect(err === 'ESTALE' || (err === 'EOF' && got.length === old.length), `ended with ${err} after ${got.length} bytes`).toBe(true);
  });

  it('a read past what the reader holds, once its generation was replaced in the bucket, is ESTALE, and the next open reads the new one', async () => {
    const old = bytes(64 * MIB, 21);
    await upload(tb, 'replaced', old);
    // Reads its first MiB, waits, then one MiB near the end (no readahead got there), printing the errno.
    const reader = `import os,sys,errno
fd=os.open(sys.argv[1], os.O_RDONLY)
os.pread(fd, 1<<20, 0)
print('opened', flush=True)
sys.stdin.readline()
try:
  os.pread(fd, 1<<20, 60<<20); print('read', flush=True)
except OSError as e: print(errno.errorcode[e.errno], flush=True)`;
    const r = heldReader(reader, [join(m.path, 'replaced')]);
    await r.opened;
    const next = bytes(64 * MIB, 22);
    await upload(tb, 'replaced', next);
    r.proceed();
    const out = await r.done;
    expect(out.stdout.trim().split('\n').pop()).toBe('ESTALE');
    const again = await run(PY, ['-c', 'import hashlib,sys\nprint(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())', join(m.path, 'replaced')]);
    expect(again.stdout.trim()).toBe(sha256(next));
  });
});

/** Writes the writer's new bytes to local files (the writer reads them: the test never touches the mount). */
async function parts(...bufs: Buffer[]): Promise<string[]> {
  const dir = await tempDir('parts');
  const out: string[] = [];
  for (const [i, b] of bufs.entries()) {
    const p = join(dir, `part${i}`);
    await fsp.writeFile(p, b);
    out.push(p);
  }
  return out;
}
