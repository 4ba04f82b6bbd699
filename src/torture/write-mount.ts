import { createHash } from 'node:crypto';
import type { ChildProcess } from 'node:child_process';
import type { Emulator } from '../emulator/server.js';
import { TEMP_DIR as APPEND_TEMP_DIR } from '../writes/append-compose.js';
import { seededRandom } from './model-bucket.js';
import { OpServer, type TreeSnapshot } from './op-server.js';
import { checkAfterCrash, generateWriteOps, runWriteDifferential, WriteDifferential, type WriteDiffReport } from './write-ops.js';

/**
 * The differential write test against a real mount, for the test suite (test/write-mount-differential)
 * and the torture run (`npm run torture`), each bringing its own plumbing (MountPlumbing): seeded
 * random operations applied to the mount and to a local folder, compared after each step; after each
 * close the bucket's objects must equal the local files too.
 *
 * Everything that touches the mount runs in the op-server process: this process hosts the emulator.
 *
 * sigkill: the daemon dies between two operations (never mid-call), at a point after 40-80% of the run
 * where a handle holds writes not yet closed. After `fusermount -u -z` and a remount, each file closed
 * before the kill must be exact (on the mount and in the bucket), each file open at the kill must be
 * absent or one of its complete states (its content before the open, or at an fsync, a close by
 * another handle, a truncate or a rename while open), never partial; directories exact.
 */

/** An emulator serving one bucket (buckets are folders under `root`). */
export interface CaseBucket {
  root: string;
  bucket: string;
  emulator: Emulator;
}

export interface CaseMount {
  path: string;
  /** The daemon process, when mounted with `foreground`. */
  daemon: ChildProcess | null;
}

/** How a caller starts emulators, mounts and unmounts, and owns their clean-up. */
export interface MountPlumbing {
  startBucket(bucket: string): Promise<CaseBucket>;
  mount(req: { tb: CaseBucket; args?: string[]; foreground?: boolean; mountPoint?: string }): Promise<CaseMount>;
  unmount(path: string): Promise<void>;
  tempDir(label: string): Promise<string>;
}

export interface MountCaseOptions {
  seed: number;
  /** Operations. Default 1500. */
  ops?: number;
  /** plain; faults: the emulator injects errors (all must be retried away); sigkill: the daemon is killed part-way. */
  variant?: 'plain' | 'faults' | 'sigkill';
  /**
   * A second mount of the bucket (with a cache dir) takes turns with the first, both with metadata TTLs
   * of 0 (WriteDiffOptions.otherMountRoot). Not with sigkill.
   */
  secondMount?: boolean;
  /** Extra daemon flags. The default raises --rename-dir-limit so directory renames are tried at all. */
  mountArgs?: string[];
  bigWrites?: boolean;
  /**
   * Compare the trees after every Nth close only (default 1): the snapshot after a close gives the
   * daemon time to finish it, which hides races with what follows a close at once (a rename, an open).
   */
  snapshotEveryCloses?: number;
  log?: (line: string) => void;
}

export interface MountCaseResult {
  report: WriteDiffReport;
  /** sigkill only: what the remounted tree and the bucket show that the crash model does not allow. */
  crash?: string[];
  /** sigkill only: the operation before which the daemon died. */
  killedAt?: number;
  tb: CaseBucket;
}

/** Error rates that a daemon must absorb with retries; seeded, so a failure replays. */
export const FAULT_KNOBS = { rate429: 0.05, rate503: 0.03, resetRate: 0.03, shortBodyRate: 0.02, uploadResetRate: 0.05 };

