// A client of test/fixtures/fs_op_server.py: one python process per root, one JSON line per operation.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/** Resolves from src/torture (vitest) and from dist/torture alike. */
export const OP_SERVER_SCRIPT = fileURLToPath(new URL('../../test/fixtures/fs_op_server.py', import.meta.url));

export interface Answer {
  ok: boolean;
  errno?: string;
  [key: string]: unknown;
}

export interface OpServerOptions {
  root: string;
  /** Report local inode numbers (`_ino`): for the local side only. */
  inodes?: boolean;
  python?: string;
  script?: string;
  /** An operation unanswered this long fails the run (a wedged mount must not hang it). Default 180 s. */
  opTimeoutMs?: number;
}

export class OpServer {
  private readonly child: ChildProcessWithoutNullStreams;
  private readonly waiting: Array<{ resolve: (a: Answer) => void; reject: (e: Error) => void }> = [];
  private stderr = '';
  private exited: Error | null = null;
  /** Calls are answered in order; this chains them so a caller may fire several without interleaving. */
  private tail: Promise<unknown> = Promise.resolve();

  constructor(private readonly opts: OpServerOptions) {
    const args = [opts.script ?? OP_SERVER_SCRIPT, opts.root, ...(opts.inodes ? ['--inodes'] : [])];
    this.child = spawn(opts.python ?? '/usr/bin/python3', args, { stdio: ['pipe', 'pipe', 'pipe'] });
    this.child.stderr.on('data', (d: Buffer) => (this.stderr = (this.stderr + d.toString()).slice(-4000)));
    createInterface({ input: this.child.stdout }).on('line', (line) => {
      const w = this.waiting.shift();
      if (!w) return;
      try {
        w.resolve(JSON.parse(line) as Answer);
      } catch (e) {
        w.reject(new Error(`op server (${opts.root}) answered non-JSON: ${line.slice(0, 200)}`));
      }
    });
    // Writes to a dead server's stdin fail with EPIPE; the exit below already says what happened.
    this.child.stdin.on('error', () => undefined);
    this.child.on('exit', (code, signal) => {
      this.exited = new Error(`op server (${opts.root}) exited (${code ?? signal}): ${this.stderr}`);
      for (const w of this.waiting.splice(0)) w.reject(this.exited);
    });
  }

  call(op: object): Promise<Answer> {
    const next = this.tail.then(() => this.send(op));
    this.tail = next.catch(() => undefined);
    return next;
  }

  private send(op: object): Promise<Answer> {
    if (this.exited) return Promise.reject(this.exited);
    const timeoutMs = this.opts.opTimeoutMs ?? 180_000;
    return new Promise<Answer>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`op server (${this.opts.root}): no answer in ${timeoutMs} ms to ${JSON.stringify(op)}`)), timeoutMs);
      this.waiting.push({
        resolve: (a) => (clearTimeout(timer), resolve(a)),
        reject: (e) => (clearTimeout(timer), reject(e)),
      });
      this.child.stdin.write(`${JSON.stringify(op)}\n`);
    });
  }

  /** Closes stdin and waits for the exit; SIGKILL if it does not come (a server stuck on a dead mount). */
  async close(graceMs = 10_000): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const gone = new Promise<void>((r) => this.child.once('exit', () => r()));
    this.child.stdin.end();
    const timer = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    await gone;
    clearTimeout(timer);
  }

  kill(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
  }
}

/** An answer without its '_' keys (local inode numbers), for comparison. */
export function comparable(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(comparable);
  if (v === null || typeof v !== 'object') return v;
  return Object.fromEntries(Object.entries(v as Record<string, unknown>).filter(([k]) => !k.startsWith('_')).map(([k, x]) => [k, comparable(x)]));
}

export interface TreeSnapshot {
  files: Record<string, { sha?: string; size?: number; type?: string; _ino?: number }>;
  dirs: string[];
}

/** What differs between two snapshots, one line per path, at most `limit` lines. */
export function diffSnapshots(mount: TreeSnapshot, local: TreeSnapshot, limit = 20): string[] {
  const out: string[] = [];
  const show = (e: TreeSnapshot['files'][string] | undefined): string => (e ? (e.sha ? `${e.size}B ${e.sha.slice(0, 12)}` : JSON.stringify(comparable(e))) : 'absent');
  for (const p of [...new Set([...Object.keys(mount.files), ...Object.keys(local.files)])].sort()) {
    const a = mount.files[p];
    const b = local.files[p];
    if (JSON.stringify(comparable(a)) !== JSON.stringify(comparable(b))) out.push(`file ${p}: mount ${show(a)}, local ${show(b)}`);
  }
  const md = new Set(mount.dirs);
  const ld = new Set(local.dirs);
  for (const d of [...new Set([...md, ...ld])].sort()) if (md.has(d) !== ld.has(d)) out.push(`dir ${d}: ${md.has(d) ? 'only on the mount' : 'only local'}`);
  return out.slice(0, limit);
}
