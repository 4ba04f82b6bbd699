import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { sh, timed, type BenchBucket } from './harness.js';

/**
 * curl uploading to the emulator the bytes the write bench writes through the mount: the ceiling its
 * writes are measured against. Each upload is checked by the HTTP statuses curl saw, so a failed upload
 * cannot pass for a fast one.
 */

/** Throws with curl's output unless its transfers answered `want`, in order. */
function checkCodes(what: string, r: { stdout: string; stderr: string; code: number }, want: string[]): void {
  const got = r.stdout.split('\n').filter(Boolean);
  if (r.code !== 0 || got.length !== want.length || got.some((c, i) => c !== want[i])) {
    throw new Error(`${what}: curl exit ${r.code}, statuses ${got.join(' ')} (wanted ${[...new Set(want)].join('/')}): ${r.stderr.trim()}`);
  }
}

/** A curl config group uploading `file` as the whole object `name` in one request (uploadType=media). */
function mediaGroup(b: BenchBucket, name: string, file: string): string {
  return [
    `url = "${b.emulator.url}/upload/storage/v1/b/${b.bucket}/o?uploadType=media&name=${encodeURIComponent(name)}"`,
    `upload-file = "${file}"`,
    'request = "POST"',
    'header = "Expect:"',
    'header = "Content-Type: application/octet-stream"',
    'output = "/dev/null"',
    'write-out = "%{http_code}\\n"',
  ].join('\n');
}

/** curl uploading `files` as objects `names`, `parallel` at a time in one curl process; the seconds it took. */
export async function curlMedia(b: BenchBucket, names: string[], files: string[], parallel: number, cfg: string): Promise<number> {
  const groups = names.map((n, i) => mediaGroup(b, n, files[i]!));
  await fsp.writeFile(cfg, `${parallel > 1 ? `parallel\nparallel-max = ${parallel}\n` : ''}${groups.join('\nnext\n')}\n`);
  const t = await timed(() => sh('curl', ['-s', '-K', cfg]));
  checkCodes(`media upload of ${names.length} objects, ${parallel} at a time`, t.result, names.map(() => '200'));
  return t.seconds;
}

/**
 * curl sending `chunks` (files, in order) to one resumable session for `name`, as gcsmount streams: the
 * session POST, then a PUT per chunk with `Content-Range: bytes a-b/*` (308), the last with the total.
 * One curl process for the PUTs, so they share a connection.
 */
export async function curlResumable(b: BenchBucket, name: string, chunks: string[], chunkBytes: number, total: number, cfg: string): Promise<number> {
  const t = await timed(async () => {
    const start = await sh('curl', ['-s', '-D', '-', '-o', '/dev/null', '-X', 'POST', '-H', 'Content-Length: 0', `${b.emulator.url}/upload/storage/v1/b/${b.bucket}/o?uploadType=resumable&name=${encodeURIComponent(name)}`]);
    const location = /^location:\s*(\S+)/im.exec(start.stdout)?.[1];
    if (start.code !== 0 || !location) throw new Error(`resumable upload: no session: ${start.stdout} ${start.stderr}`);
    const groups = chunks.map((file, i) => {
      const from = i * chunkBytes;
      const to = Math.min(total, from + chunkBytes) - 1;
      return [
        `url = "${location}"`,
        `upload-file = "${file}"`,
        `header = "Content-Range: bytes ${from}-${to}/${i === chunks.length - 1 ? total : '*'}"`,
        'header = "Expect:"',
        'output = "/dev/null"',
        'write-out = "%{http_code}\\n"',
      ].join('\n');
    });
    await fsp.writeFile(cfg, `${groups.join('\nnext\n')}\n`);
    return sh('curl', ['-s', '-K', cfg]);
  });
  checkCodes('resumable upload', t.result, chunks.map((_, i) => (i === chunks.length - 1 ? '200' : '308')));
  return t.seconds;
}

/** `split` of `file` into pieces of `bytes` under `dir`, their paths in order. */
export async function splitFile(file: string, bytes: number, dir: string): Promise<string[]> {
  await fsp.rm(dir, { recursive: true, force: true });
  await fsp.mkdir(dir);
  const r = await sh('split', ['-b', String(bytes), '-d', '-a', '4', file, join(dir, 'p')]);
  if (r.code !== 0) throw new Error(`split: ${r.stderr}`);
  return (await fsp.readdir(dir)).sort().map((f) => join(dir, f));
}
