// Range GETs and upload requests on worker threads. The main thread keeps the retry policy, the
// request-rate limiter, the concurrency limit and auth (http-client.ts's withRetry); each attempt's HTTP
// parsing and body copy run on a worker with a connection pool of its own, straight into the block's
// shared memory, and each upload chunk is sent from its shared memory there.
import { performance as mainPerformance, type EventLoopUtilization } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { CounterName } from '../observe/metrics.js';
import type { AttemptLimits } from './attempt-limits.js';
import { GcsError } from './errors.js';
import { receiveRange, type RangeConnection } from './range-body.js';
import { hasNativeBlockWrite } from '../block-file-write.js';
import { deserializeError, type FileJob, type RangeJob, type SendJob, type WorkerReply, type WorkerSetup } from './range-jobs.js';
import type { SentResponse } from './responses.js';
import { WorkerFileWrites } from './worker-file-writes.js';
import { WORKERS_IN_USE, WorkersInUse, type WorkersInUseLimits } from './workers-in-use.js';

// The compiled worker, whether this module runs from dist/ or (under vitest) from src/.
const WORKER_SCRIPT = fileURLToPath(new URL('../../dist/gcs/range-worker.js', import.meta.url));

/** What one attempt received: its bytes, and (from a worker asked for it) the whole range's CRC32C. */
export interface ReceivedRange {
  bytes: number;
  crc32c?: number;
}

/** One worker's load, as `gcsmount stats` shows it. */
export interface WorkerLoad {
  /** Event-loop utilization (0-1) over the last SAMPLE_MS. */
  utilization: number;
  inFlight: number;
  /** Whether it takes new attempts (WorkersInUse). */
  inUse: boolean;
}

interface Slot {
  worker: Worker;
  inFlight: number;
  /** Block file writes it has been given and not yet told of. */
  files: number;
  /** The worker's event-loop use at the last sample, and its utilization over the window before it. */
  elu: EventLoopUtilization;
  utilization: number;
  /** The same at the last of the short windows that decide how many workers are in use. */
  recentElu: EventLoopUtilization;
  startedAt: number;
  /** Its module has loaded (its 'ready' message came). */
  ready: boolean;
}

interface Pending {
  slot: Slot;
  what: string;
  /** The worker's reply, taken in (resolves or rejects the caller). */
  answered: (reply: WorkerReply) => void;
  /** The attempt failed without a reply (its worker died, the workers stopped). */
  reject: (err: Error) => void;
}

/** How long close() waits for a worker's thread to end. */
const TERMINATE_WAIT_MS = 2000;

/** How often the workers' utilization is sampled (what `gcsmount stats` shows). */
const SAMPLE_MS = 2000;

/** The window over which the workers in use are found busy or idle (WorkersInUse); SAMPLE_MS is a whole number of them. */
const IN_USE_WINDOW_MS = 250;
const WINDOWS_PER_SAMPLE = SAMPLE_MS / IN_USE_WINDOW_MS;
/** A worker's first moments are its start (loading its modules): busy, but not with downloads. */
const STARTING_MS = 1500;
/** The wait before a worker is started again after the first quick death; it doubles with each one after it. */
const RESPAWN_FIRST_MS = 500;
const RESPAWN_MAX_MS = 60_000;

/**
 * Download workers. receive() is receiveRange's contract: the body of one attempt lands in `out`, and
 * `got.bytes` says how much did, also when the attempt fails. `out` must lie in shared memory (block
 * buffers allocated `shared`); any other buffer is received on the calling thread, as without workers.
 * A worker that dies fails its attempts as transient (the caller retries) and is replaced.
 */
export class RangeWorkers {
  private readonly slots: Slot[] = [];
  private readonly pending = new Map<number, Pending>();
  private readonly files = new WorkerFileWrites<Slot>();
  private nextId = 1;
  private closing = false;
  /** One timer for both samples: the short windows (WorkersInUse) and, every WINDOWS_PER_SAMPLE of them, the stats'. */
  private readonly sampler: NodeJS.Timeout;
  private windows = 0;
  private readonly inUse: WorkersInUse;
  /** Each worker's connection limit (its share of --max-conns-per-host); 0: none. */
  private readonly connections: number;
  /** Workers there may be (--download-workers); they are started as they are put to use. */
  private readonly configured: number;
  /** Workers in a row that died soon after they started; none is started before `respawnAt` then. */
  private quickDeaths = 0;
  private respawnAt = 0;
  private respawnTimer: NodeJS.Timeout | null = null;

