// Applies one operation sequence to a mount and to a local folder, each through its own op server, and
// reports where the answers or the trees differ. The local folder is the oracle: a kernel file system.
import { seededRandom } from './model-bucket.js';
import { OpServer, comparable, diffSnapshots, type Answer, type TreeSnapshot } from './op-server.js';
import type { WriteOp } from './write-ops.js';

/**
 * Differences a mount may show without being wrong. Each is off unless asked for. Never compared at all:
 * times (the op server reports none). Never generated: hard links, symlinks, permissions. Deliberately
 * not allowable: an rmdir of a directory that is empty locally must succeed on the mount too (a stale
 * listing or a leftover object that keeps it "not empty" is a bug), and unlinked or replaced files must
 * not come back when a handle on them is closed.
 */
export interface Allowances {
  /**
   * gcsfuse renames a directory object by object and refuses beyond --rename-dir-limit (default 0): a
   * directory rename may fail on the mount, with any errno, where it succeeds locally. It is then not
   * applied locally either, so both trees go on alike. A rename that fails half done is still caught:
   * the next snapshot differs.
   */
  dirRenameFails?: boolean;
}

export interface WriteDiffOptions {
  mountRoot: string;
  localRoot: string;
  ops: WriteOp[];
  /** The generator's seed: only reported, so a failing run can be replayed. */
  seed: number;
  /** Called after each operation with both answers; returning false stops the run there. */
  onStep?: (index: number, op: WriteOp, mount: Answer, local: Answer) => void | boolean | Promise<void | boolean>;
  /**
   * The bucket's objects as {name: sha256}. Checked against the local tree after each close that leaves
   * its file with no open handle, and at the end: files only (a `dir/` placeholder is a directory), and
   * only files with no open handle (their object may hold any earlier state).
   */
  bucketSnapshot?: () => Promise<Record<string, string>>;
  allow?: Allowances;
  /** Compare the trees after every close (default) or only after every n-th close, and at the end. */
  snapshotEveryCloses?: number;
  /** Mismatches kept in the report (all are counted). Default 10. */
  keepMismatches?: number;
  /** Follow which states of open files a crash may leave behind (crashModel). Costs local reads. */
  trackCrashStates?: boolean;
  python?: string;
  /** Another op server for the mount side (a test's wrapper that breaks it on purpose). */
  mountServerScript?: string;
  opTimeoutMs?: number;
  /**
   * A second mount of the same bucket (the users' machines share one). The operations then go to one
   * mount at a time: at a point where no handle is open, the other mount takes over with probability
   * `switchRate` (seeded), and every answer it gives must be the local folder's: what one mount closed,
   * the other shows at its next open (both mounts need metadata TTLs of 0 for that, as in gcsfuse). Half
   * the switches (a seeded draw) compare its whole tree first. A handle stays on the mount that opened it.
   */
  otherMountRoot?: string;
  /** Default 0.3. */
  switchRate?: number;
}

export interface Mismatch {
  index: number;
  kind: 'answer' | 'snapshot' | 'bucket' | 'crash';
  op: WriteOp | { op: 'snapshot' | 'bucket' | 'crash' };
  mount?: unknown;
  local?: unknown;
  detail?: string[];
}

export interface WriteDiffReport {
  seed: number;
  steps: number;
  mismatchCount: number;
  mismatches: Mismatch[];
  snapshots: number;
  bucketChecks: number;
  /** Operations where an allowance applied, by allowance. */
  allowed: Record<string, number>;
  /** Operations that failed on both sides alike, by errno: shows the sequence reached its edge cases. */
  errnos: Record<string, number>;
  bytesWritten: number;
  /** Most handles open at once (opens that succeeded locally). */
  maxOpenHandles: number;
  /** Times the other mount took over (otherMountRoot); about half of them after a comparison of its tree. */
  mountSwitches: number;
}

/** What a crash may leave of each path: an exact file, or (a file open at the crash) one of some states. */
export interface CrashModel {
  files: Record<string, { sha: string } | { anyOf: string[] }>;
  dirs: string[];
}

