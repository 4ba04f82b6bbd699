import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanupAll, eventually, mount, mountStats, run, startBucket, tempDir, unmount, type Mounted, type TestBucket } from './helpers/harness.js';
import { heldReader } from './helpers/held-reader.js';
import { bytes, sha256, upload } from './helpers/objects.js';

afterAll(cleanupAll);

const PY = '/usr/bin/python3';
const MIB = 1024 * 1024;

/** The object's bytes as the emulator stores them (buckets are folders), or null when there is none. */
async function stored(tb: TestBucket, name: string): Promise<Buffer | null> {
  const res = await fetch(`${tb.emulator.url}/storage/v1/b/${tb.bucket}/o/${encodeURIComponent(name)}?alt=media`);
  if (res.status === 404) return null;
  if (!res.ok) throw new Error(`GET ${name}: ${res.status}`);
  return Buffer.from(await res.arrayBuffer());
}

/** Fields an edit keeps as gcsfuse keeps them, beside content type and metadata (gcs/object-client.ts KEPT_FIELDS but contentEncoding). */
const KEPT = { storageClass: 'COLDLINE', cacheControl: 'no-cache', contentDisposition: 'attachment', contentLanguage: 'fr', customTime: '2026-01-02T03:04:05.000Z' };

async function resource(tb: TestBucket, name: string): Promise<{ generation: string; contentType?: string; metadata?: Record<string, string>; contentEncoding?: string } | null> {
  const res = await fetch(`${tb.emulator.url}/storage/v1/b/${tb.bucket}/o/${encodeURIComponent(name)}`);
  if (res.status === 404) return null;
  return (await res.json()) as { generation: string; contentType?: string; metadata?: Record<string, string>; contentEncoding?: string };
}

/** Requests the emulator has answered, by kind. */
function requests(tb: TestBucket): Record<string, number> {
  return { ...tb.emulator.stats().requests };
}

function delta(after: Record<string, number>, before: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k of Object.keys(after)) if (after[k]! - (before[k] ?? 0) !== 0) out[k] = after[k]! - (before[k] ?? 0);
  return out;
}

/** Runs a python snippet (the mount is touched only from other processes); its stdout. */
async function py(script: string, ...args: string[]): Promise<string> {
  const r = await run(PY, ['-c', script, ...args]);
  if (r.code !== 0) throw new Error(`python failed (${r.code}): ${r.stderr}`);
  return r.stdout.trim();
}

/** Copies argv[1] into argv[2] 300,000 bytes at a time, an fsync after each (a log written as it grows). */
const FSYNC_EVERY_300K = `import os,sys
src=open(sys.argv[1],'rb').read(); fd=os.open(sys.argv[2], os.O_WRONLY|os.O_CREAT|os.O_TRUNC)
for at in range(0, len(src), 300000):
  os.write(fd, src[at:at+300000]); os.fsync(fd)
os.close(fd)
print('done')`;

