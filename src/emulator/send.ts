// Writes response bodies: bandwidth throttling on a timer, backpressure, and deliberate mid-body cuts.
import type { ServerResponse } from 'node:http';
import type { BodyStall } from './faults.js';
import { setTimeout as sleep } from 'node:timers/promises';

export interface BodyCut {
  /** Bytes of body to send before cutting. */
  at: number;
  /** 'reset' sends a TCP RST; 'short' closes cleanly (FIN) so the body is just too short. */
  fault: 'reset' | 'short';
}

export interface SendOptions {
  /** 0 = unlimited. */
  bytesPerSec: number;
  cut: BodyCut | null;
  /** A silent stretch: after `at` bytes nothing is written for `ms` while the connection stays open. */
  stall?: BodyStall | null;
  onBytes: (n: number) => void;
  /** Called just before a cut, while the client cannot yet have seen it. */
  onCut?: () => void;
}

/** 'done': all bytes written, caller ends the response. 'cut': connection cut on purpose. 'closed': peer went away. */
export type SendResult = 'done' | 'cut' | 'closed';

/** Small enough slices that a throttled body flows smoothly instead of in one-second bursts. */
const TICKS_PER_SECOND = 50;

export async function sendBody(res: ServerResponse, source: Buffer | AsyncIterable<Buffer>, opts: SendOptions): Promise<SendResult> {
  const t0 = performance.now();
  const limit = opts.cut ? opts.cut.at : Infinity;
  const slice = opts.bytesPerSec > 0 ? Math.max(1024, Math.floor(opts.bytesPerSec / TICKS_PER_SECOND)) : Infinity;
  let sent = 0;
  const stallAt = opts.stall ? opts.stall.at : Infinity;
  let stalled = false;

  const chunks = Buffer.isBuffer(source) ? [source] : source;
  outer: for await (const chunk of chunks) {
    let off = 0;
    while (off < chunk.length) {
      if (sent >= limit) break outer;
      if (res.destroyed || !res.writable) return 'closed';
      if (!stalled && sent >= stallAt) {
        stalled = true;
        // Like a stuck backend: the socket stays open and quiet; the client decides when to give up.
        await untilClosedOr(res, (done) => setTimeout(done, opts.stall!.ms).unref());
        if (res.destroyed) return 'closed';
        if (!opts.stall!.resumes) {
          opts.onCut?.();
          res.socket?.resetAndDestroy();
          return 'cut';
        }
      }
      const n = Math.min(chunk.length - off, slice, limit - sent, stalled ? Infinity : stallAt - sent);
      if (opts.bytesPerSec > 0) {
        // Never let bytes-sent run ahead of bytes-allowed-by-now, so a body of L bytes takes >= L/rate.
        const due = t0 + ((sent + n) / opts.bytesPerSec) * 1000;
        const wait = due - performance.now();
        if (wait > 0) await sleep(wait);
      }
      const part = chunk.subarray(off, off + n);
      off += n;
      sent += n;
      opts.onBytes(n);
      if (sent >= limit) {
        // The cut must follow the bytes, so wait until they are handed to the kernel.
        await untilClosedOr(res, (done) => res.write(part, () => done()));
        break outer;
      }
      if (!res.write(part)) await drained(res);
    }
  }
  if (!opts.cut) return res.destroyed ? 'closed' : 'done';
  opts.onCut?.();
  await cut(res, opts.cut, sent === 0);
  return 'cut';
}

async function cut(res: ServerResponse, c: BodyCut, nothingWritten: boolean): Promise<void> {
  const socket = res.socket;
  if (!socket || socket.destroyed) return;
  if (nothingWritten) {
    res.flushHeaders();
    await untilClosedOr(res, (done) => socket.write(Buffer.alloc(0), () => done()));
    if (socket.destroyed) return;
  }
  if (c.fault === 'reset') {
    socket.resetAndDestroy();
  } else {
    socket.end();
    // The client should hang up on seeing EOF; do not hold the socket if it does not.
    setTimeout(() => socket.destroy(), 1000).unref();
  }
}

function drained(res: ServerResponse): Promise<void> {
  return untilClosedOr(res, (done) => res.once('drain', done));
}

/** Waits for `start`'s signal, or for the response to close: a vanished peer never drains. */
function untilClosedOr(res: ServerResponse, start: (done: () => void) => void): Promise<void> {
  return new Promise((resolve) => {
    let settled = false;
    const done = (): void => {
      if (settled) return;
      settled = true;
      res.off('close', done);
      res.off('drain', done);
      resolve();
    };
    res.once('close', done);
    if (res.destroyed) done();
    else start(done);
  });
}
