// Keep-alive HTTP/1.1 connections of one origin whose reads land where their user says (Node's `onread`:
// libuv reads into the buffer given, as much as the kernel holds, with no stream in between): the
// sockets a download worker receives range bodies on, straight into block memory (raw-range.ts).
import net from 'node:net';
import tls from 'node:tls';

/** What the pool takes of the main client's undici settings (the same meaning as there). */
export interface RawPoolOptions {
  /** Sockets open at most (null or 0: no limit); more requests wait for one. */
  connections?: number | null;
  /** How long an idle socket is kept (the server's Keep-Alive hint, less a second, when shorter). */
  keepAliveTimeout?: number;
  connect?: { timeout?: number | null };
  /** How long a response may be silent, head or body (undici's headersTimeout and bodyTimeout). */
  headersTimeout?: number;
  bodyTimeout?: number;
  /** TLS settings beyond Node's defaults (the system's and NODE_EXTRA_CA_CERTS' CAs): tests' own CA. */
  tls?: tls.ConnectionOptions;
}

/** Bytes of a response head (status line and headers) a socket reads at a time; a longer head is refused. */
export const HEAD_BYTES = 64 * 1024;
/** undici's defaults: connect timeout, and silence of a response. */
const CONNECT_TIMEOUT_MS = 10_000;
const SILENCE_MS = 300_000;

/** What a socket's reads are for while a request has it: where the next read may land, and what landed. */
export interface Reader {
  /** The memory the next read may fill (never empty). */
  next(): Buffer;
  /** `n` bytes landed at the start of the buffer `next()` gave last. */
  landed(n: number): void;
  /** The connection ended (EOF: err null) or failed. */
  ended(err: Error | null): void;
}

/** One connection. `head` is where a response's head is read (and where an idle socket's reads go). */
export class RawSocket {
  readonly head = Buffer.allocUnsafe(HEAD_BYTES);
  socket!: net.Socket;
  reader: Reader | null = null;
  /** Requests this socket has carried: a failure before any answer on a reused one is retried afresh. */
  uses = 0;
  /** When idle: the timer that closes it. */
  idleTimer: NodeJS.Timeout | null = null;
  closed = false;
}

export class RawPool {
  private readonly host: string;
  private readonly port: number;
  private readonly secure: boolean;
  private readonly max: number;
  private readonly keepAliveMs: number;
  private readonly connectMs: number;
  /** How long a response may be silent before its request fails. */
  readonly silenceMs: number;
  /** The Host header's value. */
  readonly hostHeader: string;
  private readonly idle: RawSocket[] = [];
  private readonly waiting: Array<{ resolve: (s: RawSocket) => void; reject: (e: Error) => void }> = [];
  private open = 0;

  constructor(origin: string, private readonly options: RawPoolOptions = {}) {
    const url = new URL(origin);
    this.secure = url.protocol === 'https:';
    if (!this.secure && url.protocol !== 'http:') throw new Error(`raw pool: ${url.protocol} is neither http nor https`);
    this.host = url.hostname.replace(/^\[(.*)\]$/, '$1');
    this.port = Number(url.port) || (this.secure ? 443 : 80);
    this.max = options.connections && options.connections > 0 ? options.connections : Infinity;
    this.keepAliveMs = options.keepAliveTimeout ?? 4_000;
    this.connectMs = options.connect?.timeout ?? CONNECT_TIMEOUT_MS;
    this.silenceMs = Math.max(options.headersTimeout || SILENCE_MS, options.bodyTimeout || SILENCE_MS);
    this.hostHeader = url.host;
  }

  /** A socket for one request: an idle one (newest first), a new one, or the next one given back. */
  acquire(): Promise<RawSocket> {
    for (let s = this.idle.pop(); s; s = this.idle.pop()) {
      if (s.closed) continue;
      if (s.idleTimer) clearTimeout(s.idleTimer);
      s.idleTimer = null;
      return Promise.resolve(s);
    }
    if (this.open < this.max) return this.connect();
    return new Promise((resolve, reject) => this.waiting.push({ resolve, reject }));
  }