  constructor(
    count: number,
    private readonly setup: WorkerSetup,
    /** The caller's own connection: buffers not in shared memory, and where workers' events are replayed. */
    private readonly local: RangeConnection,
    inUseLimits: WorkersInUseLimits = WORKERS_IN_USE,
    /** The worker's module (tests give one that dies). */
    private readonly script: string = WORKER_SCRIPT,
  ) {
    this.inUse = new WorkersInUse(inUseLimits);
    this.connections = setup.poolOptions.connections ?? 0;
    this.configured = count;
    // One now; the others when they are put to use: a thread that is never used costs nothing, while
    // one started costs its start (~0.4 CPU-s, loading its modules), which a one-core daemon paid
    // during its first read (`npm run bench -- scaling`: 286 MiB/s with two workers against 319 with one).
    if (count > 0) this.slots.push(this.spawn());
    this.sampler = setInterval(() => this.sample(), IN_USE_WINDOW_MS);
    this.sampler.unref();
  }

  /** Workers started (at most --download-workers). */
  get count(): number {
    return this.slots.length;
  }

  /** Attempts on workers now. */
  get inFlight(): number {
    return this.pending.size;
  }

  /** Each worker's load now: its utilization over the last sample window, its attempts in flight, whether it takes new ones. */
  loads(): WorkerLoad[] {
    const inUse = this.inUse.of(this.configured);
    return this.slots.map((s, i) => ({ utilization: Math.round(s.utilization * 100) / 100, inFlight: s.inFlight, inUse: i < inUse }));
  }

  /**
   * `crcOf`: a view of the same shared memory, ending where `out` ends, whose CRC32C the worker computes
   * once the body has landed (got.crc32c); not on the calling thread, where got.crc32c stays unset.
   */
  receive(path: string, headers: Record<string, string>, start: number, objectSize: number, out: Buffer, what: string, limits: AttemptLimits, got: ReceivedRange, crcOf: Buffer | null = null): Promise<void> {
    const slot = this.pick();
    if (!(out.buffer instanceof SharedArrayBuffer) || !slot) return receiveRange(this.local, path, headers, start, objectSize, out, what, limits, got);
    const crcRange = crcOf && crcOf.buffer === out.buffer ? { offset: crcOf.byteOffset, length: crcOf.length } : null;
    const id = this.nextId++;
    const job: RangeJob = {
      kind: 'range',
      id,
      path,
      headers,
      start,
      objectSize,
      memory: out.buffer,
      offset: out.byteOffset,
      length: out.length,
      what,
      stallMs: limits.stallMs,
      deadlineEpochMs: mainPerformance.timeOrigin + limits.deadlineAt,
      crcOf: crcRange,
    };
    return new Promise((resolve, reject) => {
      const answered = (reply: WorkerReply): void => {
        if (reply.kind !== 'range') return reject(new GcsError('INVALID', `${what}: a download worker answered with a ${reply.kind} reply`));
        got.bytes = reply.bytes;
        if (reply.crc32c !== null) got.crc32c = reply.crc32c;
        for (const e of reply.events) {
          if (e[0] === 'observe') this.local.stall?.observe(e[1]);
          else if (e[0] === 'inc') this.local.metrics.inc(e[1] as CounterName, e[2]);
          else this.local.log.warn(e[1], e[2]);
        }
        if (reply.error) reject(deserializeError(reply.error, what));
        else resolve();
      };
      const failed = (err: Error): void => {
        got.bytes = 0; // nothing a lost worker wrote counts
        reject(err);
      };
      this.post(slot, job, { slot, what, answered, reject: failed });
    });
  }

  /**
   * One upload request whose body lies in shared memory, sent by a worker (the socket's copy of the
   * body, and TLS, off the main thread); null when `body` is not in shared memory or no worker runs: the
   * caller sends it itself. The body must not change until the answer is in.
   */
  send(req: { method: 'PUT'; path: string; headers: Record<string, string>; body: Buffer }, what: string): Promise<SentResponse> | null {
    const slot = this.pick();
    if (!(req.body.buffer instanceof SharedArrayBuffer) || !slot) return null;
    const id = this.nextId++;
    this.local.metrics.inc('gcs_upload_requests_on_workers');
    const job: SendJob = { kind: 'send', id, method: req.method, path: req.path, headers: req.headers, memory: req.body.buffer, offset: req.body.byteOffset, length: req.body.length };
    return new Promise((resolve, reject) => {
      const answered = (reply: WorkerReply): void => {
        if (reply.kind !== 'send') return reject(new GcsError('INVALID', `${what}: a download worker answered with a ${reply.kind} reply`));
        if (reply.error) return reject(deserializeError(reply.error, what));
        const text = reply.text;
        resolve({
          statusCode: reply.statusCode,
          headers: reply.headers,
          body: { dump: async () => undefined, text: async () => text, json: async () => JSON.parse(text) as unknown },
        });
      };
      this.post(slot, job, { slot, what, answered, reject });
    });
  }

