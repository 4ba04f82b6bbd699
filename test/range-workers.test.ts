import { mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Dispatcher } from 'undici';
import { afterAll, describe, expect, it } from 'vitest';
import { BlockWriteError } from '../src/block-file-write.js';
import { RangeWorkers } from '../src/gcs/range-workers.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';
import { cleanupAll, tempDir } from './helpers/harness.js';

afterAll(cleanupAll);

describe('download workers that die as they start', () => {
  it('are started again after a growing wait, not in a loop; meanwhile the calling thread takes their work', async () => {
    const dir = await tempDir('dying-worker');
    const script = join(dir, 'dies.mjs');
    writeFileSync(script, 'process.exit(3);\n');
    const metrics = new Metrics();
    const local = { pool: null as unknown as Dispatcher, origin: 'http://127.0.0.1:9', stall: null, metrics, log: silentLogger };
    const setup = { origin: 'http://127.0.0.1:9', poolOptions: {}, proxy: { httpProxy: null, httpsProxy: null, noProxy: null } };
    const workers = new RangeWorkers(2, setup as never, local, undefined, script);
    try {
      // Once the first has died, none is alive until its wait is over: an upload chunk in shared memory
      // is then left to the caller to send (null), not queued for a worker that is not there.
      const until = performance.now() + 5_000;
      while (workers.count > 0 && performance.now() < until) await new Promise((r) => setTimeout(r, 5));
      expect(workers.count).toBe(0);
      const body = Buffer.from(new SharedArrayBuffer(8));
      expect(workers.send({ method: 'PUT', path: '/x', headers: {}, body }, 'PUT /x')).toBeNull();
      await new Promise((r) => setTimeout(r, 2_500));
      // 0.5 s, 1 s, 2 s between the starts: 3 or 4 in 2.5 s. Started again at once: dozens.
      const started = metrics.get('gcs_download_workers_started');
      expect(started).toBeGreaterThanOrEqual(2);
      expect(started).toBeLessThanOrEqual(5);
    } finally {
      await workers.close();
    }
  });
});

describe('block files written by a download worker', () => {
  const setup = { origin: 'http://127.0.0.1:9', poolOptions: {}, proxy: { httpProxy: null, httpsProxy: null, noProxy: null } };
  const localFor = (metrics: Metrics) => ({ pool: null as unknown as Dispatcher, origin: 'http://127.0.0.1:9', stall: null, metrics, log: silentLogger });

  it('are written whole from shared memory, renamed into place and told back with no other traffic', async () => {
    const dir = await tempDir('worker-files');
    mkdirSync(join(dir, 'tmp'));
    const workers = new RangeWorkers(1, setup as never, localFor(new Metrics()), undefined);
    try {
      const until = performance.now() + 5_000;
      while (workers.count === 0 && performance.now() < until) await new Promise((r) => setTimeout(r, 5));
      const data = Buffer.from(new SharedArrayBuffer(3 * 4096));
      for (let i = 0; i < data.length; i++) data[i] = (i * 7) & 0xff;
      // Two at once, one cut back from its padded length as an O_DIRECT write is (this memory is not
      // aligned for O_DIRECT itself): their outcomes come back on the worker's flush timer, as no range
      // reply goes out to carry them.
      const whole = workers.writeBlockFile(join(dir, 'tmp', 'a.1'), join(dir, 'a'), data, data.length, data.length, false, 0o600);
      const cut = workers.writeBlockFile(join(dir, 'tmp', 'b.2'), join(dir, 'b'), data, data.length, data.length - 100, false, 0o600);
      expect(whole).not.toBeNull();
      expect(cut).not.toBeNull();
      await Promise.all([whole, cut]);
      expect(readFileSync(join(dir, 'a')).equals(data)).toBe(true);
      expect(readFileSync(join(dir, 'b')).equals(data.subarray(0, data.length - 100))).toBe(true);
      expect(statSync(join(dir, 'a')).mode & 0o777).toBe(0o600);
      expect(readdirSync(join(dir, 'tmp'))).toEqual([]);
      // Memory the worker cannot see is the caller's to write.
      expect(workers.writeBlockFile(join(dir, 'tmp', 'c.3'), join(dir, 'c'), Buffer.alloc(16), 16, 16, false, 0o600)).toBeNull();
      // A failed write is told with its stage and errno, as the addon's own write tells it.
      const missing = workers.writeBlockFile(join(dir, 'no-such-dir', 'd.4'), join(dir, 'd'), data, 16, 16, false, 0o600);
      await expect(missing).rejects.toMatchObject({ name: 'Error', code: 'ENOENT', stage: 'open' });
      await expect(missing).rejects.toBeInstanceOf(BlockWriteError);
    } finally {
      await workers.close();
    }
  });

  it('given to a worker that dies, fail as not run, so that the caller writes them', async () => {
    const dir = await tempDir('worker-files-dying');
    // A worker that takes jobs and answers none, then dies: the writes it was given are never told.
    const script = join(dir, 'silent.mjs');
    writeFileSync(script, "import { parentPort } from 'node:worker_threads';\nparentPort.postMessage({ kind: 'ready' });\nparentPort.on('message', () => setTimeout(() => process.exit(5), 50));\n");
    const workers = new RangeWorkers(1, setup as never, localFor(new Metrics()), undefined, script);
    try {
      const until = performance.now() + 5_000;
      while (workers.count === 0 && performance.now() < until) await new Promise((r) => setTimeout(r, 5));
      const data = Buffer.from(new SharedArrayBuffer(4096));
      const write = workers.writeBlockFile(join(dir, 'x.1'), join(dir, 'x'), data, 16, 16, false, 0o600);
      expect(write).not.toBeNull();
      const err = await write!.then(() => null, (e: unknown) => e);
      expect(err).toBeInstanceOf(Error);
      expect(err).not.toBeInstanceOf(BlockWriteError);
      expect(String(err)).toContain('download worker');
    } finally {
      await workers.close();
    }
  });
});