  /**
   * The request is done with `s`. `reusable`: its response was read to the last byte and the server
   * keeps the connection; `keepAliveMs`: the server's hint, if it gave one.
   */
  release(s: RawSocket, reusable: boolean, keepAliveMs: number | null = null): void {
    s.reader = null;
    if (!reusable || s.closed) {
      this.destroy(s);
      return;
    }
    const waiter = this.waiting.shift();
    if (waiter) {
      waiter.resolve(s);
      return;
    }
    const ms = Math.max(0, Math.min(this.keepAliveMs, keepAliveMs === null ? Infinity : keepAliveMs - 1_000));
    if (ms <= 0) {
      this.destroy(s);
      return;
    }
    s.idleTimer = setTimeout(() => this.destroy(s), ms);
    s.idleTimer.unref();
    this.idle.push(s);
  }

  /** Closes `s` now: nothing more lands in the memory its reader named (its reader is not told). */
  destroy(s: RawSocket): void {
    s.reader = null;
    if (s.closed) return;
    this.closed(s);
    s.socket.destroy();
  }

  private closed(s: RawSocket): void {
    if (s.closed) return;
    s.closed = true;
    this.open--;
    if (s.idleTimer) clearTimeout(s.idleTimer);
    const at = this.idle.indexOf(s);
    if (at >= 0) this.idle.splice(at, 1);
    // A place freed: the next waiter gets a new connection.
    const waiter = this.open < this.max ? this.waiting.shift() : undefined;
    if (waiter) this.connect().then(waiter.resolve, waiter.reject);
  }

  private connect(): Promise<RawSocket> {
    this.open++;
    return new Promise((resolve, reject) => {
      // The holder exists before its socket: `onread.buffer` is first called while the socket is made.
      const s = new RawSocket();
      const onread = {
        buffer: (): Buffer => (s.reader ? s.reader.next() : s.head),
        callback: (n: number): boolean => {
          if (s.reader) s.reader.landed(n);
          // Bytes nobody asked for (a server that speaks out of turn): the connection cannot be trusted.
          else this.destroy(s);
          return true;
        },
      };
      const base = { host: this.host, port: this.port, onread };
      let socket: net.Socket;
      try {
        socket = this.secure
          ? tls.connect({ ...base, servername: net.isIP(this.host) ? undefined : this.host, ALPNProtocols: ['http/1.1'], ...this.options.tls })
          : net.connect(base);
      } catch (err) {
        // Refused at once (bad options): that place was never taken.
        this.open--;
        reject(err as Error);
        return;
      }
      s.socket = socket;
      const timer = setTimeout(() => socket.destroy(Object.assign(new Error(`connect timeout after ${this.connectMs} ms`), { code: 'UND_ERR_CONNECT_TIMEOUT' })), this.connectMs);
      const gone = (err: Error | null): void => {
        clearTimeout(timer);
        const reader = s.reader;
        s.reader = null;
        this.closed(s);
        socket.destroy();
        reader?.ended(err);
        reject(err ?? Object.assign(new Error('the server closed the connection while it was made'), { code: 'ECONNRESET' }));
      };
      socket.once(this.secure ? 'secureConnect' : 'connect', () => {
        clearTimeout(timer);
        // As undici does; tls.connect does not pass these options on to its socket. Keep-alive probes
        // find a connection a middlebox dropped while idle.
        socket.setNoDelay(true);
        socket.setKeepAlive(true, 60_000);
        resolve(s);
      });
      socket.on('error', (err) => gone(err));
      // The server's end of the connection (allowHalfOpen is off: Node ends ours too).
      socket.on('end', () => gone(null));
      socket.on('close', () => gone(null));
    });
  }
}
