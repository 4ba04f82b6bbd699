// HTTP/1.1 as a download worker's range reader speaks it (raw-exchange.ts): the request's bytes and the
// response head's parts, parsed as RFC 9112 says, no more than media ranges need.
import { GcsError } from './errors.js';

/** The response cannot be read here (its framing): nothing of it landed; undici may read it. */
export class RawFramingError extends Error {}

export type Headers = Record<string, string | string[]>;

/** Parses a response head (status line and header lines, without the blank line); null if it is not HTTP/1.x. */
export function parseHead(text: string): { status: number; headers: Headers; http10: boolean } | null {
  const lines = text.split('\r\n');
  const m = /^HTTP\/1\.([01]) (\d{3})(?: |$)/.exec(lines[0] ?? '');
  if (!m) return null;
  const headers: Headers = {};
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i]!;
    const colon = line.indexOf(':');
    if (colon <= 0) return null;
    const name = line.slice(0, colon).trim().toLowerCase();
    const value = line.slice(colon + 1).trim();
    const had = headers[name];
    headers[name] = had === undefined ? value : Array.isArray(had) ? [...had, value] : [had, value];
  }
  return { status: Number(m[2]), headers, http10: m[1] === '0' };
}

/**
 * A Content-Length to frame a body by: undefined when there is none, null when it cannot be trusted
 * (not all digits, or copies that differ: RFC 9112 says such a message's framing is unknown).
 */
export function contentLength(v: string | string[] | undefined): number | null | undefined {
  if (v === undefined) return undefined;
  const all = Array.isArray(v) ? v : [v];
  return all.every((x) => /^\d{1,15}$/.test(x) && Number(x) === Number(all[0])) ? Number(all[0]) : null;
}

export const one = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);

/** The Keep-Alive header's timeout, in milliseconds, when the server gives one. */
export function keepAliveHint(headers: Headers): number | null {
  const m = /timeout=(\d+)/i.exec(one(headers['keep-alive']) ?? '');
  return m ? Number(m[1]) * 1000 : null;
}

/** The request's bytes; header values come from gcsmount itself, but a line break in one would split the request. */
export function requestBytes(host: string, path: string, headers: Record<string, string>): Buffer {
  let text = `GET ${path} HTTP/1.1\r\nhost: ${host}\r\n`;
  for (const [k, v] of Object.entries(headers)) {
    if (/[\r\n]/.test(k) || /[\r\n]/.test(v)) throw new GcsError('INVALID', `header ${k} holds a line break`);
    text += `${k}: ${v}\r\n`;
  }
  return Buffer.from(`${text}\r\n`, 'latin1');
}

/** A chunked error body's text without its chunk-size lines (best effort: it only goes into a message). */
export function dechunk(text: string): string {
  return text.replace(/(^|\r\n)[0-9a-fA-F]+(;[^\r\n]*)?\r\n/g, '$1').replace(/\r\n$/, '');
}