export class WriteDifferential {
  readonly mount: OpServer;
  readonly local: OpServer;
  /** The second mount's server (otherMountRoot), or null. */
  readonly other: OpServer | null;
  /** The mount that operations on paths and new handles go to. */
  private active: OpServer;
  /** Which mount each handle was opened on. */
  private readonly handleMount = new Map<string, OpServer>();
  private readonly switchDraw: () => number;
  private readonly handleIno = new Map<string, number>();
  /** For each open inode: the complete states it had at a point a crash may leave it in. */
  private readonly crashStates = new Map<number, Set<string>>();
  private closes = 0;
  readonly report: WriteDiffReport;

  constructor(private readonly opts: WriteDiffOptions) {
    const common = { ...(opts.python ? { python: opts.python } : {}), ...(opts.opTimeoutMs ? { opTimeoutMs: opts.opTimeoutMs } : {}) };
    const mountServer = (root: string) => new OpServer({ root, ...common, ...(opts.mountServerScript ? { script: opts.mountServerScript } : {}) });
    this.mount = mountServer(opts.mountRoot);
    this.local = new OpServer({ root: opts.localRoot, inodes: true, ...common });
    this.other = opts.otherMountRoot ? mountServer(opts.otherMountRoot) : null;
    this.active = this.mount;
    this.switchDraw = seededRandom(opts.seed ^ 0x2d0c);
    this.report = { seed: opts.seed, steps: 0, mismatchCount: 0, mismatches: [], snapshots: 0, bucketChecks: 0, allowed: {}, errnos: {}, bytesWritten: 0, maxOpenHandles: 0, mountSwitches: 0 };
  }

  /** Which mount operations on paths go to now (for logs). */
  get activeMount(): 'first' | 'second' {
    return this.active === this.mount ? 'first' : 'second';
  }

  /** The mount not in use now, of the two (`other` is the second). */
  private inactive(other: OpServer): OpServer {
    return this.active === this.mount ? other : this.mount;
  }

  /** The mount an operation goes to: its handle's, else the active one. */
  private mountFor(op: WriteOp): OpServer {
    return ('h' in op ? this.handleMount.get(op.h) : undefined) ?? this.active;
  }

  /** At a point with no handle open on either side: maybe the other mount takes over (and maybe its tree is compared). */
  private async maybeSwitch(index: number): Promise<void> {
    if (!this.other || this.handleMount.size > 0 || this.handleIno.size > 0) return;
    if (this.switchDraw() >= (this.opts.switchRate ?? 0.3)) return;
    this.active = this.inactive(this.other);
    this.report.mountSwitches++;
    // Half the time the next operations meet whatever the mount still holds from its last turn; a
    // snapshot would read every file first.
    if (this.switchDraw() < 0.5) await this.compareSnapshots(index);
  }

  private record(m: Mismatch): void {
    this.report.mismatchCount++;
    if (this.report.mismatches.length < (this.opts.keepMismatches ?? 10)) this.report.mismatches.push(m);
  }

  private openInos(): Set<number> {
    return new Set(this.handleIno.values());
  }

  /** Applies op `index` to both sides and compares; returns false when onStep asks to stop. */
  async step(index: number, op: WriteOp): Promise<boolean> {
    this.report.steps++;
    const crash = this.opts.trackCrashStates ?? false;
    if (op.op === 'write' || op.op === 'pwrite') this.report.bytesWritten += op.len;
    if (op.op === 'rename' && this.opts.allow?.dirRenameFails) {
      const src = await this.local.call({ op: 'stat', path: op.src });
      if (src.ok && src.type === 'dir') {
        const m = await this.mountFor(op).call(op);
        if (!m.ok) {
          this.report.allowed.dirRenameFails = (this.report.allowed.dirRenameFails ?? 0) + 1;
          return (await this.opts.onStep?.(index, op, m, { ok: true, skipped: true })) !== false;
        }
        return this.compare(index, op, m, await this.local.call(op));
      }
    }
    // Before an open: what the file held, which is what a crash may leave if this open then changes it.
    const before = crash && op.op === 'open' ? await this.local.call({ op: 'readall', path: op.path }) : null;
    const target = this.mountFor(op);
    const [m, l] = await Promise.all([target.call(op), this.local.call(op)]);
    if (op.op === 'open' && m.ok) {
      // An open only the mount allowed is a difference (compared below); its handle goes at once, or it
      // would stay open to the end, and with it every switch of mounts.
      if (!l.ok) await target.call({ op: 'close', h: op.h });
      else this.handleMount.set(op.h, target);
    }
    if (op.op === 'close') this.handleMount.delete(op.h);
    const wasOpen = this.openInos();
    if (op.op === 'open' && l.ok) {
      this.handleIno.set(op.h, l._ino as number);
      this.report.maxOpenHandles = Math.max(this.report.maxOpenHandles, this.handleIno.size);
    }
    const closedIno = op.op === 'close' ? this.handleIno.get(op.h) : undefined;
    if (op.op === 'close') this.handleIno.delete(op.h);
    if (crash) await this.followCrashStates(op, l, before, wasOpen, closedIno);
    if (!(await this.compare(index, op, m, l))) return false;
    if (op.op === 'close' && ++this.closes % (this.opts.snapshotEveryCloses ?? 1) === 0) {
      const local = await this.compareSnapshots(index);
      if (closedIno !== undefined && !this.openInos().has(closedIno)) await this.compareBucket(index, local);
    }
    await this.maybeSwitch(index);
    return true;
  }

