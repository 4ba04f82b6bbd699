// Streaming reader for uploadType=multipart bodies (multipart/related: JSON metadata part, then media).
// The media part is streamed to a file, so a large upload never sits in memory.
import type { Writable } from 'node:stream';

export class MultipartError extends Error {}

/** Headers plus the JSON part must fit in this much; the media part is unbounded. */
const HEAD_LIMIT = 8 << 20;
const CRLF2 = Buffer.from('\r\n\r\n');

export function boundaryOf(contentType: string | undefined): string | null {
  if (!contentType || !/^multipart\/related\b/i.test(contentType)) return null;
  const m = /;\s*boundary=(?:"([^"]+)"|([^;\s]+))/i.exec(contentType);
  return m ? (m[1] ?? m[2] ?? null) : null;
}

/** Reads the body, writes the media bytes to `out` (not ended here), and returns the metadata. */
export async function readMultipart(body: AsyncIterable<Buffer>, boundary: string, out: Writable): Promise<Record<string, unknown>> {
  const first = Buffer.from(`--${boundary}`);
  const delim = Buffer.from(`\r\n--${boundary}`);
  let state: 'preamble' | 'meta' | 'mediaHead' | 'media' | 'done' = 'preamble';
  let buf: Buffer = Buffer.alloc(0);
  let metadata: Record<string, unknown> = {};

  const write = async (b: Buffer): Promise<void> => {
    if (b.length && !out.write(b)) await new Promise<void>((r) => out.once('drain', r));
  };

  for await (const chunk of body) {
    if (state === 'done') continue;
    buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
    for (;;) {
      if (state === 'preamble') {
        const i = buf.indexOf(first);
        const j = i < 0 ? -1 : buf.indexOf(CRLF2, i + first.length);
        if (j < 0) break;
        buf = buf.subarray(j + CRLF2.length);
        state = 'meta';
      } else if (state === 'meta') {
        const k = buf.indexOf(delim);
        if (k < 0) break;
        metadata = parseMetadata(buf.subarray(0, k));
        buf = buf.subarray(k + delim.length);
        state = 'mediaHead';
      } else if (state === 'mediaHead') {
        if (buf.length >= 2 && buf[0] === 0x2d && buf[1] === 0x2d) throw new MultipartError('Multipart body has no media part.');
        const j = buf.indexOf(CRLF2);
        if (j < 0) break;
        buf = buf.subarray(j + CRLF2.length);
        state = 'media';
      } else if (state === 'media') {
        // The media ends at the next delimiter; hold back enough bytes to see one split across chunks.
        const k = buf.indexOf(delim);
        if (k >= 0) {
          await write(buf.subarray(0, k));
          buf = Buffer.alloc(0);
          state = 'done';
        } else {
          const keep = Math.min(buf.length, delim.length - 1);
          await write(buf.subarray(0, buf.length - keep));
          buf = Buffer.from(buf.subarray(buf.length - keep));
        }
        break;
      } else {
        break;
      }
    }
    if (state !== 'media' && state !== 'done' && buf.length > HEAD_LIMIT) {
      throw new MultipartError('Multipart metadata part is too large.');
    }
  }
  if (state !== 'done') throw new MultipartError('Malformed multipart body: missing closing boundary.');
  return metadata;
}

function parseMetadata(raw: Buffer): Record<string, unknown> {
  if (raw.length === 0) return {};
  let v: unknown;
  try {
    v = JSON.parse(raw.toString('utf8'));
  } catch {
    throw new MultipartError('Metadata part is not valid JSON.');
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new MultipartError('Metadata part must be a JSON object.');
  return v as Record<string, unknown>;
}
