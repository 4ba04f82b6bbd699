import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Dispatcher } from 'undici';
import { afterAll, describe, expect, it } from 'vitest';
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