  private async compare(index: number, op: WriteOp, m: Answer, l: Answer): Promise<boolean> {
    const a = comparable(m);
    const b = comparable(l);
    if (m.errno === 'HARNESS' || l.errno === 'HARNESS' || JSON.stringify(a) !== JSON.stringify(b)) {
      this.record({ index, kind: 'answer', op, mount: a, local: b });
    } else if (!l.ok) {
      const key = `${op.op} ${l.errno}`;
      this.report.errnos[key] = (this.report.errnos[key] ?? 0) + 1;
    }
    return (await this.opts.onStep?.(index, op, m, l)) !== false;
  }

  private async followCrashStates(op: WriteOp, l: Answer, before: Answer | null, wasOpen: Set<number>, closedIno: number | undefined): Promise<void> {
    const add = (ino: number, sha: string): void => {
      const s = this.crashStates.get(ino) ?? new Set<string>();
      s.add(sha);
      this.crashStates.set(ino, s);
    };
    const hashOpen = async (ino: number): Promise<void> => {
      const h = [...this.handleIno].find(([, i]) => i === ino)?.[0];
      if (h === undefined) return;
      const a = await this.local.call({ op: 'hashfd', h });
      if (a.ok) add(ino, a.sha as string);
    };
    if (op.op === 'open' && l.ok) {
      const ino = l._ino as number;
      // A new open period: earlier states of this inode were all superseded by a completed close, and
      // what it held just before is the one state a crash may fall back to. An open while others are
      // open starts nothing: what it finds may be dirty, never durable.
      if (wasOpen.has(ino)) return;
      this.crashStates.delete(ino);
      if (before?.ok && before._ino === ino) add(ino, before.sha as string);
    } else if ((op.op === 'fsync' && l.ok) || op.op === 'close') {
      const ino = op.op === 'close' ? closedIno : this.handleIno.get(op.h);
      if (ino === undefined) return;
      if (this.openInos().has(ino)) await hashOpen(ino);
      else this.crashStates.delete(ino);
    } else if ((op.op === 'truncate' || op.op === 'rename') && l.ok && this.openInos().has(l._ino as number)) {
      await hashOpen(l._ino as number);
    }
  }

  /** Compares the active mount's tree with the local one; returns the local one (with inode numbers). */
  async compareSnapshots(index: number): Promise<TreeSnapshot> {
    this.report.snapshots++;
    const [m, l] = await Promise.all([this.active.call({ op: 'snapshot' }), this.local.call({ op: 'snapshot' })]);
    if (!m.ok || !l.ok) {
      this.record({ index, kind: 'snapshot', op: { op: 'snapshot' }, mount: comparable(m), local: comparable(l) });
      return l as unknown as TreeSnapshot;
    }
    const diff = diffSnapshots(m as unknown as TreeSnapshot, l as unknown as TreeSnapshot);
    const which = this.other ? `${this.activeMount} mount: ` : '';
    if (diff.length) this.record({ index, kind: 'snapshot', op: { op: 'snapshot' }, detail: diff.map((d) => which + d) });
    return l as unknown as TreeSnapshot;
  }