describe('writes through a mount with a cache dir', () => {
  let tb: TestBucket;
  let m: Mounted;
  let cacheDir: string;

  beforeAll(async () => {
    tb = await startBucket('writes');
    // Objects the tests change, there before the mount lists anything (a name uploaded behind a mount's
    // back shows only once its caches expire).
    for (const [name, content] of Object.entries({
      edited: 'original',
      'log.txt': 'line 1\n',
      exists: 'x',
      'dirA/one': '1',
      'dirA/sub/two': '2',
      stamped: 'x',
    }))
      await upload(tb, name, content);
    await upload(tb, 'posix.txt', 'p', { metadata: { 'goog-reserved-file-mtime': '1600000000' } });
    await upload(tb, 'both.txt', 'b', { metadata: { 'goog-reserved-file-mtime': '1600000000', gcsfuse_mtime: '2017-07-14T02:40:00Z' } });
    await upload(tb, 'garbled.txt', 'g', { metadata: { 'goog-reserved-file-mtime': 'soon' } });
    for (const name of ['typed.csv', 'typed-trunc.csv']) {
      await upload(tb, name, 'a,b\n', { contentType: 'text/csv', metadata: { owner: 'pipeline', gcsfuse_mtime: '2017-07-14T02:40:00Z' }, fields: KEPT });
    }
    await upload(tb, 'packed.txt', gzipSync('packed once\n'), { contentEncoding: 'gzip' });
    cacheDir = await tempDir('cache');
    m = await mount({ tb, args: ['--cache-dir', cacheDir, '--rename-dir-limit', '100'] });
  });

  it('a 100 MiB sequential write is one resumable session of 4 chunks, and reading it back costs no download', async () => {
    const local = join(await tempDir('src'), 'big');
    const data = bytes(100 * MIB, 7);
    await fsp.writeFile(local, data);
    const before = requests(tb);
    const stats0 = (await mountStats(m.path)).counters;
    // One descriptor written 1 MiB at a time, then closed (dd would close a dup of it first, which
    // uploads the empty file: one request more).
    await py(
      `import sys
src=open(sys.argv[1],'rb'); dst=open(sys.argv[2],'wb')
while True:
  b=src.read(1<<20)
  if not b: break
  dst.write(b)
dst.close()`,
      local,
      join(m.path, 'big'),
    );
    const stats1 = (await mountStats(m.path)).counters;
    expect(stats1.gcs_uploads_started! - stats0.gcs_uploads_started!).toBe(1);
    expect(stats1.gcs_upload_chunks! - stats0.gcs_upload_chunks!).toBe(4);
    expect(stats1.write_streamed_files! - (stats0.write_streamed_files ?? 0)).toBe(1);
    // Every chunk went from memory: the staged copy was written once (O_DIRECT) and never read back for them.
    expect(stats1.write_chunks_from_memory! - (stats0.write_chunks_from_memory ?? 0)).toBe(4);
    // The session's start and four chunks; a lookup of the new name at most besides.
    const d = delta(requests(tb), before);
    expect(d.upload).toBe(5);
    expect((d.total ?? 0) - (d.upload ?? 0)).toBeLessThanOrEqual(1);
    expect(sha256((await stored(tb, 'big'))!)).toBe(sha256(data));
    // Its blocks went into the block cache as it was uploaded: reading one's output costs nothing.
    await eventually(async () => (await mountStats(m.path)).counters.write_cached_blocks! >= 25);
    const media0 = requests(tb).media ?? 0;
    expect((await run('sha256sum', [join(m.path, 'big')])).stdout.split(' ')[0]).toBe(sha256(data));
    expect((requests(tb).media ?? 0) - media0).toBe(0);
    // dd of=: the same bytes again, as a stream over the object just written.
    const dd = await run('dd', [`if=${local}`, `of=${join(m.path, 'big')}`, 'bs=1M', 'status=none']);
    expect(dd.code).toBe(0);
    expect(sha256((await stored(tb, 'big'))!)).toBe(sha256(data));
  }, 120_000);

  it('after an fsync sent part of a chunk, the stream lines up with its chunks again: every chunk from memory', async () => {
    const local = join(await tempDir('src'), 'synced');
    const data = bytes(80 * MIB, 11);
    await fsp.writeFile(local, data);
    const stats0 = (await mountStats(m.path)).counters;
    await py(
      `import os,sys
src=open(sys.argv[1],'rb').read(); fd=os.open(sys.argv[2], os.O_WRONLY|os.O_CREAT|os.O_TRUNC)
cut=37*1024*1024+300000
for at in range(0, cut, 1<<20): os.write(fd, src[at:min(cut, at+(1<<20))])
os.fsync(fd)
for at in range(cut, len(src), 1<<20): os.write(fd, src[at:at+(1<<20)])
os.close(fd)`,
      local,
      join(m.path, 'synced'),
    );
    expect(sha256((await stored(tb, 'synced'))!)).toBe(sha256(data));
    const stats1 = (await mountStats(m.path)).counters;
    const chunks = stats1.gcs_upload_chunks! - stats0.gcs_upload_chunks!;
    // The first chunk, the fsync's part of the second, its rest, the last: each sent from memory, in
    // one session (the stream went on after the fsync).
    expect(chunks).toBe(4);
    expect(stats1.gcs_uploads_started! - stats0.gcs_uploads_started!).toBe(1);
    expect((stats1.write_stream_stops ?? 0) - (stats0.write_stream_stops ?? 0)).toBe(0);
    expect(stats1.write_chunks_from_memory! - stats0.write_chunks_from_memory!).toBe(chunks);
  });

  it('a streamed file fsynced as it grows is sent once and appears only at close', async () => {
    const data = bytes(5 * 300_000, 12);
    const local = join(await tempDir('src'), 'log');
    await fsp.writeFile(local, data);
    const stats0 = (await mountStats(m.path)).counters;
    const out = await py(
      FSYNC_EVERY_300K,
      local,
      join(m.path, 'log'),
    );
    expect(out).toBe('done');
    expect(sha256((await stored(tb, 'log'))!)).toBe(sha256(data));
    const stats1 = (await mountStats(m.path)).counters;
    const d = (k: string) => (stats1[k] ?? 0) - (stats0[k] ?? 0);
    // One session, fed at each fsync with the whole 256 KiB units written so far, finalized at close:
    // not an upload of the whole file at each fsync.
    expect(d('gcs_uploads_started')).toBe(1);
    expect(d('gcs_uploads_finalized')).toBe(1);
    expect(d('gcs_upload_bytes')).toBe(data.length);
  });

  it("--write-global-max-blocks 0 turns streaming writes off, as gcsfuse's does: each fsync uploads the file whole", async () => {
    const staged = await mount({ tb, args: ['--write-global-max-blocks', '0'] });
    try {
      const data = bytes(3 * 300_000, 13);
      const local = join(await tempDir('src'), 'log');
      await fsp.writeFile(local, data);
      const stats0 = (await mountStats(staged.path)).counters;
      const out = await py(
        FSYNC_EVERY_300K,
        local,
        join(staged.path, 'unstreamed.log'),
      );
      expect(out).toBe('done');
      expect(sha256((await stored(tb, 'unstreamed.log'))!)).toBe(sha256(data));
      const stats1 = (await mountStats(staged.path)).counters;
      // 300 kB, 600 kB and 900 kB: three whole uploads (streamed, it was one session of the 900 kB).
      expect((stats1.gcs_upload_bytes ?? 0) - (stats0.gcs_upload_bytes ?? 0)).toBe(300_000 + 600_000 + 900_000);
    } finally {
      await unmount(staged.path);
    }
  });

  it('small files are one upload request each, visible to stat and listings at once', async () => {
    const before = requests(tb);
    await py(
      `import os,sys
d=sys.argv[1]
os.mkdir(d)
for i in range(40):
  with open(os.path.join(d,'c%d'%i),'wb') as f: f.write(os.urandom(16384))
print(len(os.listdir(d)), sum(os.stat(os.path.join(d,n)).st_size for n in os.listdir(d)))`,
      join(m.path, 'small'),
    ).then((out) => expect(out).toBe(`40 ${40 * 16384}`));
    const d = delta(requests(tb), before);
    expect(d.upload).toBe(41); // the folder's placeholder and the files
    // Lookups of the new names are answered by the folder's listing (a page or two), not one each.
    expect((d.total ?? 0) - 40).toBeLessThanOrEqual(4);
  });

  it('a new file appears in the bucket only at close, and never over a name another writer took meanwhile (ESTALE)', async () => {
    const w = heldReader(
      `import os,sys,errno
f=open(sys.argv[1],'wb'); f.write(b'mine'); f.flush(); print('opened', flush=True)
sys.stdin.readline()
try:
  f.close(); print('closed')
except OSError as e: print(errno.errorcode[e.errno])`,
      [join(m.path, 'raced')],
    );
    await w.opened;
    expect(await stored(tb, 'raced')).toBeNull();
    await upload(tb, 'raced', 'theirs');
    w.proceed();
    const out = await w.done;
    expect(out.stdout).toContain('ESTALE');
    expect((await stored(tb, 'raced'))!.toString()).toBe('theirs');
  });

  it('an edit of an object replaced behind the mount fails with ESTALE at close and keeps the other writer\'s object', async () => {
    const w = heldReader(
      `import os,sys,errno
f=open(sys.argv[1],'r+b'); f.seek(0,2); f.write(b' + mine'); f.flush(); print('opened', flush=True)
sys.stdin.readline()
try:
  f.close(); print('closed')
except OSError as e: print(errno.errorcode[e.errno])`,
      [join(m.path, 'edited')],
    );
    await w.opened;
    await upload(tb, 'edited', 'replaced by another machine');
    w.proceed();
    expect((await w.done).stdout).toContain('ESTALE');
    expect((await stored(tb, 'edited'))!.toString()).toBe('replaced by another machine');
    expect((await mountStats(m.path)).counters.write_estale).toBeGreaterThanOrEqual(1);
  });

  it('edits, appends and truncates of existing objects are uploaded whole at close, with the generation they were opened on', async () => {
    const out = await py(
      `import os,sys
p=sys.argv[1]
with open(p,'a') as f: f.write('line 2\\n')
with open(p,'r+b') as f: f.seek(2); f.write(b'N')
os.truncate(p, 12)
print(open(p,'rb').read())`,
      join(m.path, 'log.txt'),
    );
    expect(out).toBe("b'liNe 1\\nline '");
    expect((await stored(tb, 'log.txt'))!.toString()).toBe('liNe 1\nline ');
  });

  it('O_EXCL on an existing name is EEXIST; mkdir makes a placeholder; rmdir of a non-empty folder is ENOTEMPTY; mknod makes an empty object, a FIFO is ENOTSUP', async () => {
    const out = await py(
      `import os,sys,errno
root=sys.argv[1]
def e(f):
  try: f(); return 'ok'
  except OSError as x: return errno.errorcode[x.errno]
print(e(lambda: os.open(os.path.join(root,'exists'), os.O_CREAT|os.O_EXCL|os.O_WRONLY)))
print(e(lambda: os.mkdir(os.path.join(root,'made'))))
print(e(lambda: os.mkdir(os.path.join(root,'made'))))
open(os.path.join(root,'made','f'),'w').write('x')
print(e(lambda: os.rmdir(os.path.join(root,'made'))))
os.unlink(os.path.join(root,'made','f'))
print(e(lambda: os.rmdir(os.path.join(root,'made'))))
print(e(lambda: os.link(os.path.join(root,'exists'), os.path.join(root,'hard'))))
import stat
print(e(lambda: os.mknod(os.path.join(root,'node'), 0o644 | stat.S_IFREG)), os.path.getsize(os.path.join(root,'node')))
print(e(lambda: os.mknod(os.path.join(root,'node'), 0o644 | stat.S_IFREG)))
print(e(lambda: os.mkfifo(os.path.join(root,'fifo'))))`,
      m.path,
    );
    expect(out.split('\n')).toEqual(['EEXIST', 'ok', 'EEXIST', 'ENOTEMPTY', 'ok', expect.stringMatching(/ENOSYS|EPERM/), 'ok 0', 'EEXIST', expect.stringMatching(/ENOTSUP|EOPNOTSUPP/)]);
    expect((await stored(tb, 'node'))!.length).toBe(0);
    expect(await resource(tb, 'made/')).toBeNull();
  });

  it('a name longer than 255 bytes is ENAMETOOLONG wherever it comes in (never made, then hidden), as on a local disk', async () => {
    const before = requests(tb);
    const firstSeq = tb.emulator.requestLog().at(-1)?.seq ?? -1;
    const out = await py(
      `import os,sys,errno
root=sys.argv[1]
long='n'*256
ok='n'*255
def e(f):
  try: f(); return 'ok'
  except OSError as x: return errno.errorcode[x.errno]
print(e(lambda: os.close(os.open(os.path.join(root,long), os.O_CREAT|os.O_WRONLY))))
print(e(lambda: os.mkdir(os.path.join(root,long))))
print(e(lambda: os.symlink('exists', os.path.join(root,long))))
print(e(lambda: os.stat(os.path.join(root,long))))
open(os.path.join(root,ok),'w').write('x')
print(e(lambda: os.rename(os.path.join(root,ok), os.path.join(root,long))))
print(os.path.getsize(os.path.join(root,ok)), ok in os.listdir(root), long in os.listdir(root))`,
      m.path,
    );
    expect(out.split('\n')).toEqual(['ENAMETOOLONG', 'ENAMETOOLONG', 'ENAMETOOLONG', 'ENAMETOOLONG', 'ENAMETOOLONG', '1 True False']);
    // Refused before any request: no request of the mount named the 256-byte name (the checks below do).
    const tooLong = 'n'.repeat(256);
    const named = (v: string | null | undefined) => v?.includes(tooLong) ?? false;
    const asking = tb.emulator.requestLog().filter((e) => e.seq > firstSeq && (named(e.object) || named(e.list?.prefix) || named(e.list?.startOffset)));
    expect(asking).toEqual([]);
    // The log covers the run: the 255-byte name's upload is in it.
    expect(tb.emulator.requestLog().some((e) => e.seq > firstSeq && e.kind === 'upload')).toBe(true);
    expect(await resource(tb, 'n'.repeat(256))).toBeNull();
    expect(await resource(tb, 'n'.repeat(256) + '/')).toBeNull();
    expect((await stored(tb, 'n'.repeat(255)))?.toString()).toBe('x');
    // The one upload is the 255-byte name's, and nothing was moved or removed.
    const d = delta(requests(tb), before);
    expect(d.upload).toBe(1);
    expect((d.move ?? 0) + (d.copy ?? 0) + (d.delete ?? 0) + (d.patch ?? 0)).toBe(0);
  });

  it('a new file renamed into a folder before its first upload goes with the folder: its old path shows nothing once made again', async () => {
    // Found by the write differential (seed 20261210): the record of the renamed new file stayed at its
    // old path, and a folder made there again showed it, an empty file that was never there.
    const script = `import os,sys
r=sys.argv[1]
os.makedirs(r+'/nf1/s')
fd=os.open(r+'/nf1/c', os.O_WRONLY|os.O_CREAT|os.O_TRUNC)
os.rename(r+'/nf1/c', r+'/nf1/s/b')
os.rename(r+'/nf1', r+'/nf2')
os.write(fd, b'moved with it')
os.close(fd)
os.makedirs(r+'/nf1/s')
print(sorted(os.listdir(r+'/nf1/s')), open(r+'/nf2/s/b').read())`;
    expect(await py(script, m.path)).toBe('[] moved with it');
    expect((await stored(tb, 'nf2/s/b'))?.toString()).toBe('moved with it');
    expect(await stored(tb, 'nf1/s/b')).toBeNull();
  });

  it('rename moves objects (a folder only up to --rename-dir-limit objects, EMFILE past it); an unlinked open file stays readable', async () => {
    const out = await py(
      `import os,sys
root=sys.argv[1]
os.rename(os.path.join(root,'dirA'), os.path.join(root,'dirB'))
print(sorted(os.listdir(os.path.join(root,'dirB'))), open(os.path.join(root,'dirB','sub','two')).read())
os.rename(os.path.join(root,'dirB','one'), os.path.join(root,'dirB','uno'))
f=open(os.path.join(root,'dirB','uno'))
os.unlink(os.path.join(root,'dirB','uno'))
print(f.read(), os.path.exists(os.path.join(root,'dirB','uno')))`,
      m.path,
    );
    expect(out.split('\n')).toEqual(["['one', 'sub'] 2", '1 False']);
    expect(await stored(tb, 'dirA/one')).toBeNull();
    expect((await stored(tb, 'dirB/sub/two'))!.toString()).toBe('2');
    expect(await stored(tb, 'dirB/uno')).toBeNull();
  });

  it('a folder renamed away and back shows the file now at each name, never one that was there before', async () => {
    const out = await py(
      `import os,sys
root=sys.argv[1]
P=lambda *a: os.path.join(root,*a)
os.mkdir(P('y1'))
w1=open(P('y1','a'),'w'); w1.write('one')
w2=open(P('y1','a'),'r+')
w1.close()
os.rename(P('y1'),P('y3'))
w2.close()
open(P('za'),'w').write('ZA')
os.rename(P('za'),P('y3','a'))
os.rename(P('y3'),P('y1'))
print(open(P('y1','a')).read())`,
      m.path,
    );
    // Before: 'one', the bytes of the generation reported for y1/a before the folder went away.
    expect(out).toBe('ZA');
    expect((await stored(tb, 'y1/a'))?.toString()).toBe('ZA');
  });

  it('a file written, closed and renamed at once (an atomic save: tmp file, then os.replace) is moved with its bytes', async () => {
    const before = requests(tb);
    const out = await py(
      `import os,sys
root=sys.argv[1]
for i in range(3):
  tmp=os.path.join(root,'ckpt.tmp'); final=os.path.join(root,'ckpt.bin')
  with open(tmp,'wb') as f: f.write(b'epoch %d' % i)
  os.replace(tmp, final)
  print(open(final,'rb').read().decode(), os.path.exists(tmp))
with open(os.path.join(root,'fresh.tmp'),'wb') as f: f.write(b'new')
os.rename(os.path.join(root,'fresh.tmp'), os.path.join(root,'fresh.txt'))
print(open(os.path.join(root,'fresh.txt')).read())`,
      m.path,
    );
    expect(out.split('\n')).toEqual(['epoch 0 False', 'epoch 1 False', 'epoch 2 False', 'new']);
    expect((await stored(tb, 'ckpt.bin'))?.toString()).toBe('epoch 2');
    expect(await stored(tb, 'ckpt.tmp')).toBeNull();
    expect((await stored(tb, 'fresh.txt'))?.toString()).toBe('new');
    // One upload per close and one move per rename: no tmp object uploaded twice, or copied and deleted.
    const d = delta(requests(tb), before);
    expect(d).toMatchObject({ upload: 4, move: 4 });
    expect((d.copy ?? 0) + (d.delete ?? 0)).toBe(0);
  });

  it('fstat and futimens of an open file whose name was unlinked or replaced act on that file, not the name (ENOENT, or the newcomer)', async () => {
    const before = requests(tb);
    const out = await py(
      `import os,sys
root=sys.argv[1]
p=os.path.join(root,'gone.txt'); q=os.path.join(root,'kept.txt'); r=os.path.join(root,'newcomer.txt')
w=open(p,'wb'); w.write(b'12345'); w.flush()
os.unlink(p)
print(os.fstat(w.fileno()).st_size)
w.write(b'678'); w.flush()
os.utime(w.fileno(), (1700000000, 1700000000))
print(os.fstat(w.fileno()).st_size, int(os.fstat(w.fileno()).st_mtime))
w.close()
open(q,'wb').write(b'abc')
f=open(q,'rb')
open(r,'wb').write(b'0123456789')
os.rename(r, q)
os.utime(f.fileno(), (1500000000, 1500000000))
print(os.fstat(f.fileno()).st_size, f.read(), os.stat(q).st_size)`,
      m.path,
    );
    expect(out.split('\n')).toEqual(['5', '8 1700000000', "3 b'abc' 10"]);
    // futimens of the reader's file left the newcomer's object alone.
    expect((await resource(tb, 'kept.txt'))!.metadata?.gcsfuse_mtime).not.toBe('2017-07-14T02:40:00Z');
    expect(await stored(tb, 'gone.txt')).toBeNull();
    // gone.txt, unlinked before its close, is never uploaded: two uploads (kept, newcomer) and one move.
    const d = delta(requests(tb), before);
    expect(d).toMatchObject({ upload: 2, move: 1 });
    expect((d.copy ?? 0) + (d.delete ?? 0) + (d.patch ?? 0)).toBe(0);
  });

  it('chmod and chown are accepted and not kept; utimes sets gcsfuse_mtime, which stat shows', async () => {
    const out = await py(
      `import os,sys
p=sys.argv[1]
os.chmod(p, 0o600)
os.utime(p, (1700000000.25, 1700000000.25))
print(os.stat(p).st_mtime)`,
      join(m.path, 'stamped'),
    );
    expect(Number(out)).toBeCloseTo(1700000000.25, 2);
    expect((await resource(tb, 'stamped'))!.metadata?.gcsfuse_mtime).toBe('2023-11-14T22:13:20.25Z');
  });

  it("shows gcloud's POSIX mtime (goog-reserved-file-mtime, seconds) as gcsfuse does, gcsfuse_mtime winning over it", async () => {
    const r = await run('stat', ['-c', '%Y', join(m.path, 'posix.txt'), join(m.path, 'both.txt'), join(m.path, 'garbled.txt')]);
    expect(r.code, r.stderr).toBe(0);
    const [posix, both, garbled] = r.stdout.trim().split('\n').map(Number);
    expect(posix).toBe(1600000000);
    expect(both).toBe(1500000000);
    // Not a number: the object's update time, as for any object.
    expect(Math.abs(garbled! - Date.now() / 1000)).toBeLessThan(600);
  });

  it("keeps an edited object's content type and custom metadata, as gcsfuse does, at one request's cost; a new file's type comes from its name", async () => {
    const before = requests(tb);
    // An append (the staged copy filled from the object) and an overwrite (O_TRUNC: nothing read).
    const r = await run('sh', ['-c', `echo 'c,d' >> ${join(m.path, 'typed.csv')} && printf 'x,y\\n' > ${join(m.path, 'typed-trunc.csv')}`]);
    expect(r.code, r.stderr).toBe(0);
    // One request each for what they keep (the namespace's listings carry neither); the rest as before.
    expect(delta(requests(tb), before)).toMatchObject({ metadata: 2, upload: 3 });
    for (const name of ['typed.csv', 'typed-trunc.csv']) {
      const res = (await resource(tb, name))!;
      expect(res.contentType, name).toBe('text/csv');
      expect(res.metadata?.owner, name).toBe('pipeline');
      expect(res, name).toMatchObject(KEPT);
      // The mtime is the edit's, not the one the object had.
      expect(res.metadata?.gcsfuse_mtime, name).not.toBe('2017-07-14T02:40:00Z');
    }
    expect((await stored(tb, 'typed.csv'))?.toString()).toBe('a,b\nc,d\n');
    // The next edit keeps them from the object the last one uploaded: no request for them again.
    const again = requests(tb);
    expect((await run('sh', ['-c', `echo 'e,f' >> ${join(m.path, 'typed.csv')}`])).code).toBe(0);
    expect(delta(requests(tb), again).metadata ?? 0).toBe(0);
    expect((await resource(tb, 'typed.csv'))!.metadata?.owner).toBe('pipeline');
    expect(await resource(tb, 'typed.csv')).toMatchObject(KEPT);
    expect((await run('sh', ['-c', `echo '{}' > ${join(m.path, 'made.json')} && echo x > ${join(m.path, 'made.zzunknown')}`])).code).toBe(0);
    expect((await resource(tb, 'made.json'))!.contentType).toBe('application/json');
    expect((await resource(tb, 'made.zzunknown'))!.contentType ?? 'application/octet-stream').toBe('application/octet-stream');
  });

  it("keeps a gzip-encoded object's Content-Encoding when it is overwritten with new stored bytes, as gcsfuse does", async () => {
    const path = join(m.path, 'packed.txt');
    // Read as stored (compressed), as gcsfuse reads it: the file's bytes are the gzip stream.
    expect((await run('sh', ['-c', `gunzip -c < ${path}`])).stdout).toBe('packed once\n');
    expect((await run('sh', ['-c', `printf 'packed twice\\n' | gzip -c > ${path}`])).code).toBe(0);
    expect((await resource(tb, 'packed.txt'))!.contentEncoding).toBe('gzip');
    expect((await run('sh', ['-c', `gunzip -c < ${path}`])).stdout).toBe('packed twice\n');
  });

  it('touch of an existing file sets its mtime in the bucket without uploading it (a metadata patch)', async () => {
    const before = requests(tb);
    const r = await run('touch', ['-d', '@1500000000', join(m.path, 'exists')]);
    expect(r.code, r.stderr).toBe(0);
    expect((await resource(tb, 'exists'))!.metadata?.gcsfuse_mtime).toBe('2017-07-14T02:40:00Z');
    expect((await stored(tb, 'exists'))?.toString()).toBe('x');
    expect(delta(requests(tb), before)).toMatchObject({ patch: 1 });
    expect(delta(requests(tb), before).upload ?? 0).toBe(0);
  });

  it('an mtime set before an fsync is uploaded with it: the close after sends nothing more', async () => {
    const before = requests(tb);
    await py(
      `import os,sys
fd=os.open(sys.argv[1], os.O_CREAT|os.O_WRONLY|os.O_TRUNC, 0o644)
os.write(fd, b'synced')
os.utime(fd, (1400000000, 1400000000))
os.fsync(fd)
os.close(fd)`,
      join(m.path, 'synced.txt'),
    );
    expect((await resource(tb, 'synced.txt'))!.metadata?.gcsfuse_mtime).toBe('2014-05-13T16:53:20Z');
    const d = delta(requests(tb), before);
    expect(d.upload).toBe(1);
    expect(d.patch ?? 0).toBe(0);
  });

  it('gcsmount stats shows the writes', async () => {
    const c = (await mountStats(m.path)).counters;
    expect(c.write_uploads).toBeGreaterThan(40);
    expect(c.fuse_write_bytes).toBeGreaterThan(100 * MIB);
  });

  it('unmounts cleanly', async () => {
    await unmount(m.path);
  });
});

