// A download worker thread (started by range-workers.ts): its own connection pool to the endpoint; each
// job is one attempt of a range GET whose body it parses and copies straight into the shared block
// memory the job names, so that neither the HTTP parsing nor the copy runs on the main thread.
import { parentPort, workerData } from 'node:worker_threads';
import { crc32c } from '../crc32c.js';
import { dispatcherFor } from './dispatcher.js';
import { receiveRange, type RangeConnection } from './range-body.js';
import { serializeError, type RangeJob, type RangeReply, type WorkerEvent, type WorkerSetup } from './range-jobs.js';

const setup = workerData as WorkerSetup;
const pool = dispatcherFor(setup.origin, setup.poolOptions, setup.proxy);
const port = parentPort!;

async function run(job: RangeJob): Promise<RangeReply> {
  const events: WorkerEvent[] = [];
  // What receiveRange tells its connection is recorded for the main thread, which owns the stall
  // timeout, the counters and the log.
  const conn: RangeConnection = {
    pool,
    origin: setup.origin,
    stall: { observe: (ms) => void events.push(['observe', ms]) },
    metrics: { inc: (name, n = 1) => void events.push(['inc', name, n]) },
    log: { warn: ((obj: Record<string, unknown>, msg: string) => void events.push(['warn', obj, msg])) as RangeConnection['log']['warn'] },
  };
  const out = Buffer.from(job.memory, job.offset, job.length);
  const deadlineAt = job.deadlineEpochMs - performance.timeOrigin;
  const got = { bytes: 0 };
  try {
    await receiveRange(conn, job.path, job.headers, job.start, job.objectSize, out, job.what, { stallMs: job.stallMs, deadlineAt }, got);
    const crc = job.crcOf ? crc32c(Buffer.from(job.memory, job.crcOf.offset, job.crcOf.length)) : null;
    return { id: job.id, bytes: got.bytes, events, error: null, crc32c: crc };
  } catch (err) {
    return { id: job.id, bytes: got.bytes, events, error: serializeError(err), crc32c: null };
  }
}

// The main thread ends a worker with terminate(): no message asks it to stop.
port.on('message', (job: RangeJob) => {
  void run(job).then((reply) => port.postMessage(reply));
});
