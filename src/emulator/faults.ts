// Fault-injection knobs and the seeded dice that decide, request by request, which fault fires.

export interface EmulatorKnobs {
  /** Delay before any byte of an API response, in ms. */
  latencyMs: number;
  /** Per response body; 0 = unlimited. */
  bandwidthBytesPerSec: number;
  /** Probability (0..1) that an API request is answered 429. */
  rate429: number;
  /** Probability (0..1) that an API request is answered 503. */
  rate503: number;
  /** When set, injected 429/503 responses carry `Retry-After`. */
  retryAfterSeconds: number | null;
  /** Probability that a media body is cut by a TCP reset partway through. */
  resetRate: number;
  /** Probability that a media body ends cleanly (FIN) after about half of its Content-Length. */
  shortBodyRate: number;
  /** Largest list page (items + prefixes), 1..1000. */
  pageSize: number;
  /**
   * Extra delay of a list response per item or prefix it returns, in ms (on top of latencyMs): real GCS
   * answers a 1,000-entry page in 100-300 ms and a 1-entry page in a round trip, so a client that asks
   * for big pages where a small one would do pays for it.
   */
  listMsPerEntry: number;
  /** Seeds the dice; setting it restarts the sequence. */
  seed: number;
  /** Every media request answers this status (e.g. 403, 404), for permanent-error tests. */
  failMedia: { status: number } | null;
  /** Every API request is accepted and never answered (an endpoint that hangs), until the client gives up. */
  stall: boolean;
  /**
   * Requests per second the whole emulator accepts, from all clients together (a token bucket, like a
   * bucket's request-rate limit); beyond it API requests are answered 429 (with Retry-After when
   * `retryAfterSeconds` is set). 0 = no limit.
   */
  rateLimit: number;
  /** Tokens the rate limit's bucket holds: how many requests may come at once after a quiet spell; 0 = a fifth of a second's worth. */
  rateLimitBurst: number;
  /** Probability (0..1) that a media body goes silent part-way: the connection stays open, no bytes flow. */
  bodyStallRate: number;
  /** How long a stalled body stays silent, in ms. */
  bodyStallMs: number;
  /** After the silence, true: the rest of the body follows; false: the connection is reset. */
  bodyStallResumes: boolean;
  /** Bucket-resource GETs answer 403, as for a key holding only roles/storage.objectViewer (no storage.buckets.get). */
  denyBucketGet: boolean;
  /**
   * Object deletes and moves (which delete their source) answer 403, as GCS answers a key without
   * storage.objects.delete (GCS asks for it to replace an object too; uploads are left alone here).
   */
  denyDelete: boolean;
  /** API requests whose `Authorization: Bearer TOKEN` names one of these tokens answer 401 (an expired or revoked token). */
  rejectTokens: string[];
  /**
   * Buckets with Requester Pays on (their resource shows `billing.requesterPays`): each request to one
   * must name a project to bill (`userProject`), or it is answered 400 as GCS answers it. A resumable
   * session's own requests (by upload_id) are billed to the project that started it.
   */
  requesterPays: string[];
  /**
   * Probability (0..1) that an upload chunk's connection is reset part-way through its body; what
   * arrived is persisted up to a 256 KiB boundary, as GCS persists, so a status query shows it.
   */
  uploadResetRate: number;
  /**
   * Probability (0..1) that an upload chunk is received and dropped: answered 308 with the range the
   * session held before it (nothing committed), as GCS may when it could not persist a chunk.
   */
  uploadDropRate: number;
  /** Upload chunk bodies are taken no faster than this (a slow uplink); 0 = as fast as they come. */
  uploadBytesPerSec: number;
  /** A resumable session older than this answers 404, as an expired one does (GCS: a week); 0 = never. */
  uploadSessionTtlMs: number;
  /** Bytes one rewrite call copies before answering `done: false` with a rewriteToken; 0 = all at once. */
  rewriteBytesPerCall: number;
}

export type InjectedFault = '401' | '403' | '429' | '503' | 'reset' | 'short' | 'stall' | 'throttle' | 'body-stall' | 'upload-drop';

