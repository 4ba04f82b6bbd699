import { SingleBar } from 'cli-progress';
import { request } from 'node:http';
import { relative, resolve } from 'node:path';
import type { WarmProgress } from '../observe/control-server.js';
import { canonicalMountPoint, controlSocketFor } from '../observe/runtime-dir.js';
import { EXIT, UserError } from './exit.js';
import { formatBytes } from './format.js';

const USAGE = 'usage: gcsmount warm MOUNTPOINT PATH...';

/** Streams one warm-up job's progress lines from the daemon; resolves with the last one. */
function warmOne(socketPath: string, mountPath: string, onProgress: (p: WarmProgress) => void, signal: AbortSignal): Promise<WarmProgress | null> {
  return new Promise((done, fail) => {
    const req = request({ socketPath, path: `/warm?path=${encodeURIComponent(mountPath)}`, method: 'POST', signal }, (res) => {
      let buffered = '';
      let last: WarmProgress | null = null;
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        buffered += chunk;
        let nl: number;
        while ((nl = buffered.indexOf('\n')) >= 0) {
          const line = buffered.slice(0, nl);
          buffered = buffered.slice(nl + 1);
          if (!line) continue;
          last = JSON.parse(line) as WarmProgress;
          onProgress(last);
        }
      });
      res.on('end', () => done(last));
      res.on('error', () => done(last));
    });
    req.on('error', (err) => (signal.aborted ? done(null) : fail(err)));
    req.end();
  });
}

/**
 * `gcsmount warm MOUNTPOINT PATH...`: the daemon downloads every block of every object under the paths
 * into its disk cache, skipping blocks already there; this shows progress (a bar on a terminal, plain
 * lines otherwise). Ctrl-C stops the job; running it again picks up where it stopped.
 */
export async function runWarm(args: string[]): Promise<number> {
  const [mountPoint, ...paths] = args;
  if (!mountPoint || paths.length === 0 || args.some((a) => a.startsWith('-'))) throw new UserError(USAGE, EXIT.usage);
  const root = resolve(mountPoint);
  const realRoot = await canonicalMountPoint(root);
  const socketPath = await controlSocketFor(root);
  const abort = new AbortController();
  process.once('SIGINT', () => abort.abort());
  const tty = process.stderr.isTTY;
  for (const p of paths) {
    const abs = resolve(root, p);
    // PATH may be spelled through the mountpoint as given, through its real path, or through a symlink.
    const candidates = [relative(root, abs), relative(realRoot, abs)];
    if (candidates.every((r) => r.startsWith('..'))) candidates.push(relative(realRoot, await canonicalMountPoint(abs)));
    const rel = candidates.find((r) => !r.startsWith('..')) ?? '..';
    if (rel.startsWith('..')) throw new UserError(`${p} is not under ${mountPoint}`, EXIT.usage);
    const mountPath = `/${rel}`;
    const started = performance.now();
    const bar = tty ? new SingleBar({ format: `${mountPath} [{bar}] {percentage}% | {files} files | {done} of {total} | {rate}/s | ETA {eta_formatted}`, hideCursor: true }) : null;
    let lastLine = 0;
    const show = (w: WarmProgress) => {
      const secs = (performance.now() - started) / 1000;
      const rate = formatBytes(secs > 0 ? w.bytesDone / secs : 0);
      const payload = { files: `${w.filesDone}/${w.files}${w.listing ? '+' : ''}`, done: formatBytes(w.bytesDone + w.bytesSkipped), total: formatBytes(w.bytes), rate };
      if (bar) {
        if (!bar.isActive) bar.start(Math.max(1, w.bytes), 0, payload);
        // The daemon lists while it downloads: the total grows until the list is read.
        bar.setTotal(Math.max(1, w.bytes));
        bar.update(w.bytesDone + w.bytesSkipped, payload);
      } else if ((w.done && !w.error) || performance.now() - lastLine > 2000) {
        lastLine = performance.now();
        process.stderr.write(`${mountPath}: ${payload.files} files, ${payload.done} of ${payload.total} (${formatBytes(w.bytesSkipped)} already cached), ${rate}/s\n`);
      }
    };
    const last = await warmOne(socketPath, mountPath, show, abort.signal).catch((err: NodeJS.ErrnoException) => {
      bar?.stop();
      if (err.code === 'ENOENT' || err.code === 'ECONNREFUSED') throw new UserError(`no gcsmount daemon answers for ${mountPoint}`, EXIT.mountPoint);
      throw err;
    });
    bar?.stop();
    if (abort.signal.aborted) {
      process.stderr.write('interrupted: run the same command again to continue where it stopped\n');
      return 130;
    }
    if (last?.error) throw new UserError(`warm ${mountPath}: ${last.error}`, EXIT.internal);
    if (!last?.done) throw new UserError(`warm ${mountPath}: the daemon stopped before the end`, EXIT.internal);
    process.stdout.write(`${mountPath}: ${last.files} files, ${formatBytes(last.bytesDone)} downloaded, ${formatBytes(last.bytesSkipped)} already cached\n`);
  }
  return EXIT.ok;
}