  /**
   * A block file written by a worker from shared memory (the addon's writeBlockFile there), so that its
   * completion wakes the worker rather than the main thread; told back with the worker's next reply
   * (FilesReply), or FILES_FLUSH_MS later. Rejects with a BlockWriteError as writeBlockFileNative does,
   * or with another error when the worker's thread ended without telling it (it died, the workers
   * closed): the caller then writes it itself (see WorkerFileWrites.fail). Null when `data` is not in
   * shared memory or no worker runs. The bytes must not change until it settles.
   */
  writeBlockFile(tmp: string, final: string, data: Buffer, count: number, length: number, direct: boolean, mode: number): Promise<void> | null {
    if (this.closing || !hasNativeBlockWrite || !(data.buffer instanceof SharedArrayBuffer)) return null;
    // The busiest worker in use: its next reply, which carries the outcome, is the soonest to come.
    const inUse = Math.max(1, this.inUse.of(this.configured));
    let slot: Slot | null = null;
    for (const s of this.slots.slice(0, inUse)) if (!slot || s.inFlight > slot.inFlight) slot = s;
    if (!slot) return null;
    const id = this.nextId++;
    const job: FileJob = { kind: 'file', id, tmp, final, memory: data.buffer, offset: data.byteOffset, count, length, direct, mode };
    const written = this.files.add(slot, id, tmp, final);
    if (slot.files === 1 && slot.inFlight === 0) slot.worker.ref();
    slot.worker.postMessage(job);
    return written;
  }

  async close(): Promise<void> {
    this.closing = true;
    clearInterval(this.sampler);
    if (this.respawnTimer) clearTimeout(this.respawnTimer);
    const slots = this.slots.splice(0);
    const stopped = await Promise.all(slots.map((s) => this.terminate(s)));
    for (const [id, p] of this.pending) {
      this.pending.delete(id);
      p.reject(new GcsError('CLOSED', `${p.what}: client closed`));
    }
    for (const [i, slot] of slots.entries()) this.files.fail(slot, 'download workers closed', stopped[i]!);
  }

