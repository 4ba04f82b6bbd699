// Name changes racing closes and each other, on the write side alone (test/helpers/fake-writes.ts): the
// orders here are ones a mount test cannot pin down. Each case was a bug found by review.
import { describe, expect, it } from 'vitest';
import { WriteError } from '../src/writes/write-error.js';
import { FakeGcs, fakeWrites, sleep } from './helpers/fake-writes.js';

const within = <T>(ms: number, p: Promise<T>): Promise<T | 'timed out'> => Promise.race([p, sleep(ms).then(() => 'timed out' as const)]);

describe('name changes racing closes and each other', () => {
  it('a file rename and a rename of its folder, at once, both finish (they waited on each other for ever)', async () => {
    const gcs = new FakeGcs();
    const writes = fakeWrites(gcs);
    gcs.put('d/', '');
    gcs.put('d/a', 'A');
    gcs.put('d/b', 'B');
    const a = writes.open('/d/a', await gcs.client().statObject('d/a'));
    const b = writes.open('/d/b', await gcs.client().statObject('d/b'));
    await a.write(0, Buffer.from('a2'));
    await b.write(0, Buffer.from('b2'));
    gcs.uploadDelayMs = 200;
    const closing = a.flush(); // a's close is uploading
    const fileRename = writes.rename('/d/a', '/d/b', 0);
    await sleep(20);
    const folderRename = writes.rename('/d', '/e', 0);
    expect(await within(5000, Promise.allSettled([closing, fileRename, folderRename]).then((r) => r.map((x) => x.status)))).toEqual(['fulfilled', 'fulfilled', 'fulfilled']);
    gcs.uploadDelayMs = 0;
    expect(await within(2000, a.write(2, Buffer.from('!')))).toBe(1);
    await writes.release(a);
    await writes.release(b);
    expect(gcs.text('e/b')).toBe('a2!');
    expect(gcs.text('d/a') ?? gcs.text('d/b') ?? gcs.text('e/a')).toBeUndefined();
  });

  it("a rename over a file whose close is uploading replaces what that close uploaded (not ESTALE on the generation before it)", async () => {
    const gcs = new FakeGcs();
    const writes = fakeWrites(gcs);
    gcs.put('a', 'AAAA');
    gcs.put('b', 'old b');
    const b = writes.open('/b', await gcs.client().statObject('b'));
    await b.write(0, Buffer.from('new b content'));
    gcs.uploadDelayMs = 200;
    const closing = b.flush();
    await sleep(30);
    await expect(writes.rename('/a', '/b', 0)).resolves.toMatchObject({ kind: 'file' });
    await closing;
    expect(gcs.text('b')).toBe('AAAA');
    expect(gcs.text('a')).toBeUndefined();
  });

  it('a new file renamed over an object and renamed again reads zeros past its end, never the replaced object', async () => {
    const gcs = new FakeGcs();
    const writes = fakeWrites(gcs);
    gcs.put('b', 'SECRET-OLD-CONTENT-OF-B');
    const w = writes.open('/a', null);
    await writes.rename('/a', '/b', 0);
    await writes.rename('/b', '/c', 0);
    await w.write(10, Buffer.from('x'));
    expect((await w.read(0, 64))?.toString('hex')).toBe(`${'00'.repeat(10)}78`);
    await writes.release(w);
    expect(gcs.objs.get('c')?.bytes.toString('hex')).toBe(`${'00'.repeat(10)}78`);
    // The replaced object went with its name: b is gone, as the file that replaced it moved on.
    expect([...gcs.objs.keys()].sort()).toEqual(['c']);
  });

  it('unlink of a file open here whose generation was replaced elsewhere succeeds; its handle then gets ESTALE', async () => {
    const gcs = new FakeGcs();
    const writes = fakeWrites(gcs);
    gcs.put('f', 'version 1');
    const w = writes.open('/f', await gcs.client().statObject('f')); // open for writing, nothing written
    gcs.put('f', 'version 2 from elsewhere');
    await expect(writes.removeFile('/f')).resolves.toBeUndefined();
    expect(gcs.objs.has('f')).toBe(false);
    expect(writes.stateOf('/f')).toBeUndefined();
    await expect(w.read(0, 10)).rejects.toSatisfy((e: unknown) => e instanceof WriteError && e.errno === 'ESTALE');
    await expect(w.write(0, Buffer.from('x'))).rejects.toSatisfy((e: unknown) => e instanceof WriteError && e.errno === 'ESTALE');
    await writes.release(w);
    expect(gcs.objs.has('f')).toBe(false);
  });

  it("an upload that finds its own object after a lost answer keeps the object's attributes for the file's next upload", async () => {
    const gcs = new FakeGcs();
    const writes = fakeWrites(gcs);
    gcs.put('f.csv', 'a,b\n', { contentType: 'text/csv', storageClass: 'COLDLINE', metadata: { owner: 'pipeline' } });
    const w = writes.open('/f.csv', await gcs.client().statObject('f.csv'));
    await w.write(4, Buffer.from('c,d\n'));
    gcs.loseAnswers = 1;
    await w.flush();
    await w.write(8, Buffer.from('e,f\n'));
    await w.flush();
    await writes.release(w);
    expect(gcs.text('f.csv')).toBe('a,b\nc,d\ne,f\n');
    expect(gcs.uploadOpts).toHaveLength(2);
    for (const opts of gcs.uploadOpts) expect(opts).toMatchObject({ contentType: 'text/csv', storageClass: 'COLDLINE', metadata: { owner: 'pipeline' } });
  });

  it("a rename that finds its own move done after a lost answer keeps the object's attributes for the open file's next upload", async () => {
    const gcs = new FakeGcs();
    const writes = fakeWrites(gcs);
    gcs.put('r.csv', 'a,b\n', { contentType: 'text/csv', metadata: { owner: 'pipeline' } });
    const w = writes.open('/r.csv', await gcs.client().statObject('r.csv'));
    await w.write(4, Buffer.from('c,d\n'));
    gcs.loseMoveAnswers = 1;
    await writes.rename('/r.csv', '/s.csv', 0);
    await w.write(8, Buffer.from('e,f\n'));
    await writes.release(w);
    expect(gcs.text('s.csv')).toBe('a,b\nc,d\ne,f\n');
    // Its first upload, after the move: what it keeps comes from the object the move made.
    expect(gcs.uploadOpts).toHaveLength(1);
    expect(gcs.uploadOpts[0]).toMatchObject({ contentType: 'text/csv', metadata: { owner: 'pipeline' } });
  });
});
