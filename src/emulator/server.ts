// The emulator's HTTP server: routes GCS JSON API paths to handlers, applies fault knobs to them,
// and serves the control routes (/_stats, /_log, /_reset, /_knobs) untouched by faults.
import http from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { promises as fsp } from 'node:fs';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { HttpError, RequestContext, type Shared } from './context.js';
import { Faults, validateKnobs, type EmulatorKnobs } from './faults.js';
import { HashCache } from './hashes.js';
import { getObjectMedia } from './media.js';
import { bucketNameError } from './names.js';
import { deleteObject, getBucket, getObjectMetadata, listBuckets, listObjects } from './objects.js';
import { errorBody } from './resources.js';
import { Stats, type EmulatorStats, type RequestKind, type RequestLogEntry } from './stats.js';
import { Store } from './store.js';
import { Uploads } from './uploads.js';
import { composeObject, copyObject, moveObject, patchObject } from './writes.js';

export type { EmulatorKnobs } from './faults.js';
export type { EmulatorStats, RequestLogEntry, RequestKind } from './stats.js';

export interface EmulatorOptions {
  root: string;
  /** 0 = any free port (the default). */
  port?: number;
  /** Default 127.0.0.1. */
  host?: string;
  knobs?: Partial<EmulatorKnobs>;
  /** Receives one line per API request. */
  log?: (line: string) => void;
}

export interface Emulator {
  /** http://127.0.0.1:PORT */
  url: string;
  port: number;
  setKnobs(k: Partial<EmulatorKnobs>): EmulatorKnobs;
  stats(): EmulatorStats;
  requestLog(): RequestLogEntry[];
  resetStats(): void;
  close(): Promise<void>;
}

interface Route {
  kind: RequestKind;
  bucket: string | null;
  object: string | null;
  run: (ctx: RequestContext) => Promise<void>;
}