  /**
   * Ends a worker's thread, waiting for it at most TERMINATE_WAIT_MS: a stopping daemon must not hang on
   * one (a full-suite run once saw a stop go no further than this); its attempts are failed either way.
   * True when its thread surely ended.
   */
  private async terminate(slot: Slot): Promise<boolean> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((r) => (timer = setTimeout(() => r('late'), TERMINATE_WAIT_MS)));
    const outcome = await Promise.race([slot.worker.terminate().catch(() => 'failed' as const), late]);
    clearTimeout(timer);
    if (outcome === 'late') this.local.log.warn({ waitedMs: TERMINATE_WAIT_MS, inFlight: slot.inFlight }, 'a download worker did not stop in time: going on without it');
    return outcome !== 'late' && outcome !== 'failed';
  }

  private post(slot: Slot, job: RangeJob | SendJob, pending: Pending): void {
    this.pending.set(job.id, pending);
    if (slot.inFlight++ === 0 && slot.files === 0) slot.worker.ref();
    slot.worker.postMessage(job);
  }

  /** A worker with work keeps the process alive; an idle one does not (a tool's process may exit). */
  private maybeIdle(slot: Slot): void {
    if (slot.inFlight === 0 && slot.files === 0) slot.worker.unref();
  }

  /**
   * Of the workers in use (WorkersInUse), the one with the fewest attempts in flight; a spare one only
   * when each in use has as many attempts as it has connections (its share of --max-conns-per-host), so
   * a cap never leaves an attempt waiting for a connection while another worker has its share free
   * (started for it, if need be).
   */
  private pick(): Slot | null {
    if (this.closing) return null;
    const inUse = this.startInUse();
    const full = (s: Slot): boolean => this.connections > 0 && s.inFlight >= this.connections;
    let best: Slot | null = null;
    for (const [i, s] of this.slots.entries()) {
      if (i >= inUse && best && !full(best)) break;
      if (!best || s.inFlight < best.inFlight) best = s;
    }
    if (best && full(best) && this.slots.length < this.configured && this.mayStart()) {
      best = this.spawn();
      this.slots.push(best);
    }
    return best;
  }

  /** Starts the workers put to use that are not running yet; returns how many are in use. */
  private startInUse(): number {
    const inUse = this.inUse.of(this.configured);
    while (this.slots.length < inUse && this.mayStart()) this.slots.push(this.spawn());
    return inUse;
  }

  /** Not while closing, nor before the wait after workers that died as they started (see lost). */
  private mayStart(): boolean {
    return !this.closing && performance.now() >= this.respawnAt;
  }

  private spawn(): Slot {
    this.local.metrics.inc('gcs_download_workers_started');
    const worker = new Worker(this.script, { workerData: this.setup });
    worker.unref();
    const elu = worker.performance.eventLoopUtilization();
    const slot: Slot = { worker, inFlight: 0, files: 0, elu, utilization: 0, recentElu: elu, startedAt: Date.now(), ready: false };
    worker.on('message', (reply: WorkerReply) => {
      if (reply.kind === 'ready') slot.ready = true;
      else if (reply.kind === 'files') {
        this.files.told(slot, reply.done);
        this.maybeIdle(slot);
      }
      else this.answered(reply);
    });
    // Its attempts fail only at 'exit', once the thread is surely gone: until then it may still write.
    worker.on('error', (err) => this.local.log.warn({ err: err.message }, 'download worker failed'));
    worker.on('exit', (code) => this.lost(slot, `exited with code ${code}`));
    return slot;
  }

  private answered(reply: Exclude<WorkerReply, { kind: 'ready' | 'files' }>): void {
    const p = this.pending.get(reply.id);
    if (!p) return;
    this.pending.delete(reply.id);
    p.slot.inFlight--;
    this.maybeIdle(p.slot);
    p.answered(reply);
  }

  /** A worker died: its attempts fail as transient (nothing it wrote counts) and another takes its place. */
  private lost(slot: Slot, why: string): void {
    const at = this.slots.indexOf(slot);
    if (at < 0) return;
    this.slots.splice(at, 1);
    for (const [id, p] of this.pending) {
      if (p.slot !== slot) continue;
      this.pending.delete(id);
      p.reject(new GcsError('TRANSIENT', `${p.what}: download worker ${why}`));
    }
    this.files.fail(slot, `download worker ${why}`, true);
    // One that died before its module had loaded (a broken install, a thread the system would not give)
    // would die again: each next one waits longer (0.5 s, doubling, at most a minute), meanwhile the
    // calling thread does the work. Started again at once, such a worker was a loop of thread starts
    // and log lines. One that was working (killed, out of memory) is replaced at once.
    this.quickDeaths = slot.ready ? 0 : this.quickDeaths + 1;
    const wait = this.quickDeaths === 0 ? 0 : Math.min(RESPAWN_MAX_MS, RESPAWN_FIRST_MS * 2 ** (this.quickDeaths - 1));
    this.respawnAt = performance.now() + wait;
    this.local.log.warn({ why, restartInMs: wait }, 'download worker lost: its downloads and upload requests are retried, and a new worker started');
    if (this.closing) return;
    if (wait === 0) this.slots.push(this.spawn());
    else this.armRespawn();
  }

  /** One timer until `respawnAt` (moved on by deaths meanwhile), then a worker if none is left. */
  private armRespawn(): void {
    if (this.respawnTimer) return;
    this.respawnTimer = setTimeout(() => {
      this.respawnTimer = null;
      // Deaths while it waited moved the time on: wait for that. (A timer may fire a little before
      // performance.now() says its wait is over: within 5 ms it is over.)
      if (this.respawnAt - performance.now() > 5) return this.armRespawn();
      this.respawnAt = 0;
      if (this.slots.length === 0 && !this.closing) this.slots.push(this.spawn());
    }, Math.max(1, this.respawnAt - performance.now()));
    this.respawnTimer.unref();
  }

  /**
   * One short window: the mean utilization of the workers in use says whether to use more or fewer;
   * every WINDOWS_PER_SAMPLE windows each worker's utilization for `gcsmount stats` is taken too.
   */
  private sample(): void {
    const statsDue = ++this.windows % WINDOWS_PER_SAMPLE === 0;
    const inUse = this.inUse.of(this.slots.length);
    let sum = 0;
    let starting = false;
    const at = Date.now();
    for (const [i, s] of this.slots.entries()) {
      const now = s.worker.performance.eventLoopUtilization();
      if (i < inUse) {
        sum += s.worker.performance.eventLoopUtilization(now, s.recentElu).utilization;
        if (at - s.startedAt < STARTING_MS) starting = true;
      }
      s.recentElu = now;
      if (statsDue) {
        s.utilization = s.worker.performance.eventLoopUtilization(now, s.elu).utilization;
        s.elu = now;
      }
    }
    if (inUse === 0 || starting) return;
    this.inUse.observe(sum / inUse, this.configured);
    this.startInUse();
  }
}