  /** The bucket against the local tree, for files with no open handle. */
  async compareBucket(index: number, local: TreeSnapshot): Promise<void> {
    if (!this.opts.bucketSnapshot || !local.files) return;
    this.report.bucketChecks++;
    const objects = await this.opts.bucketSnapshot();
    const open = this.openInos();
    const detail: string[] = [];
    const busy = new Set(Object.entries(local.files).filter(([, f]) => f._ino !== undefined && open.has(f._ino)).map(([p]) => p));
    for (const [p, f] of Object.entries(local.files)) {
      if (busy.has(p)) continue;
      if (objects[p] !== f.sha) detail.push(`${p}: bucket ${objects[p]?.slice(0, 12) ?? 'absent'}, local ${f.sha?.slice(0, 12)}`);
    }
    for (const name of Object.keys(objects)) {
      if (!name.endsWith('/') && !(name in local.files)) detail.push(`${name}: in the bucket, absent locally`);
    }
    if (detail.length) this.record({ index, kind: 'bucket', op: { op: 'bucket' }, detail: detail.slice(0, 20) });
  }

  /** The states a crash now may leave (needs trackCrashStates). */
  async crashModel(): Promise<CrashModel> {
    const l = (await this.local.call({ op: 'snapshot' })) as unknown as TreeSnapshot;
    const open = this.openInos();
    const files: CrashModel['files'] = {};
    for (const [p, f] of Object.entries(l.files)) {
      files[p] = f._ino !== undefined && open.has(f._ino) ? { anyOf: [...(this.crashStates.get(f._ino) ?? [])] } : { sha: f.sha! };
    }
    return { files, dirs: l.dirs };
  }

  /** The last comparisons (trees, bucket), then both servers stop. */
  async finish(): Promise<WriteDiffReport> {
    const local = await this.compareSnapshots(this.report.steps);
    await this.compareBucket(this.report.steps, local);
    // With every handle closed (not so after an early stop), the mount not in use must show the same tree.
    if (this.other && this.handleMount.size === 0 && this.handleIno.size === 0) {
      this.active = this.inactive(this.other);
      await this.compareSnapshots(this.report.steps);
    }
    await this.close();
    return this.report;
  }

  async close(): Promise<void> {
    await Promise.all([this.mount.close(), this.local.close(), this.other?.close()]);
  }

  /** Ends the op servers' processes at once. */
  kill(): void {
    this.mount.kill();
    this.other?.kill();
    this.local.kill();
  }
}

export async function runWriteDifferential(opts: WriteDiffOptions): Promise<WriteDiffReport> {
  const diff = new WriteDifferential(opts);
  try {
    for (let i = 0; i < opts.ops.length; i++) if (!(await diff.step(i, opts.ops[i]!))) break;
    return await diff.finish();
  } finally {
    diff.kill();
  }
}

/**
 * A tree after a crash (a remounted mount's snapshot, or the bucket as {name: sha}) against a CrashModel:
 * files closed before the crash exactly; files open at it absent or in one of their complete states,
 * never partial; directories exactly (mkdir and rmdir complete before they answer).
 */
export function checkAfterCrash(model: CrashModel, after: { files: Record<string, string>; dirs?: string[] }): string[] {
  const out: string[] = [];
  for (const [p, want] of Object.entries(model.files)) {
    const got = after.files[p];
    if ('sha' in want) {
      if (got !== want.sha) out.push(`${p}: closed before the crash, now ${got?.slice(0, 12) ?? 'absent'}, want ${want.sha.slice(0, 12)}`);
    } else if (got !== undefined && !want.anyOf.includes(got)) {
      out.push(`${p}: open at the crash, now ${got.slice(0, 12)}: neither absent nor one of ${want.anyOf.length} complete states`);
    }
  }
  for (const p of Object.keys(after.files)) if (!(p in model.files)) out.push(`${p}: present after the crash, absent in the model`);
  if (after.dirs) {
    const want = new Set(model.dirs);
    const got = new Set(after.dirs);
    for (const d of [...new Set([...want, ...got])].sort()) if (want.has(d) !== got.has(d)) out.push(`dir ${d}: ${got.has(d) ? 'appeared' : 'vanished'} after the crash`);
  }
  return out;
}