export const DEFAULT_KNOBS: EmulatorKnobs = {
  latencyMs: 0,
  bandwidthBytesPerSec: 0,
  rate429: 0,
  rate503: 0,
  retryAfterSeconds: null,
  resetRate: 0,
  shortBodyRate: 0,
  pageSize: 1000,
  listMsPerEntry: 0,
  seed: 1,
  failMedia: null,
  stall: false,
  rateLimit: 0,
  rateLimitBurst: 0,
  bodyStallRate: 0,
  bodyStallMs: 60_000,
  bodyStallResumes: true,
  denyBucketGet: false,
  denyDelete: false,
  rejectTokens: [],
  requesterPays: [],
  uploadResetRate: 0,
  uploadDropRate: 0,
  uploadBytesPerSec: 0,
  uploadSessionTtlMs: 0,
  rewriteBytesPerCall: 0,
};

const RATES = ['rate429', 'rate503', 'resetRate', 'shortBodyRate', 'bodyStallRate', 'uploadResetRate', 'uploadDropRate'] as const;
const NON_NEGATIVE = ['latencyMs', 'bandwidthBytesPerSec', 'uploadBytesPerSec', 'rateLimit', 'rateLimitBurst', 'bodyStallMs', 'listMsPerEntry', 'uploadSessionTtlMs', 'rewriteBytesPerCall'] as const;

/** Checks a partial knob set; throws an Error with a one-line message naming the bad knob. */
export function validateKnobs(k: unknown): Partial<EmulatorKnobs> {
  if (k === null || typeof k !== 'object' || Array.isArray(k)) throw new Error('knobs must be a JSON object');
  const src = k as Record<string, unknown>;
  for (const key of Object.keys(src)) {
    if (!(key in DEFAULT_KNOBS)) throw new Error(`unknown knob: ${key}`);
  }
  const num = (key: string): number | undefined => {
    const v = src[key];
    if (v === undefined) return undefined;
    if (typeof v !== 'number' || !Number.isFinite(v)) throw new Error(`${key} must be a finite number`);
    return v;
  };
  for (const key of RATES) {
    const v = num(key);
    if (v !== undefined && (v < 0 || v > 1)) throw new Error(`${key} must be within 0..1`);
  }
  for (const key of NON_NEGATIVE) {
    const v = num(key);
    if (v !== undefined && v < 0) throw new Error(`${key} must not be negative`);
  }
  const page = num('pageSize');
  if (page !== undefined && (!Number.isInteger(page) || page < 1 || page > 1000)) {
    throw new Error('pageSize must be an integer within 1..1000');
  }
  const seed = num('seed');
  if (seed !== undefined && !Number.isInteger(seed)) throw new Error('seed must be an integer');
  if (src.retryAfterSeconds !== undefined && src.retryAfterSeconds !== null) {
    const v = num('retryAfterSeconds')!;
    if (v < 0) throw new Error('retryAfterSeconds must not be negative');
  }
  const fm = src.failMedia;
  if (fm !== undefined && fm !== null) {
    const status = typeof fm === 'object' ? (fm as Record<string, unknown>).status : undefined;
    if (typeof status !== 'number' || !Number.isInteger(status) || status < 400 || status > 599) {
      throw new Error('failMedia must be null or {"status": 400..599}');
    }
  }
  // An explicit `undefined` means "not given", not "clear this knob".
  if (src.stall !== undefined && typeof src.stall !== 'boolean') throw new Error('stall must be true or false');
  if (src.denyBucketGet !== undefined && typeof src.denyBucketGet !== 'boolean') throw new Error('denyBucketGet must be true or false');
  if (src.denyDelete !== undefined && typeof src.denyDelete !== 'boolean') throw new Error('denyDelete must be true or false');
  if (src.bodyStallResumes !== undefined && typeof src.bodyStallResumes !== 'boolean') throw new Error('bodyStallResumes must be true or false');
  const rt = src.rejectTokens;
  if (rt !== undefined && !(Array.isArray(rt) && rt.every((t) => typeof t === 'string'))) throw new Error('rejectTokens must be a list of strings');
  const rp = src.requesterPays;
  if (rp !== undefined && !(Array.isArray(rp) && rp.every((b) => typeof b === 'string'))) throw new Error('requesterPays must be a list of bucket names');
  return Object.fromEntries(Object.entries(src).filter(([, v]) => v !== undefined)) as Partial<EmulatorKnobs>;
}

