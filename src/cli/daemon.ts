import { spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import { EXIT, UserError, type ExitCode } from './exit.js';
import { timerDelay } from '../units.js';
import { formatDuration } from './values.js';

/** What the foreground daemon tells a parent that started it, over the IPC channel. */
export type DaemonMessage = { type: 'ready'; mountPoint: string } | { type: 'error'; message: string; exitCode: ExitCode };

/** Tells the parent (if any) how start-up went, then lets go of it so the parent can exit. */
export function reportToParent(msg: DaemonMessage): void {
  // A parent gone meanwhile (interrupted while it waited): nobody to tell. disconnect() of a closed
  // channel emits an error nothing handles, which ended a daemon that had just mounted.
  if (!process.send || !process.connected) return;
  process.send(msg, (err: Error | null) => {
    if (!err && msg.type === 'ready' && process.connected) process.disconnect();
  });
}

/**
 * V8 flags for the daemon. Node counts the memory its sockets read into (64 KiB per read, a GiB per GiB
 * downloaded) against the old generation's limit until the next full GC, and with the daemon's small
 * heap (about 22 MB) that limit left room for some 20 MB: a cold read ran a full GC every 20-30 MB
 * (measured: 35-50 per GiB, half the daemon's JavaScript CPU). A floor of 128 MB under the limit leaves
 * the scavenges room to free those buffers first (3 full GCs per GiB); a large heap's limit is above it
 * anyway. Not settable at run time, nor through NODE_OPTIONS: bin/gcsmount's shebang gives it to every
 * gcsmount started from there (a `--foreground` daemon, the systemd unit's), and a daemonised child gets
 * it here whatever started its parent (`node dist/cli/main.js`).
 */
export const DAEMON_NODE_FLAGS = ['--initial-old-space-size=128'];

/** After the child is killed, how long to wait for it to be gone before exiting anyway. */
const KILL_GRACE_MS = 5_000;

/**
 * Starts this same command again in the foreground as a detached child, waits until it has mounted (or
 * failed), and returns the exit code to use: like gcsfuse, `gcsmount BUCKET DIR` returns once the mount
 * answers. The child's start-up errors come back over IPC and are printed here, as one line. The wait
 * is bounded by `startTimeoutMs` (--start-timeout): a child that has not reported by then (a silent
 * endpoint, a wedged system call) is killed, with its process group, and that is one line too.
 */
export async function daemonize(argv: string[], startTimeoutMs: number): Promise<number> {
  const entry = process.argv[1];
  if (!entry) throw new UserError('cannot find the gcsmount entry script to daemonise', EXIT.internal);
  // --foreground before a `--` (after it, it would be a third positional argument: exit 2).
  const end = argv.indexOf('--');
  const args = end < 0 ? [...argv, '--foreground'] : [...argv.slice(0, end), '--foreground', ...argv.slice(end)];
  const child = spawn(process.execPath, [...DAEMON_NODE_FLAGS, entry, ...args], {
    detached: true,
    stdio: ['ignore', 'ignore', 'ignore', 'ipc'],
    env: { ...process.env, GCSMOUNT_DAEMONIZED: '1' },
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const deadline = Date.now() + startTimeoutMs;
  let timer: NodeJS.Timeout | undefined;
  let interrupted: NodeJS.Signals | null = null;
  const listeners = new Map<NodeJS.Signals, () => void>();
  const outcome = await new Promise<DaemonMessage | 'timeout'>((resolve) => {
    timer = setTimeout(() => resolve('timeout'), timerDelay(startTimeoutMs));
    // Interrupted while waiting (Ctrl-C, a stop): the start is called off, its daemon with it. Left
    // running, the daemon mounted after this command had said it failed.
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
      const listener = (): void => {
        interrupted = signal;
        resolve('timeout');
      };
      listeners.set(signal, listener);
      process.once(signal, listener);
    }
    child.on('message', (m: DaemonMessage) => resolve(m));
    child.on('exit', (code, signal) =>
      resolve({ type: 'error', message: `the daemon exited during start-up (${signal ?? `code ${code}`}); run with --foreground to see why`, exitCode: EXIT.internal }),
    );
    child.on('error', (err) => resolve({ type: 'error', message: `cannot start the daemon: ${err.message}`, exitCode: EXIT.internal }));
  });
  clearTimeout(timer);
  for (const [signal, listener] of listeners) process.off(signal, listener);
  const giveUp = async (): Promise<never> => {
    // SIGKILL: a child stuck in start-up defers SIGTERM until it has mounted, which is what never came.
    try {
      process.kill(-child.pid!, 'SIGKILL');
    } catch {
      child.kill('SIGKILL');
    }
    await Promise.race([exited, new Promise((r) => setTimeout(r, KILL_GRACE_MS).unref())]);
    if (child.connected) child.disconnect();
    if (interrupted) throw new UserError(`interrupted (${interrupted}) while the daemon was starting; stopped it`, EXIT.internal);
    throw new UserError(
      `the daemon did not finish mounting within ${formatDuration(startTimeoutMs)} (--start-timeout); stopped it. Run with --foreground to see where it waits`,
      EXIT.internal,
    );
  };
  if (outcome === 'timeout') return giveUp();
  if (outcome.type === 'error') throw new UserError(outcome.message, outcome.exitCode);
  // The mount answered in the daemon; prove it from here, a separate process, before saying so (within
  // the same bound: a daemon that mounted and then wedged must not hang this stat either).
  let statTimer: NodeJS.Timeout | undefined;
  const answered = await Promise.race([
    fsp.stat(outcome.mountPoint).then(() => true),
    new Promise<false>((r) => (statTimer = setTimeout(() => r(false), timerDelay(deadline - Date.now())))),
  ]);
  clearTimeout(statTimer);
  if (!answered) return giveUp();
  child.unref();
  child.disconnect?.();
  return EXIT.ok;
}
