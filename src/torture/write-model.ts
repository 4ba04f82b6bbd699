// What the write generator (write-ops.ts) believes the tree holds, updated by each operation it emits.
import type { OpenFlag, WriteOp } from './write-ops.js';

interface Inode {
  size: number;
}
interface Handle {
  ino: Inode;
  flags: OpenFlag[];
  pos: number;
}

/**
 * A best-effort model of the tree, only to aim operations well (write near the end of a file, read what
 * exists): the runner compares real answers, so where this model is wrong a run is less pointed, not wrong.
 */
export class TreeModel {
  readonly dirs = new Set<string>(['']);
  readonly files = new Map<string, Inode>();
  readonly handles = new Map<string, Handle>();
  private nextHandle = 0;

  newHandleId(): string {
    return `h${this.nextHandle++}`;
  }
  parentOf(p: string): string {
    const i = p.lastIndexOf('/');
    return i < 0 ? '' : p.slice(0, i);
  }
  treeBytes(): number {
    let n = 0;
    for (const f of this.files.values()) n += f.size;
    return n;
  }

  apply(op: WriteOp): void {
    switch (op.op) {
      case 'open': {
        const has = this.files.get(op.path);
        if (this.dirs.has(op.path)) {
          // A directory opens read-only (its reads then fail EISDIR); any other way fails.
          if (op.flags.length === 1 && op.flags[0] === 'rdonly') this.handles.set(op.h, { ino: { size: 0 }, flags: op.flags, pos: 0 });
          return;
        }
        if (!this.dirs.has(this.parentOf(op.path))) return;
        if (has && op.flags.includes('excl') && op.flags.includes('create')) return;
        if (!has && !op.flags.includes('create')) return;
        const ino = has ?? { size: 0 };
        this.files.set(op.path, ino);
        if (op.flags.includes('trunc')) ino.size = 0;
        this.handles.set(op.h, { ino, flags: op.flags, pos: 0 });
        return;
      }
      case 'write':
      case 'pwrite': {
        const h = this.handles.get(op.h);
        if (!h || h.flags.includes('rdonly')) return;
        // Linux appends even a pwrite on an O_APPEND descriptor.
        const at = h.flags.includes('append') ? h.ino.size : (op.off ?? h.pos);
        h.ino.size = Math.max(h.ino.size, at + op.len);
        if (op.op === 'write') h.pos = at + op.len;
        return;
      }
      case 'ftruncate': {
        const h = this.handles.get(op.h);
        if (h && !h.flags.includes('rdonly')) h.ino.size = op.size;
        return;
      }
      case 'truncate': {
        const f = this.files.get(op.path);
        if (f) f.size = op.size;
        return;
      }
      case 'close':
        this.handles.delete(op.h);
        return;
      case 'unlink':
        this.files.delete(op.path);
        return;
      case 'mkdir':
        if (!this.files.has(op.path) && this.dirs.has(this.parentOf(op.path))) this.dirs.add(op.path);
        return;
      case 'rmdir':
        if (!this.childrenOf(op.path).length) this.dirs.delete(op.path);
        return;
      case 'rename':
        this.rename(op.src, op.dst);
        return;
      default:
        return;
    }
  }

  childrenOf(dir: string): string[] {
    const pre = `${dir}/`;
    return [...this.dirs, ...this.files.keys()].filter((p) => p.startsWith(pre));
  }

  private rename(src: string, dst: string): void {
    if (src === dst || !this.dirs.has(this.parentOf(dst))) return;
    const file = this.files.get(src);
    if (file) {
      if (this.dirs.has(dst)) return;
      this.files.delete(src);
      this.files.set(dst, file);
      return;
    }
    if (!this.dirs.has(src) || src === '' || dst.startsWith(`${src}/`) || this.files.has(dst)) return;
    if (this.dirs.has(dst) && this.childrenOf(dst).length) return;
    const move = (p: string): string => (p === src || p.startsWith(`${src}/`) ? dst + p.slice(src.length) : p);
    const dirs = [...this.dirs].map(move);
    const files = [...this.files].map(([p, f]) => [move(p), f] as const);
    this.dirs.clear();
    for (const d of dirs) this.dirs.add(d);
    this.files.clear();
    for (const [p, f] of files) this.files.set(p, f);
  }
}
