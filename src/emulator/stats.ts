// Request log and counters, so tests and benchmarks can see exactly what a client asked for.
import type { InjectedFault } from './faults.js';

export type RequestKind = 'bucket' | 'list' | 'metadata' | 'media' | 'upload' | 'delete' | 'patch' | 'copy' | 'compose' | 'move' | 'other';

export interface RequestLogEntry {
  /** Order of arrival. */
  seq: number;
  kind: RequestKind;
  method: string;
  bucket: string | null;
  object: string | null;
  /**
   * The byte range a media request asked for (resolved against the size), or an upload chunk sent (as
   * its Content-Range said), inclusive; null if none.
   */
  range: { start: number; end: number } | null;
  /** For a request to a resumable session: bytes the session held when it was answered (or cut). */
  committed: number | null;
  /** The project the request billed (its `userProject`), or null. */
  userProject: string | null;
  /** Its User-Agent header, or null. */
  userAgent: string | null;
  /** 0 if the connection ended before a status was sent. */
  status: number;
  injected: InjectedFault | null;
  /** Milliseconds since the emulator started (performance.now()). */
  startMs: number;
  /** When the status line and headers were written; null if they never were. */
  firstByteMs: number | null;
  endMs: number;
  /** Response body bytes written. */
  bytes: number;
  /** What a list request asked and got: tests see which names each page returned, not only how many pages. */
  list: ListLogEntry | null;
}

export interface ListLogEntry {
  prefix: string;
  delimiter: string | null;
  startOffset: string | null;
  endOffset: string | null;
  /** Whether it went on with a page token. */
  token: boolean;
  /** Items and prefixes returned. */
  count: number;
  /** The first and last of them in name order (a page is one run of the listing): null if none. */
  first: string | null;
  last: string | null;
}

export interface EmulatorStats {
  requests: Record<'total' | RequestKind, number>;
  byStatus: Record<string, number>;
  injected: Record<InjectedFault, number>;
  /** Body bytes written by media responses. */
  mediaBytes: number;
}

const MAX_LOG = 100_000;
const KINDS: RequestKind[] = ['bucket', 'list', 'metadata', 'media', 'upload', 'delete', 'patch', 'copy', 'compose', 'move', 'other'];

export class Stats {
  private readonly t0 = performance.now();
  private seq = 0;
  private log: RequestLogEntry[] = [];
  private counts = emptyCounts();

  now(): number {
    return performance.now() - this.t0;
  }

  begin(kind: RequestKind, method: string, bucket: string | null, object: string | null): RequestLogEntry {
    return {
      seq: ++this.seq,
      kind,
      method,
      bucket,
      object,
      range: null,
      committed: null,
      userProject: null,
      userAgent: null,
      status: 0,
      injected: null,
      startMs: this.now(),
      firstByteMs: null,
      endMs: 0,
      bytes: 0,
      list: null,
    };
  }

  /** Called once per request, when the response is ended or the connection is gone. */
  finish(e: RequestLogEntry): void {
    e.endMs = this.now();
    const c = this.counts;
    c.requests.total++;
    c.requests[e.kind]++;
    c.byStatus[String(e.status)] = (c.byStatus[String(e.status)] ?? 0) + 1;
    if (e.injected) c.injected[e.injected]++;
    if (e.kind === 'media') c.mediaBytes += e.bytes;
    this.log.push(e);
    // Trim in batches: shifting one entry per request off a 100,000-entry array is quadratic.
    if (this.log.length > MAX_LOG + MAX_LOG / 10) this.log = this.log.slice(-MAX_LOG);
  }

  snapshot(): EmulatorStats {
    const c = this.counts;
    return { requests: { ...c.requests }, byStatus: { ...c.byStatus }, injected: { ...c.injected }, mediaBytes: c.mediaBytes };
  }

  /** Completed requests, oldest first by arrival, at most the last 100,000. */
  entries(): RequestLogEntry[] {
    return this.log
      .slice(-MAX_LOG)
      .map((e) => ({ ...e, range: e.range ? { ...e.range } : null, list: e.list ? { ...e.list } : null }))
      .sort((a, b) => a.seq - b.seq);
  }

  reset(): void {
    this.log = [];
    this.counts = emptyCounts();
  }
}

function emptyCounts(): EmulatorStats {
  const requests = { total: 0 } as Record<'total' | RequestKind, number>;
  for (const k of KINDS) requests[k] = 0;
  return { requests, byStatus: {}, injected: { '401': 0, '403': 0, '429': 0, '503': 0, reset: 0, short: 0, stall: 0, throttle: 0, 'body-stall': 0, 'upload-drop': 0 }, mediaBytes: 0 };
}