export async function mountDifferentialCase(plumbing: MountPlumbing, opts: MountCaseOptions): Promise<MountCaseResult> {
  const startBucket: MountPlumbing['startBucket'] = (bucket) => plumbing.startBucket(bucket);
  const mount: MountPlumbing['mount'] = (req) => plumbing.mount(req);
  const unmount: MountPlumbing['unmount'] = (path) => plumbing.unmount(path);
  const tempDir: MountPlumbing['tempDir'] = (label) => plumbing.tempDir(label);
  const variant = opts.variant ?? 'plain';
  const tb = await startBucket('wdiff');
  if (variant === 'faults') tb.emulator.setKnobs({ ...FAULT_KNOBS, seed: opts.seed });
  const two = (opts.secondMount ?? false) && variant !== 'sigkill';
  // A mount shows its own changes for as long as its caches may hold what was before them (the longest
  // TTL, the negative one's 5 s included): only with every TTL at 0 does it show the other's at once.
  const args = [...(opts.mountArgs ?? ['--rename-dir-limit', '10000']), ...(two ? ['--metadata-cache-ttl-secs', '0', '--metadata-cache-negative-ttl-secs', '0'] : [])];
  const mounted = await mount({ tb, args, foreground: variant === 'sigkill' });
  const other = two ? await mount({ tb, args: [...args, '--cache-dir', await tempDir('wdiff-cache')] }) : null;
  const localRoot = await tempDir('wdiff-local');
  const ops = generateWriteOps({ seed: opts.seed, count: opts.ops ?? 1500, bigWrites: opts.bigWrites ?? false });
  const bucketSnapshot = emulatorBucketSnapshot(tb);
  const common = {
    mountRoot: mounted.path,
    localRoot,
    ops,
    seed: opts.seed,
    bucketSnapshot,
    // gcsfuse semantics: a directory rename may be refused (rename-dir-limit); nothing else is excused.
    allow: { dirRenameFails: true },
    snapshotEveryCloses: opts.snapshotEveryCloses ?? 1,
    ...(other ? { otherMountRoot: other.path } : {}),
    onStep: (i: number) => {
      if (i % 250 === 0) opts.log?.(`write differential: step ${i}/${ops.length}`);
    },
  };
  if (variant !== 'sigkill') return { report: await runWriteDifferential(common), tb };

  const diff = new WriteDifferential({ ...common, trackCrashStates: true });
  // Somewhere in the middle, at the first point after it where a written handle is still open: a kill
  // with nothing in flight would test only what closes already settled.
  const killFrom = Math.floor(ops.length * (0.4 + 0.4 * seededRandom(opts.seed ^ 0x5eed)()));
  const dirty = new Set<string>();
  let i = 0;
  for (; i < ops.length; i++) {
    const op = ops[i]!;
    await diff.step(i, op);
    if (op.op === 'write' || op.op === 'pwrite' || op.op === 'ftruncate') dirty.add(op.h);
    if (op.op === 'close') dirty.delete(op.h);
    if (i >= killFrom && dirty.size > 0) break;
  }
  const model = await diff.crashModel();
  const exited = new Promise<void>((r) => (mounted.daemon!.exitCode !== null ? r() : mounted.daemon!.once('exit', () => r())));
  mounted.daemon!.kill('SIGKILL');
  await exited;
  // The mount side's descriptors are on a dead connection now; its process just goes.
  diff.mount.kill();
  await diff.local.call({ op: 'closeall' });
  await diff.local.close();
  await unmount(mounted.path);
  const again = await mount({ tb, args, foreground: true, mountPoint: mounted.path });
  const after = new OpServer({ root: again.path });
  const snap = (await after.call({ op: 'snapshot' })) as unknown as TreeSnapshot & { ok: boolean; errno?: string };
  await after.close();
  const crash: string[] = [];
  // A kill between an append's compose and the delete of its tail leaves the tail (swept by a later
  // daemon after 30 minutes: append-compose.ts): an artifact the design allows, not a file of the run's.
  const ours = (p: string): boolean => p === APPEND_TEMP_DIR.slice(0, -1) || p.startsWith(APPEND_TEMP_DIR);
  if (!snap.ok) crash.push(`snapshot of the remounted tree failed: ${snap.errno}`);
  else crash.push(...checkAfterCrash(model, { files: Object.fromEntries(Object.entries(snap.files).filter(([p]) => !ours(p)).map(([p, f]) => [p, f.sha ?? 'not a file'])), dirs: snap.dirs.filter((d) => !ours(d)) }).map((l) => `mount: ${l}`));
  const objects = await bucketSnapshot();
  crash.push(...checkAfterCrash(model, { files: Object.fromEntries(Object.entries(objects).filter(([n]) => !n.endsWith('/') && !ours(n))) }).map((l) => `bucket: ${l}`));
  return { report: diff.report, crash, killedAt: i + 1, tb };
}

/**
 * {objectName: sha256} of every object, through the emulator's JSON API (as a client outside the mount
 * sees the bucket). A (name, generation) already hashed is not downloaded again: a run checks after
 * every close. Injected faults hit these requests too, so each is retried.
 */
export function emulatorBucketSnapshot(tb: CaseBucket): () => Promise<Record<string, string>> {
  const known = new Map<string, string>();
  const base = `${tb.emulator.url}/storage/v1/b/${encodeURIComponent(tb.bucket)}/o`;
  const once = async (): Promise<Record<string, string>> => {
    const out: Record<string, string> = {};
    let pageToken: string | undefined;
    do {
      const q = new URLSearchParams(pageToken ? { pageToken } : {});
      const page = (await retried(async () => {
        const r = await fetch(`${base}?${q}`);
        if (!r.ok) throw new Error(`list: ${r.status}`);
        return r.json();
      })) as { items?: Array<{ name: string; generation: string; size: string }>; nextPageToken?: string };
      for (const it of page.items ?? []) {
        const key = `${it.name}#${it.generation}`;
        let sha = known.get(key);
        if (sha === undefined) {
          sha = await retried(async () => {
            const r = await fetch(`${base}/${encodeURIComponent(it.name)}?alt=media&generation=${it.generation}`);
            if (r.status === 404) throw new Replaced();
            if (!r.ok) throw new Error(`get ${it.name}: ${r.status}`);
            const body = Buffer.from(await r.arrayBuffer());
            // A short body (an injected fault) can end cleanly: only the listed size proves it whole.
            if (body.length !== Number(it.size)) throw new Error(`get ${it.name}: ${body.length} of ${it.size} bytes`);
            return createHash('sha256').update(body).digest('hex');
          });
          known.set(key, sha);
        }
        out[it.name] = sha;
      }
      pageToken = page.nextPageToken;
    } while (pageToken);
    return out;
  };
  return async () => {
    // Between operations nothing should change the bucket; if something did (a late upload), look again.
    for (let n = 1; ; n++) {
      try {
        return await once();
      } catch (e) {
        if (!(e instanceof Replaced) || n >= 5) throw e;
      }
    }
  };
}

/** A listed generation that is gone by the time it is downloaded. */
class Replaced extends Error {}

async function retried<T>(fn: () => Promise<T>, attempts = 20): Promise<T> {
  for (let n = 1; ; n++) {
    try {
      return await fn();
    } catch (e) {
      if (e instanceof Replaced || n >= attempts) throw e;
      await new Promise((r) => setTimeout(r, 20 * n));
    }
  }
}
