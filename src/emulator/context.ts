// What a route handler gets: the parsed request, shared state, and reply helpers that honour the
// bandwidth knob and record body bytes in the request log.
import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { EmulatorKnobs, Faults } from './faults.js';
import { FieldsError, parseFields, project, type FieldTree } from './fields.js';
import type { HashCache } from './hashes.js';
import { errorBody } from './resources.js';
import { sendBody } from './send.js';
import type { RequestLogEntry } from './stats.js';
import type { Store } from './store.js';

export interface Shared {
  store: Store;
  hashes: HashCache;
  faults: Faults;
  /** http://127.0.0.1:PORT, for selfLink, mediaLink and upload session URIs. */
  baseUrl: string;
}

export class RequestContext {
  constructor(
    readonly req: IncomingMessage,
    readonly res: ServerResponse,
    readonly query: URLSearchParams,
    readonly bucket: string | null,
    readonly object: string | null,
    readonly entry: RequestLogEntry,
    /** Snapshot taken when the request arrived, so one response sees one consistent knob set. */
    readonly knobs: EmulatorKnobs,
    readonly shared: Shared,
    /** Completes the log entry now; for a deliberately cut body, whose socket may close much later. */
    readonly finish: () => void,
  ) {}

  /** Writes a complete response; the body is throttled like any other. */
  async send(status: number, body: Buffer, headers: OutgoingHttpHeaders = {}): Promise<void> {
    // HTTP forbids Content-Length on 204 and 304 (and they carry no body).
    const noBody = status === 204 || status === 304;
    this.res.writeHead(status, noBody ? headers : { 'Content-Length': body.length, ...headers });
    if (this.req.method === 'HEAD' || noBody || body.length === 0) {
      this.res.end();
      return;
    }
    const r = await sendBody(this.res, body, {
      bytesPerSec: this.knobs.bandwidthBytesPerSec,
      cut: null,
      onBytes: (n) => (this.entry.bytes += n),
    });
    if (r === 'done') this.res.end();
  }

  json(status: number, value: unknown, headers: OutgoingHttpHeaders = {}): Promise<void> {
    const body = Buffer.from(JSON.stringify(value), 'utf8');
    return this.send(status, body, {
      'Content-Type': 'application/json; charset=UTF-8',
      'Cache-Control': 'no-cache, no-store, max-age=0, must-revalidate',
      ...headers,
    });
  }

  /** `reason` defaults to the status's usual one (resources.ts REASONS). */
  error(status: number, message: string, headers: OutgoingHttpHeaders = {}, reason?: string): Promise<void> {
    return this.json(status, errorBody(status, message, reason), headers);
  }

  /** The `fields` selection, or null for everything; a syntax error becomes a thrown HttpError(400). */
  fields(): FieldTree | null {
    const f = this.query.get('fields');
    if (f === null || f === '') return null;
    try {
      return parseFields(f);
    } catch (e) {
      if (e instanceof FieldsError) throw new HttpError(400, e.message);
      throw e;
    }
  }

  /** Sends `value` projected through `fields`. */
  projected(value: unknown, tree: FieldTree | null, headers: OutgoingHttpHeaders = {}): Promise<void> {
    return this.json(200, project(value, tree), headers);
  }
}

/** Thrown by handlers to answer with a GCS-shaped error. */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly headers: OutgoingHttpHeaders = {},
  ) {
    super(message);
  }
}
