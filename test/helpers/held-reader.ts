import { spawn } from 'node:child_process';
import type { RunResult } from './harness.js';

export interface HeldReader {
  /** Resolves once the reader has printed `opened` (it has the file open and has read what it reads first). */
  opened: Promise<void>;
  /** Lets the reader go on (a line on its stdin). */
  proceed(): void;
  done: Promise<RunResult>;
}

/**
 * A python reader in its own process that holds a file open until told to go on: the script prints
 * `opened` once it holds the file, then blocks on `sys.stdin.readline()`. The test waits for `opened`
 * and says when to go on, where a sleep on either side would race a slow start on a loaded machine.
 */
export function heldReader(script: string, args: string[] = [], timeoutMs = 60_000): HeldReader {
  const child = spawn('/usr/bin/python3', ['-c', script, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });
  const killer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  let stdout = '';
  let stderr = '';
  let markOpened!: () => void;
  let failOpen!: (err: Error) => void;
  const opened = new Promise<void>((resolve, reject) => {
    markOpened = resolve;
    failOpen = reject;
  });
  child.stdout.on('data', (d: Buffer) => {
    stdout += d.toString();
    if (stdout.split('\n').includes('opened')) markOpened();
  });
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const done = new Promise<RunResult>((resolve) => {
    child.on('close', (code) => {
      clearTimeout(killer);
      failOpen(new Error(`the reader exited (${code}) before it opened: ${stderr}`));
      resolve({ code: code ?? 1, stdout, stderr });
    });
  });
  return { opened, proceed: () => child.stdin.end('go\n'), done };
}
