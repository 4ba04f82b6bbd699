// A download worker thread (started by range-workers.ts): its own connection pool to the endpoint; each
// job is one attempt of a range GET whose body it parses and copies straight into the shared block
// memory the job names, so that neither the HTTP parsing nor the copy runs on the main thread; or one
// upload request sent from shared chunk memory (the socket's copy, and TLS where there is TLS); or one
// block file written from shared block memory, its outcome sent with the next reply.
import { parentPort, workerData } from 'node:worker_threads';
import { BlockWriteError, writeBlockFileNative } from '../block-file-write.js';
import { crc32c } from '../crc32c.js';
import { dispatcherFor } from './dispatcher.js';
import { receiveRange, type RangeConnection } from './range-body.js';
import { sendTimeoutMs } from './upload-body.js';
import { RawPool } from './raw-pool.js';
import { RawFramingError, receiveRangeRaw } from './raw-range.js';
import { FILES_FLUSH_MS, serializeError, type FileJob, type FileOutcome, type RangeJob, type RangeReply, type SendJob, type SendReply, type WorkerEvent, type WorkerJob, type WorkerSetup } from './range-jobs.js';

const setup = workerData as WorkerSetup;
const pool = dispatcherFor(setup.origin, setup.poolOptions, setup.proxy);
// Range bodies on sockets of this worker's own, read straight into block memory (raw-range.ts), except
// through a proxy (undici speaks to those) or where the body's framing is not Content-Length.
const { connections, keepAliveTimeout, headersTimeout, bodyTimeout, connect } = setup.poolOptions;
const raw = setup.proxy.httpProxy || setup.proxy.httpsProxy ? null : new RawPool(setup.origin, { connections, keepAliveTimeout, headersTimeout, bodyTimeout, connect: typeof connect === 'object' && connect ? { timeout: connect.timeout ?? null } : {} });
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
  // The range's hash is kept as its chunks are copied when this attempt covers all of it (a first
  // attempt); one that resumes a cut one hashes the whole range once its bytes are in.
  const hashed = job.crcOf && job.crcOf.offset === job.offset && job.crcOf.length === job.length ? { crc32c: 0 } : null;
  try {
    const limits = { stallMs: job.stallMs, deadlineAt };
    try {
      if (!raw) throw new RawFramingError('no raw pool');
      await receiveRangeRaw(raw, conn, job.path, job.headers, job.start, job.objectSize, out, job.what, limits, got, hashed);
    } catch (err) {
      // Nothing of that response landed: undici reads this one.
      if (!(err instanceof RawFramingError)) throw err;
      if (raw) conn.metrics.inc('gcs_raw_fallbacks');
      await receiveRange(conn, job.path, job.headers, job.start, job.objectSize, out, job.what, limits, got, hashed);
    }
    const crc = !job.crcOf ? null : hashed && got.bytes === job.length ? hashed.crc32c : crc32c(Buffer.from(job.memory, job.crcOf.offset, job.crcOf.length));
    return { kind: 'range', id: job.id, bytes: got.bytes, events, error: null, crc32c: crc };
  } catch (err) {
    return { kind: 'range', id: job.id, bytes: got.bytes, events, error: serializeError(err), crc32c: null };
  }
}

async function send(job: SendJob): Promise<SendReply> {
  try {
    const body = Buffer.from(job.memory, job.offset, job.length);
    const silenceMs = sendTimeoutMs(setup.poolOptions.headersTimeout ?? 0, body.length);
    const res = await pool.request({ origin: setup.origin, method: job.method, path: job.path, headers: job.headers, body, ...(silenceMs ? { headersTimeout: silenceMs } : {}) });
    const text = await res.body.text();
    const headers: Record<string, string | string[]> = {};
    for (const [k, v] of Object.entries(res.headers)) if (v !== undefined) headers[k] = v;
    return { kind: 'send', id: job.id, statusCode: res.statusCode, headers, text, error: null };
  } catch (err) {
    return { kind: 'send', id: job.id, statusCode: 0, headers: {}, text: '', error: serializeError(err) };
  }
}

// Block file writes done and not yet told: they go with the next reply, or after FILES_FLUSH_MS. Told
// one by one, each woke the main thread by itself (as the write's completion did when the main thread
// queued it): the reply just before it had woken it a moment earlier.
let written: FileOutcome[] = [];
let flushTimer: NodeJS.Timeout | null = null;

function flushWritten(): void {
  if (flushTimer) clearTimeout(flushTimer);
  flushTimer = null;
  if (written.length === 0) return;
  port.postMessage({ kind: 'files', done: written });
  written = [];
}

function writeFile(job: FileJob): void {
  const told = (code: string | null, stage: FileOutcome['stage']): void => {
    written.push({ id: job.id, code, stage });
    flushTimer ??= setTimeout(flushWritten, FILES_FLUSH_MS);
  };
  writeBlockFileNative(job.tmp, job.final, Buffer.from(job.memory, job.offset, job.count), job.count, job.length, job.direct, job.mode).then(
    () => told(null, null),
    (err: unknown) => (err instanceof BlockWriteError ? told(err.code, err.stage) : told((err as Error).message, 'worker')),
  );
}

function reply(message: RangeReply | SendReply): void {
  flushWritten();
  port.postMessage(message);
}

// Loaded: a worker that dies before this died of its start (see RangeWorkers.lost).
port.postMessage({ kind: 'ready' });

// The main thread ends a worker with terminate(): no message asks it to stop.
port.on('message', (job: WorkerJob) => {
  if (job.kind === 'send') void send(job).then(reply);
  else if (job.kind === 'file') writeFile(job);
  else void run(job).then(reply);
});