describe('writes under faults and crashes', () => {
  it.each([1, 0])('cut, throttled and failing upload chunks are resumed from the committed offset, never restarted (%i download workers)', async (workers) => {
    const tb = await startBucket('faulty');
    const m = await mount({ tb, args: ['--write-block-size-mb', '1', '--download-workers', String(workers)] });
    tb.emulator.setKnobs({ uploadResetRate: 0.3, rate503: 0.1, seed: 5 });
    const data = bytes(12 * MIB, 3);
    const local = join(await tempDir('src'), 'f');
    await fsp.writeFile(local, data);
    expect((await run('cp', [local, join(m.path, 'f')])).code).toBe(0);
    tb.emulator.setKnobs({ uploadResetRate: 0, rate503: 0 });
    expect(sha256((await stored(tb, 'f'))!)).toBe(sha256(data));
    const c = (await mountStats(m.path)).counters;
    expect(c.gcs_uploads_started).toBe(1);
    expect(c.gcs_upload_resumes).toBeGreaterThan(0);
    // With a worker, the chunks (streamed from shared chunk memory) went out on it.
    if (workers > 0) expect(c.gcs_upload_requests_on_workers).toBeGreaterThan(5);
    else expect(c.gcs_upload_requests_on_workers ?? 0).toBe(0);
    await unmount(m.path);
  }, 120_000);

  it('a full temp dir: the writer hears ENOSPC, and an edit refused for room leaves the object as it was (never zeros)', async () => {
    const tb = await startBucket('tempfull');
    const original = bytes(16 * MIB, 11);
    await upload(tb, 'big.log', original);
    await upload(tb, 'small', bytes(MIB, 12));
    const temp = await tempDir('tmpfs-temp');
    expect((await run('mount', ['-t', 'tmpfs', '-o', 'size=64m', 'tmpfs', temp])).code).toBe(0);
    try {
      const m = await mount({ tb, args: ['--temp-dir', temp] });
      const filler = join(temp, 'filler');
      // The disk itself full before the staging margin's next check (every 8 MiB of growth): the staged
      // file's own ENOSPC reaches the writer as ENOSPC (libfuse once turned Node's -28 into ERANGE).
      await fsp.writeFile(filler, Buffer.alloc(61 * MIB));
      const edited = await py(
        `import os,sys,errno
fd=os.open(sys.argv[1], os.O_WRONLY)
try:
  for i in range(8): os.pwrite(fd, b'x' * (1 << 20), i << 20)
  print('ok')
except OSError as x: print(errno.errorcode[x.errno])`,
        join(m.path, 'small'),
      );
      expect(edited).toBe('ENOSPC');
      // ~10 MiB left: below the margin (5% of the disk) plus its 8 MiB of slack, so the 16 MiB copy of
      // big.log is refused.
      await fsp.writeFile(filler, Buffer.alloc(54 * MIB));
      const appended = await py(
        `import os,sys,errno
fd=os.open(sys.argv[1], os.O_WRONLY|os.O_APPEND)
for line in (b'one\\n', b'two\\n'):
  try: os.write(fd, line); print('ok')
  except OSError as x: print(errno.errorcode[x.errno])
os.close(fd); print('closed')`,
        join(m.path, 'big.log'),
      );
      // Both appends refused (the second too: it once went into the empty copy the first left behind,
      // and the close uploaded 16 MiB of zeros and a line).
      expect(appended.split('\n')).toEqual(['ENOSPC', 'ENOSPC', 'closed']);
      expect(sha256((await stored(tb, 'big.log'))!)).toBe(sha256(original));
      // With room again, an append goes through whole.
      await fsp.rm(filler);
      await py(`import sys\nwith open(sys.argv[1],'ab') as f: f.write(b'three\\n')`, join(m.path, 'big.log'));
      expect(sha256((await stored(tb, 'big.log'))!)).toBe(sha256(Buffer.concat([original, Buffer.from('three\n')])));
      await unmount(m.path);
    } finally {
      await run('umount', ['-l', temp]);
    }
  }, 120_000);

  it('a rename while a close uploads the file waits for that upload: the bytes end up under the new name', async () => {
    const tb = await startBucket('renameclose');
    await upload(tb, 'old', 'old bytes');
    const m = await mount({ tb });
    expect((await run('ls', [m.path])).code).toBe(0);
    for (const [name, dest, data] of [
      ['new', 'new2', 'new bytes'],
      ['old', 'old2', 'edited'],
    ] as const) {
      const writer = heldReader(
        `import sys
f=open(sys.argv[1],'wb'); f.write(sys.argv[2].encode()); f.flush()
print('opened', flush=True); sys.stdin.readline()
try: f.close(); print('closed')
except OSError as x: print('close failed', x.errno)`,
        [join(m.path, name), data],
      );
      await writer.opened;
      // The close's upload takes 2 s; the rename comes in the middle of it.
      tb.emulator.setKnobs({ latencyMs: 2000 });
      writer.proceed();
      await new Promise((r) => setTimeout(r, 500));
      const renamed = await run(PY, ['-c', 'import os,sys; os.rename(sys.argv[1], sys.argv[2])', join(m.path, name), join(m.path, dest)]);
      const closed = await writer.done;
      tb.emulator.setKnobs({ latencyMs: 0 });
      expect(renamed.code, renamed.stderr).toBe(0);
      expect(closed.stdout.trim().split('\n').pop()).toBe('closed');
      // Before: a new file's upload landed under the old name (nothing under the new one); an edited
      // object's upload met the moved object's generation gone (ESTALE) and the edit was lost.
      expect((await stored(tb, dest))?.toString()).toBe(data);
      expect(await stored(tb, name)).toBeNull();
    }
    await unmount(m.path);
  }, 120_000);

  it('an unlink or a rename over a file open for writing that GCS refuses leaves that file uploading at its close', async () => {
    const tb = await startBucket('refusedremove');
    await upload(tb, 'ckpt', 'v1');
    await upload(tb, 'target', 't1');
    await upload(tb, 'src', 's1');
    const m = await mount({ tb });
    expect((await run('ls', [m.path])).code).toBe(0);
    for (const [name, change] of [
      ['ckpt', `os.unlink(os.path.join(root,'ckpt'))`],
      ['target', `os.rename(os.path.join(root,'src'), os.path.join(root,'target'))`],
    ] as const) {
      const writer = heldReader(
        `import sys
f=open(sys.argv[1],'r+b'); f.write(b'edited'); f.flush()
print('opened', flush=True); sys.stdin.readline()
try: f.close(); print('closed')
except OSError as x: print('close failed', x.errno)`,
        [join(m.path, name)],
      );
      await writer.opened;
      tb.emulator.setKnobs({ denyDelete: true });
      const refused = await py(`import os,sys,errno\nroot=sys.argv[1]\ntry: ${change}; print('ok')\nexcept OSError as x: print(errno.errorcode[x.errno])`, m.path);
      tb.emulator.setKnobs({ denyDelete: false });
      expect(refused).toBe('EACCES');
      writer.proceed();
      expect((await writer.done).stdout.trim().split('\n').pop()).toBe('closed');
      // Before: the file was detached for a removal that did not happen; its close "succeeded" and
      // uploaded nothing.
      expect((await stored(tb, name))?.toString()).toBe('edited');
    }
    expect((await stored(tb, 'src'))?.toString()).toBe('s1');
    await unmount(m.path);
  }, 120_000);

  it('an mtime set as cp -p sets it (after the last write, before close) is kept on a streamed file too', async () => {
    const tb = await startBucket('streammtime');
    const m = await mount({ tb, args: ['--write-block-size-mb', '1'] });
    const before = requests(tb);
    const out = await py(
      `import os,sys
p=sys.argv[1]
fd=os.open(p, os.O_CREAT|os.O_WRONLY|os.O_TRUNC, 0o644)
os.write(fd, b'x' * (3 * 1024 * 1024 + 5))
os.utime(fd, (1600000000.5, 1600000000.5))
os.close(fd)
print(os.stat(p).st_mtime)`,
      join(m.path, 'copied.bin'),
    );
    expect(Number(out)).toBeCloseTo(1600000000.5, 2);
    const r = await resource(tb, 'copied.bin');
    expect(r!.metadata?.gcsfuse_mtime).toBe('2020-09-13T12:26:40.5Z');
    expect((await stored(tb, 'copied.bin'))!.length).toBe(3 * MIB + 5);
    // Streamed (chunks in one session), then one metadata patch (the test's own GETs count too).
    expect(delta(requests(tb), before)).toMatchObject({ patch: 1, upload: 5 });
    await unmount(m.path);
  });

  it('an upload GCS stops answering is cut after --http-client-timeout and sent again: the close waits, it never hangs', async () => {
    const tb = await startBucket('uploadstall');
    const m = await mount({ tb, args: ['--http-client-timeout', '2s', '--write-block-size-mb', '1', '--max-retry-sleep', '500ms'] });
    const writer = heldReader(
      `import sys
f=open(sys.argv[1],'wb')
print('opened', flush=True); sys.stdin.readline()
f.write(bytes(range(256)) * (12 * 1024 + 1))
f.close(); print('closed')`,
      [join(m.path, 'stalled.bin')],
      90_000,
    );
    await writer.opened;
    tb.emulator.setKnobs({ stall: true });
    writer.proceed();
    await new Promise((r) => setTimeout(r, 3_500));
    const stalled = tb.emulator.requestLog().filter((e) => e.kind === 'upload' && e.injected === 'stall').length;
    tb.emulator.setKnobs({ stall: false });
    const t0 = performance.now();
    const r = await writer.done;
    expect(r.stdout.trim().split('\n').pop(), r.stderr).toBe('closed');
    // Cut after its 2 s of silence, not held for undici's 300 s.
    expect(stalled).toBeGreaterThanOrEqual(1);
    expect((performance.now() - t0) / 1000).toBeLessThan(30);
    const want = Buffer.concat(Array.from({ length: 12 * 1024 + 1 }, () => Buffer.from(Array.from({ length: 256 }, (_, i) => i))));
    expect((await stored(tb, 'stalled.bin'))!.equals(want)).toBe(true);
    await unmount(m.path);
  }, 120_000);

  it('--create-empty-file: a created file is an empty object in the bucket while it is written, replaced by its bytes at close', async () => {
    const tb = await startBucket('emptyhold');
    await upload(tb, 'taken', 'other');
    const m = await mount({ tb, args: ['--create-empty-file'] });
    const writer = heldReader(
      `import sys
f=open(sys.argv[1],'wb'); f.write(b'the bytes'); f.flush()
print('opened', flush=True); sys.stdin.readline()
f.close(); print('closed')`,
      [join(m.path, 'new.txt')],
    );
    await writer.opened;
    const hold = await resource(tb, 'new.txt');
    expect(hold).not.toBeNull();
    expect((await stored(tb, 'new.txt'))!.length).toBe(0);
    writer.proceed();
    expect((await writer.done).stdout.trim().split('\n').pop()).toBe('closed');
    expect((await stored(tb, 'new.txt'))?.toString()).toBe('the bytes');
    // The bytes replaced the hold's own generation (a precondition on it), not whatever was there.
    expect((await resource(tb, 'new.txt'))!.generation).not.toBe(hold!.generation);
    // The hold, and so the file after it, has its name's content type, as a file made without one has.
    expect(hold!.contentType).toBe('text/plain');
    expect((await resource(tb, 'new.txt'))!.contentType).toBe('text/plain');
    // O_EXCL of a name that exists is still EEXIST, and the object there is left alone.
    expect(await py(`import os,sys,errno\ntry: os.open(sys.argv[1], os.O_CREAT|os.O_EXCL|os.O_WRONLY); print('ok')\nexcept OSError as x: print(errno.errorcode[x.errno])`, join(m.path, 'taken'))).toBe('EEXIST');
    expect((await stored(tb, 'taken'))?.toString()).toBe('other');
    await unmount(m.path);
  });

  it('--create-empty-file: O_CREAT of a name another writer took meanwhile opens that object (only O_EXCL is EEXIST)', async () => {
    const tb = await startBucket('emptyrace');
    const m = await mount({ tb, args: ['--create-empty-file', '--metadata-cache-negative-ttl-secs', '60'] });
    // This mount learns the name is free, then another writer takes it.
    expect((await run('stat', [join(m.path, 'raced.txt')])).code).not.toBe(0);
    await upload(tb, 'raced.txt', 'theirs');
    const out = await py(
      `import os,sys,errno
p=sys.argv[1]
try: os.open(p, os.O_CREAT|os.O_EXCL|os.O_WRONLY); print('excl ok')
except OSError as x: print('excl', errno.errorcode[x.errno])
with open(p,'w') as f: f.write('mine')
print('written')`,
      join(m.path, 'raced.txt'),
    );
    expect(out.split('\n')).toEqual(['excl EEXIST', 'written']);
    expect((await stored(tb, 'raced.txt'))?.toString()).toBe('mine');
    await unmount(m.path);
  });

  it('an O_TRUNC open refused (ESTALE) does not keep the file open: once its writer closes, the name opens afresh', async () => {
    const tb = await startBucket('truncrefused');
    await upload(tb, 'x', 'v1');
    const m = await mount({ tb });
    expect((await run('ls', [m.path])).code).toBe(0);
    const writer = heldReader(
      `import os,sys,errno
fd=os.open(sys.argv[1], os.O_RDWR); os.write(fd, b'A')
print('opened', flush=True); sys.stdin.readline()
for what, f in (('fsync', lambda: os.fsync(fd)), ('trunc', lambda: os.close(os.open(sys.argv[1], os.O_WRONLY|os.O_TRUNC))), ('close', lambda: os.close(fd))):
  try: f(); print(what, 'ok')
  except OSError as x: print(what, errno.errorcode[x.errno])`,
      [join(m.path, 'x')],
    );
    await writer.opened;
    await upload(tb, 'x', 'v2'); // replaced behind the mount: the open file is stale from its next upload
    writer.proceed();
    expect((await writer.done).stdout.trim().split('\n').slice(1)).toEqual(['fsync ESTALE', 'trunc ESTALE', 'close ESTALE']);
    // The refused O_TRUNC open once left a handle counted: the stale file stayed the name's, ESTALE to
    // every open. And once ESTALE said the object changed, a new open finds v2 (what the bucket holds),
    // not v1 as cached for a TTL more.
    await py(`import sys\nwith open(sys.argv[1],'wb') as f: f.write(b'v3')`, join(m.path, 'x'));
    expect((await stored(tb, 'x'))?.toString()).toBe('v3');
    await unmount(m.path);
  }, 60_000);

  it('an open folder read in small pieces shows this mount\'s changes made meanwhile, and rewinddir reads it afresh', async () => {
    const tb = await startBucket('opendir');
    const names = Array.from({ length: 60 }, (_, i) => `f${String(i).padStart(2, '0')}`);
    for (const n of names) await upload(tb, `d/${n}`, `old ${n}`);
    const m = await mount({ tb });
    const dir = join(m.path, 'd');
    // getdents64 with a small buffer: one READDIRPLUS of a few entries per call, so the folder is read
    // before and after the changes below, through one open handle.
    const lister = heldReader(
      `import ctypes,os,sys
libc=ctypes.CDLL(None, use_errno=True)
fd=os.open(sys.argv[1], os.O_RDONLY|os.O_DIRECTORY)
buf=ctypes.create_string_buffer(512)
def chunk():
  n=libc.syscall(217, fd, buf, 512)
  out=[]; i=0
  while i<n:
    reclen=int.from_bytes(buf.raw[i+16:i+18],'little'); out.append(buf.raw[i+19:i+reclen].split(b'\\0')[0].decode()); i+=reclen
  return out
first=chunk()
print('opened', flush=True); sys.stdin.readline()
rest=[]
while True:
  c=chunk()
  if not c: break
  rest+=c
try: os.stat(os.path.join(sys.argv[1],'f50')); print('f50 stat ok')
except FileNotFoundError: print('f50 ENOENT')
print(open(os.path.join(sys.argv[1],'f55')).read())
os.lseek(fd, 0, 0)
again=[]
while True:
  c=chunk()
  if not c: break
  again+=c
print('again', 'f50' in again, 'new' in again, len(again))`,
      [dir],
    );
    await lister.opened;
    await py(`import os,sys\nos.unlink(os.path.join(sys.argv[1],'f50'))\nopen(os.path.join(sys.argv[1],'f55'),'w').write('new bytes of f55')\nopen(os.path.join(sys.argv[1],'new'),'w').write('x')`, dir);
    lister.proceed();
    const out = (await lister.done).stdout.trim().split('\n');
    // Before: the later READDIRPLUS replies gave the kernel f50 back (stat answered from its dentry) and
    // f55's old generation (read as EIO or its old bytes); rewinddir showed the listing first taken.
    expect(out.slice(1)).toEqual(['f50 ENOENT', 'new bytes of f55', 'again False True 62']);
    await unmount(m.path);
  }, 60_000);

  it('a reader opened before a writer reads the writer\'s appends past the old end (not EOF)', async () => {
    const tb = await startBucket('readerappend');
    const old = bytes(4 * MIB, 21);
    await upload(tb, 'log', old);
    const m = await mount({ tb, args: ['--cache-dir', await tempDir('cache')] });
    const path = join(m.path, 'log');
    const reader = heldReader(
      `import os,sys
fd=os.open(sys.argv[1], os.O_RDONLY)
n=0
while True:
  b=os.pread(fd, 1<<20, n)
  if not b: break
  n+=len(b)
print(n); print('opened', flush=True); sys.stdin.readline()
b=os.pread(fd, 1<<16, 4<<20)
print(len(b), b[:5].decode())`,
      [path],
    );
    await reader.opened;
    const writer = heldReader(
      `import os,sys
fd=os.open(sys.argv[1], os.O_WRONLY|os.O_APPEND); os.write(fd, b'added' * 13107)
print('opened', flush=True); sys.stdin.readline()
os.close(fd)`,
      [path],
    );
    await writer.opened;
    reader.proceed();
    const read = (await reader.done).stdout.trim().split('\n');
    writer.proceed();
    expect((await writer.done).code).toBe(0);
    // Before: the native side, sized at the reader's open, answered EOF past the old end.
    expect(read).toEqual([String(4 * MIB), 'opened', '65535 added']);
    expect((await stored(tb, 'log'))?.length).toBe(4 * MIB + 65535);
    await unmount(m.path);
  }, 60_000);

  it('-o ro refuses every change with EROFS', async () => {
    const tb = await startBucket('readonly');
    await upload(tb, 'a', 'x');
    const m = await mount({ tb, args: ['-o', 'ro'] });
    const out = await py(
      `import os,sys,errno
root=sys.argv[1]
for f in (lambda: open(os.path.join(root,'new'),'w'), lambda: open(os.path.join(root,'a'),'a'), lambda: os.mkdir(os.path.join(root,'d')), lambda: os.unlink(os.path.join(root,'a'))):
  try: f(); print('ok')
  except OSError as x: print(errno.errorcode[x.errno])`,
      m.path,
    );
    expect(out.split('\n')).toEqual(['EROFS', 'EROFS', 'EROFS', 'EROFS']);
    await unmount(m.path);
  });

  it('SIGKILL while a file is open for writing: the bucket keeps the old object; the staged copy is reported and removed at the next start', async () => {
    const tb = await startBucket('killed');
    await upload(tb, 'k', 'old bytes');
    const cacheDir = await tempDir('cache');
    const m = await mount({ tb, args: ['--cache-dir', cacheDir], foreground: true });
    const w = heldReader(
      `import sys
f=open(sys.argv[1],'r+b'); f.write(b'NEW'*100000); f.flush(); print('opened', flush=True)
sys.stdin.readline()`,
      [join(m.path, 'k')],
    );
    await w.opened;
    m.daemon!.kill('SIGKILL');
    await new Promise((r) => m.daemon!.once('exit', r));
    w.proceed();
    await w.done;
    await unmount(m.path);
    expect((await stored(tb, 'k'))!.toString()).toBe('old bytes');
    const staging = join(cacheDir, 'gcsmount-cache', 'staging');
    expect((await fsp.readdir(staging)).length).toBe(1);
    const m2 = await mount({ tb, args: ['--cache-dir', cacheDir] });
    const log = await fsp.readFile(m2.logFile, 'utf8');
    expect(log).toContain('staged files left by a daemon that stopped');
    expect((await fsp.readdir(staging)).length).toBe(1); // the new daemon's own folder only
    expect((await run('cat', [join(m2.path, 'k')])).stdout).toBe('old bytes');
    await unmount(m2.path);
  }, 120_000);
});
