import { promises as fsp, type BigIntStats } from 'node:fs';
import { createServer, request, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Logger } from './logger.js';
import { ensureRuntimeDir } from './runtime-dir.js';

/** What a mount says about itself. */
export interface MountInfo {
  mountPoint: string;
  bucket: string;
  pid: number;
  cacheDir: string | null;
}

/** A warm-up job's progress, streamed to the client one JSON line at a time. */
export interface WarmProgress {
  files: number;
  filesDone: number;
  bytes: number;
  bytesDone: number;
  bytesSkipped: number;
  done: boolean;
  /** The object list is still being read page by page: `files` and `bytes` are the totals so far. */
  listing?: boolean;
  error?: string;
}

export interface ControlHandlers {
  info(): MountInfo;
  stats(): unknown;
  /** Warms `path` (a mount path), reporting progress; stops early when `signal` aborts. */
  warm(path: string, progress: (p: WarmProgress) => void, signal: AbortSignal): Promise<void>;
}

export interface ControlServer {
  /** From now on requests are answered: the mount is up. */
  open(): void;
  close(): Promise<void>;
}

/**
 * The daemon's control socket: HTTP over a Unix socket, readable by its owner only (the folder is 0700,
 * the socket 0600). GET /info, GET /stats, POST /warm?path=... (newline-delimited JSON progress).
 * It listens before the kernel mount (so a failure to listen never leaves a mount behind) but answers
 * 503 until open(): `gcsmount wait` takes an answer to /info as "the mount is up".
 */
export async function startControlServer(socketPath: string, handlers: ControlHandlers, log: Logger): Promise<ControlServer> {
  let answering = false;
  await ensureRuntimeDir();
  // Bound under a name of this process's own, then renamed into place (replacing a socket a killed
  // daemon left): Node removes a Unix socket's bound path when its server closes, and the mount's path
  // may belong to a successor by then (a daemon stopping after a lazy unmount removed the socket of the
  // one mounted on its path since).
  const bound = `${socketPath.replace(/\.sock$/, '')}.${process.pid}`;
  await fsp.rm(bound, { force: true });
  const server: Server = createServer((req, res) => {
    const json = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(`${JSON.stringify(body)}\n`);
    };
    // A request's error is its answer, never the daemon's end: a throw escaping this handler (a warm-up of
    // a mount without a cache dir, a request target URL refuses) ended the process and left the mount dead.
    try {
      route(req, res, json);
    } catch (err) {
      log.warn({ url: req.url, err: String(err) }, 'control request failed');
      if (!res.headersSent) json(400, { error: err instanceof Error ? err.message : String(err) });
      else res.end();
    }
  });
  const route = (req: IncomingMessage, res: ServerResponse, json: (status: number, body: unknown) => void): void => {
    const url = new URL(req.url ?? '/', 'http://control');
    if (!answering) return json(503, { error: 'the mount is not up yet' });
    if (req.method === 'GET' && url.pathname === '/info') return json(200, handlers.info());
    if (req.method === 'GET' && url.pathname === '/stats') return json(200, handlers.stats());
    if (req.method === 'POST' && url.pathname === '/warm') {
      const path = url.searchParams.get('path');
      if (!path) return json(400, { error: 'path is required' });
      const abort = new AbortController();
      res.on('close', () => abort.abort());
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      const send = (p: WarmProgress) => res.writableEnded || res.write(`${JSON.stringify(p)}\n`);
      Promise.resolve()
        .then(() => handlers.warm(path, send, abort.signal))
        .catch((err: Error) => send({ files: 0, filesDone: 0, bytes: 0, bytesDone: 0, bytesSkipped: 0, done: true, error: err.message }))
        .finally(() => res.end());
      return;
    }
    json(404, { error: 'no such endpoint' });
  };
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(bound, resolve);
  });
  await fsp.chmod(bound, 0o600);
  await fsp.rename(bound, socketPath);
  // Ours, by inode and change time (a successor's socket may get the inode number ours had): removed at
  // close only while it is still ours.
  const identity = (st: BigIntStats) => `${st.ino}:${st.ctimeNs}`;
  const own = identity(await fsp.stat(socketPath, { bigint: true }));
  log.debug({ socketPath }, 'control socket listening');
  return {
    open: () => {
      answering = true;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
        void fsp.stat(socketPath, { bigint: true }).then(
          (st) => (identity(st) === own ? fsp.rm(socketPath, { force: true }) : undefined),
          () => undefined,
        );
      }),
  };
}

/** A client request to a control socket: the parsed JSON body, or null when no daemon answers there (yet). */
export function controlRequest<T>(socketPath: string, path: string, method = 'GET', timeoutMs = 5000): Promise<T | null> {
  return new Promise((resolve) => {
    const req = request({ socketPath, path, method, timeout: timeoutMs }, (res: IncomingMessage) => {
      if (res.statusCode !== 200) {
        res.resume();
        resolve(null);
        return;
      }
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => {
        try {
          resolve(JSON.parse(body) as T);
        } catch {
          resolve(null);
        }
      });
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(null));
    req.end();
  });
}