/** mulberry32: tiny, fast, and good enough to make fault sequences reproducible from a seed. */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A body that goes silent after `at` bytes for `ms`, then continues or is reset. */
export interface BodyStall {
  at: number;
  ms: number;
  resumes: boolean;
}

export class Faults {
  private current: EmulatorKnobs;
  private rand: () => number;
  /** The rate limit's token bucket, shared by every client. */
  private tokens = 0;
  private refilledAt = performance.now();

  constructor(initial: Partial<EmulatorKnobs> = {}) {
    this.current = { ...DEFAULT_KNOBS, ...validateKnobs(initial) };
    this.rand = mulberry32(this.current.seed);
  }

  get knobs(): EmulatorKnobs {
    return { ...this.current, failMedia: this.current.failMedia ? { ...this.current.failMedia } : null, rejectTokens: [...this.current.rejectTokens], requesterPays: [...this.current.requesterPays] };
  }

  set(patch: Partial<EmulatorKnobs>): EmulatorKnobs {
    const valid = validateKnobs(patch);
    this.current = { ...this.current, ...valid };
    if (valid.seed !== undefined) this.rand = mulberry32(valid.seed);
    if (valid.rateLimit !== undefined || valid.rateLimitBurst !== undefined) {
      this.tokens = this.burst();
      this.refilledAt = performance.now();
    }
    return this.knobs;
  }

  private burst(): number {
    const k = this.current;
    return k.rateLimitBurst > 0 ? k.rateLimitBurst : Math.max(1, k.rateLimit / 5);
  }

  /** Takes one token of the shared rate limit; false when the bucket is empty (answer 429). */
  takeRateToken(): boolean {
    const limit = this.current.rateLimit;
    if (limit <= 0) return true;
    const t = performance.now();
    this.tokens = Math.min(this.burst(), this.tokens + ((t - this.refilledAt) / 1000) * limit);
    this.refilledAt = t;
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }

  /** Rolls for a silent stretch in a media body of `length` bytes (after any cut fault was rolled). */
  rollStall(length: number): BodyStall | null {
    const k = this.current;
    if (k.bodyStallRate <= 0 || length < 2 || this.rand() >= k.bodyStallRate) return null;
    // Somewhere in the middle half: the client has headers and some bytes, and waits for the rest.
    return { at: Math.floor(length * (0.25 + 0.5 * this.rand())), ms: k.bodyStallMs, resumes: k.bodyStallResumes };
  }

  /**
   * Rolls for a status fault on an API request. Dice are only thrown for knobs that are on, so turning
   * one knob on does not shift the sequence another test relies on.
   */
  rollStatus(): '429' | '503' | null {
    if (this.current.rate429 > 0 && this.rand() < this.current.rate429) return '429';
    if (this.current.rate503 > 0 && this.rand() < this.current.rate503) return '503';
    return null;
  }

  /** Rolls for a reset of an upload chunk of `length` bytes: how many bytes arrive before it (null: none). */
  rollUploadReset(length: number): number | null {
    const k = this.current;
    if (k.uploadResetRate <= 0 || length < 2 || this.rand() >= k.uploadResetRate) return null;
    return Math.floor(length * (0.25 + 0.5 * this.rand()));
  }

  /** Rolls for an upload chunk dropped whole (see uploadDropRate). */
  rollUploadDrop(): boolean {
    const k = this.current;
    return k.uploadDropRate > 0 && this.rand() < k.uploadDropRate;
  }

  /** Rolls for a body fault on a media response of `length` bytes; `cutAt` is how many bytes go out. */
  rollBody(length: number): { fault: 'reset' | 'short'; cutAt: number } | null {
    if (this.current.resetRate > 0 && this.rand() < this.current.resetRate) {
      // Somewhere in the middle half, so the client has clearly started receiving the body.
      return { fault: 'reset', cutAt: Math.floor(length * (0.25 + 0.5 * this.rand())) };
    }
    if (this.current.shortBodyRate > 0 && this.rand() < this.current.shortBodyRate) {
      return { fault: 'short', cutAt: Math.floor(length / 2) };
    }
    return null;
  }
}