export async function startEmulator(opts: EmulatorOptions): Promise<Emulator> {
  const root = path.resolve(opts.root);
  const st = await fsp.stat(root).catch(() => null);
  if (!st?.isDirectory()) throw new Error(`emulator root is not a directory: ${root}`);
  const host = opts.host ?? '127.0.0.1';
  const faults = new Faults(opts.knobs ?? {});
  const stats = new Stats();
  const uploads = new Uploads();
  const shared: Shared = { store: new Store(root), hashes: new HashCache(), faults, baseUrl: '' };

  const server = http.createServer((req, res) => {
    const pathname = (req.url ?? '/').split('?', 1)[0]!;
    const done = pathname.startsWith('/_') ? control(req, res, pathname) : api(req, res);
    done.catch((e: unknown) => {
      opts.log?.(`emulator: unhandled error: ${(e as Error)?.stack ?? String(e)}`);
      if (!res.headersSent) sendPlainJson(res, 500, errorBody(500, 'Internal error'));
      else res.destroy();
    });
  });

  async function api(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const raw = req.url ?? '/';
    const qi = raw.indexOf('?');
    const pathname = qi < 0 ? raw : raw.slice(0, qi);
    const query = new URLSearchParams(qi < 0 ? '' : raw.slice(qi + 1));
    let route: Route;
    try {
      route = resolve(req.method ?? 'GET', pathname, query, uploads);
    } catch (e) {
      const err = e instanceof HttpError ? e : new HttpError(400, String(e));
      route = { kind: 'other', bucket: null, object: null, run: () => Promise.reject(err) };
    }
    const entry = stats.begin(route.kind, req.method ?? 'GET', route.bucket, route.object);
    entry.userProject = query.get('userProject');
    entry.userAgent = req.headers['user-agent'] ?? null;
    const finish = track(res, entry, () => stats.now(), () => {
      stats.finish(entry);
      if (opts.log) {
        const inj = entry.injected ? ` injected=${entry.injected}` : '';
        const dur = (entry.endMs - entry.startMs).toFixed(1);
        opts.log(`${entry.method} ${pathname} ${entry.status} ${entry.bytes}B ${dur}ms${inj}`);
      }
    });
    const ctx = new RequestContext(req, res, query, route.bucket, route.object, entry, faults.knobs, shared, finish);
    try {
      if (ctx.knobs.stall) {
        entry.injected = 'stall';
        // Until the client hangs up: the socket closing is the one signal that always comes.
        await new Promise((resolve) => (req.socket.destroyed ? resolve(undefined) : req.socket.once('close', resolve)));
        if (!res.writableEnded) res.destroy();
        return;
      }
      if (!faults.takeRateToken()) {
        entry.injected = 'throttle';
        const retry = ctx.knobs.retryAfterSeconds;
        await ctx.error(429, 'The rate of requests for this bucket is too high. Please reduce your request rate.', retry === null ? {} : { 'Retry-After': String(retry) });
        return;
      }
      if (ctx.knobs.latencyMs > 0) await sleep(ctx.knobs.latencyMs);
      const token = /^Bearer\s+(\S+)$/i.exec(req.headers.authorization ?? '')?.[1];
      if (token !== undefined && ctx.knobs.rejectTokens.includes(token)) {
        entry.injected = '401';
        await ctx.error(401, 'Invalid Credentials', { 'WWW-Authenticate': 'Bearer realm="https://accounts.google.com/", error="invalid_token"' });
        return;
      }
      // GCS checks the billing of a Requester Pays bucket before the request itself (a missing object
      // still answers this 400); an upload session's own requests were billed when it started.
      if (route.bucket !== null && ctx.knobs.requesterPays.includes(route.bucket) && !query.get('userProject') && !query.has('upload_id')) {
        await ctx.error(400, 'Bucket is a requester pays bucket but no user project provided.', {}, 'required');
        return;
      }
      const injected = faults.rollStatus();
      if (injected) {
        entry.injected = injected;
        const retry = ctx.knobs.retryAfterSeconds;
        const headers = retry === null ? {} : { 'Retry-After': String(retry) };
        if (injected === '429') await ctx.error(429, 'The rate of requests is too high. Please reduce your request rate.', headers);
        else await ctx.error(503, 'Backend Error', headers);
        return;
      }
      await route.run(ctx);
    } catch (e) {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      if (e instanceof HttpError) {
        if (e.status === 304) await ctx.send(304, Buffer.alloc(0), e.headers);
        else await ctx.error(e.status, e.message, e.headers);
        return;
      }
      opts.log?.(`emulator: ${req.method} ${pathname}: ${(e as Error)?.stack ?? String(e)}`);
      await ctx.error(500, `Internal error: ${(e as Error)?.message ?? String(e)}`);
    }
  }

  async function control(req: IncomingMessage, res: ServerResponse, pathname: string): Promise<void> {
    const method = req.method ?? 'GET';
    if (pathname === '/_stats' && method === 'GET') return sendPlainJson(res, 200, stats.snapshot());
    if (pathname === '/_log' && method === 'GET') return sendPlainJson(res, 200, stats.entries());
    if (pathname === '/_reset' && method === 'POST') {
      req.resume();
      stats.reset();
      return sendPlainJson(res, 200, { ok: true });
    }
    if (pathname === '/_knobs' && method === 'GET') return sendPlainJson(res, 200, faults.knobs);
    if (pathname === '/_knobs' && method === 'POST') {
      const chunks: Buffer[] = [];
      for await (const c of req as AsyncIterable<Buffer>) chunks.push(c);
      try {
        const text = Buffer.concat(chunks).toString('utf8');
        return sendPlainJson(res, 200, faults.set(validateKnobs(text.trim() ? JSON.parse(text) : {})));
      } catch (e) {
        return sendPlainJson(res, 400, errorBody(400, `Invalid knobs: ${(e as Error).message}`));
      }
    }
    req.resume();
    sendPlainJson(res, 404, errorBody(404, `No control route ${method} ${pathname}`));
  }

  await new Promise<void>((resolvePromise, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 0, host, () => {
      server.off('error', reject);
      resolvePromise();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
  shared.baseUrl = url;

  return {
    url,
    port,
    setKnobs: (k) => faults.set(k),
    stats: () => stats.snapshot(),
    requestLog: () => stats.entries(),
    resetStats: () => stats.reset(),
    close: async () => {
      const closed = new Promise<void>((r) => server.close(() => r()));
      // Keep-alive and in-flight (e.g. throttled) connections would otherwise hold close() open.
      server.closeAllConnections();
      await closed;
      await uploads.dispose();
    },
  };
}

/** Maps method + path to a handler. Object names are decoded exactly once, from the raw path. */
function resolve(method: string, pathname: string, query: URLSearchParams, uploads: Uploads): Route {
  // Bare /b/... is the JSON API too: with STORAGE_EMULATOR_HOST set, @google-cloud/storage uses that
  // variable as its JSON base URL without appending /storage/v1.
  const api = /^\/(download\/|upload\/)?storage\/v1(\/.*)?$/.exec(pathname) ?? /^()(\/b(?:\/.*)?)$/.exec(pathname);
  const other = (status: number, msg: string): Route => ({
    kind: 'other',
    bucket: null,
    object: null,
    run: () => Promise.reject(new HttpError(status, msg)),
  });
  if (!api) return other(404, `Not Found: ${pathname}`);
  const base = api[1] ?? '';
  const rest = api[2] ?? '';
  if (/^\/b\/?$/.test(rest) && base === '' && method === 'GET') {
    return { kind: 'other', bucket: null, object: null, run: listBuckets };
  }
  const m = /^\/b\/([^/]+)(?:\/o(?:\/(.*))?)?\/?$/.exec(rest);
  if (!m) return other(404, `Not Found: ${pathname}`);
  const bucket = decode(m[1]!);
  const bad = bucketNameError(bucket);
  if (bad) throw new HttpError(400, bad);
  const hasO = /^\/b\/[^/]+\/o(\/|$)/.test(rest);
  if (base === '' && m[2] !== undefined && method === 'POST') {
    const write = writeRoute(bucket, m[2]);
    if (write) return write;
  }
  const object = m[2] !== undefined && m[2] !== '' ? decode(m[2]) : null;
  const isRead = method === 'GET' || method === 'HEAD';

  if (base === 'upload/') {
    if (!hasO || object !== null) return other(404, `Not Found: ${pathname}`);
    return { kind: 'upload', bucket, object: query.get('name'), run: (ctx) => uploads.handle(ctx, bucket) };
  }
  if (base === 'download/') {
    if (object === null || !isRead) return other(404, `Not Found: ${pathname}`);
    return { kind: 'media', bucket, object, run: (ctx) => getObjectMedia(ctx, bucket, object) };
  }
  if (!hasO) {
    if (isRead) return { kind: 'bucket', bucket, object: null, run: (ctx) => getBucket(ctx, bucket) };
    return other(405, `Method ${method} not supported on a bucket by this emulator.`);
  }
  if (object === null) {
    if (isRead) return { kind: 'list', bucket, object: null, run: (ctx) => listObjects(ctx, bucket) };
    return other(405, `Method ${method} not supported on objects by this emulator; use /upload/storage/v1.`);
  }
  if (isRead && query.get('alt') === 'media') {
    return { kind: 'media', bucket, object, run: (ctx) => getObjectMedia(ctx, bucket, object) };
  }
  if (isRead) return { kind: 'metadata', bucket, object, run: (ctx) => getObjectMetadata(ctx, bucket, object) };
  if (method === 'DELETE') return { kind: 'delete', bucket, object, run: (ctx) => deleteObject(ctx, bucket, object) };
  if (method === 'PATCH') return { kind: 'patch', bucket, object, run: (ctx) => patchObject(ctx, bucket, object) };
  return other(405, `Method ${method} not supported on an object by this emulator.`);
}

/**
 * POST routes under an object: copyTo, rewriteTo, moveTo and compose. Read from the raw path, where a
 * '/' inside a name is still %2F, so the verb cannot be confused with part of a name.
 */
function writeRoute(bucket: string, rawObject: string): Route | null {
  const copy = /^([^/]+)\/(copyTo|rewriteTo)\/b\/([^/]+)\/o\/([^/]+)$/.exec(rawObject);
  if (copy) {
    const src = { bucket, name: decode(copy[1]!) };
    const dest = { bucket: decode(copy[3]!), name: decode(copy[4]!) };
    return { kind: 'copy', bucket: dest.bucket, object: dest.name, run: (ctx) => copyObject(ctx, src, dest, copy[2] === 'rewriteTo') };
  }
  const move = /^([^/]+)\/moveTo\/o\/([^/]+)$/.exec(rawObject);
  if (move) {
    const from = decode(move[1]!);
    const to = decode(move[2]!);
    return { kind: 'move', bucket, object: to, run: (ctx) => moveObject(ctx, bucket, from, to) };
  }
  const compose = /^([^/]+)\/compose$/.exec(rawObject);
  if (compose) {
    const dest = decode(compose[1]!);
    return { kind: 'compose', bucket, object: dest, run: (ctx) => composeObject(ctx, bucket, dest) };
  }
  return null;
}

function decode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    throw new HttpError(400, `Invalid percent-encoding in path: ${s}`);
  }
}

/**
 * Records when headers go out and finishes the log entry exactly once: when the response is ended
 * (so a client that has read the whole response always finds it counted) or when the connection
 * closes without an end (cut bodies, clients that hang up).
 */
function track(res: ServerResponse, entry: RequestLogEntry, now: () => number, onFinish: () => void): () => void {
  let finished = false;
  const finish = (): void => {
    if (finished) return;
    finished = true;
    entry.status = res.headersSent ? res.statusCode : 0;
    onFinish();
  };
  const writeHead = res.writeHead as (...args: unknown[]) => ServerResponse;
  res.writeHead = function (this: ServerResponse, ...args: unknown[]) {
    if (entry.firstByteMs === null) entry.firstByteMs = now();
    return writeHead.apply(this, args);
  } as typeof res.writeHead;
  const end = res.end as (...args: unknown[]) => ServerResponse;
  res.end = function (this: ServerResponse, ...args: unknown[]) {
    const r = end.apply(this, args);
    finish();
    return r;
  } as typeof res.end;
  res.once('close', finish);
  return finish;
}

function sendPlainJson(res: ServerResponse, status: number, value: unknown): void {
  const body = Buffer.from(JSON.stringify(value), 'utf8');
  res.writeHead(status, { 'Content-Type': 'application/json; charset=UTF-8', 'Content-Length': body.length });
  res.end(body);
}
