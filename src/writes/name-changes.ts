import type { Entry } from '../namespace/entry.js';
import type { NameMapper } from '../namespace/names.js';
import { isGcsError } from '../gcs/errors.js';
import type { ObjectMeta, WritableObjectClient, WrittenObject } from '../gcs/object-client.js';
import type { LocalChanges } from './local-changes.js';
import { guessedContentType } from './kept-attributes.js';
import { deleteObject, moveObject } from './object-moves.js';
import type { OpenReaders } from './open-readers.js';
import { RenameTurns } from './rename-turns.js';
import { RefusedError } from './write-error.js';
import type { WriteState } from './write-state.js';

export interface NameChangesDeps {
  client: WritableObjectClient;
  names: NameMapper;
  changes: LocalChanges;
  /** A folder with more objects than this is not renamed (gcsfuse's --rename-dir-limit): EMFILE. */
  renameDirLimit: number;
}

/** What a name change needs of the files open for writing (Writes holds them). */
export interface OpenFiles {
  /** The files open for writing, by path: a removed name's file leaves it, a renamed one moves in it. */
  readonly states: Map<string, WriteState>;
  /** The read side's open files, once the FUSE layer has set them. */
  readers(): OpenReaders | null;
  /** What `path` is now, as this machine must see it. */
  entryOf(path: string): Promise<Entry | null>;
}

const MOVE_PARALLEL = 16;

/**
 * The changes to the bucket's names (unlink, mkdir, mknod, symlink, rmdir, rename), each recorded in
 * LocalChanges so this machine sees it at once. A file open for writing under a name that goes stops
 * uploading; one under a name that moves goes with it.
 */
export class NameChanges {
  private readonly turns = new RenameTurns();

  constructor(
    private readonly deps: NameChangesDeps,
    private readonly files: OpenFiles,
  ) {}

  /** unlink: the object goes (whatever generation is live, as gcsfuse deletes); an open file of it stops uploading. */
  async removeFile(path: string): Promise<void> {
    const state = this.files.states.get(path);
    const entry = state ? null : await this.files.entryOf(path);
    if (!state && !entry) throw new RefusedError('ENOENT', `${path} does not exist`);
    if (entry?.kind === 'dir') throw new RefusedError('EISDIR', `${path} is a folder`);
    await this.files.readers()?.beforeRemoved(path, state);
    if (state) this.files.states.delete(path);
    try {
      await state?.detach();
      const live = state ? state.liveGeneration : entry?.kind === 'file' ? entry.meta.generation : undefined;
      if (!state || state.inBucket) await deleteObject(this.deps.client, this.deps.names.objectName(path), live !== '0' ? live : undefined);
    } catch (err) {
      if (state) this.putBack(path, state);
      throw err;
    }
    this.deps.changes.set(path, null);
  }

  /**
   * A removal of `path` failed: its file open for writing is the name's again (reattach), unless a new
   * open took the name meanwhile (then that one uploads, and this one's writes were refused ESTALE anyway).
   */
  private putBack(path: string, state: WriteState): void {
    if (this.files.states.has(path)) return;
    state.reattach();
    this.files.states.set(path, state);
  }

  /** mkdir: a placeholder object `dir/`, created only where nothing is (EEXIST otherwise). */
  async makeDir(path: string): Promise<Entry> {
    const existing = await this.files.entryOf(path);
    if (existing) throw new RefusedError('EEXIST', `${path} exists`);
    try {
      await this.deps.client.uploadObject(this.deps.names.dirPrefix(path), Buffer.alloc(0), { ifGenerationMatch: '0' });
    } catch (err) {
      if (isGcsError(err, 'PRECONDITION')) throw new RefusedError('EEXIST', `${path} exists`);
      throw err;
    }
    const entry: Entry = { kind: 'dir', mtimeMs: Date.now() };
    this.deps.changes.set(path, entry);
    return entry;
  }

  /**
   * mknod of a regular file, or symlink (`metadata` names the link's target, gcs/symlinks.ts): an empty
   * object, created only where nothing is (EEXIST otherwise).
   */
  async makeFile(path: string, metadata?: Record<string, string>): Promise<Entry> {
    if (await this.files.entryOf(path)) throw new RefusedError('EEXIST', `${path} exists`);
    try {
      const name = this.deps.names.objectName(path);
      // A content type by the name's extension, as every new object gets one (kept-attributes.ts): the
      // file's later uploads keep what this object has.
      const contentType = guessedContentType(name);
      const object = await this.deps.client.uploadObject(name, Buffer.alloc(0), { ifGenerationMatch: '0', ...(metadata ? { metadata } : {}), ...(contentType ? { contentType } : {}) });
      const entry: Entry = { kind: 'file', meta: object };
      this.deps.changes.set(path, entry);
      return entry;
    } catch (err) {
      if (isGcsError(err, 'PRECONDITION')) throw new RefusedError('EEXIST', `${path} exists`);
      throw err;
    }
  }

  /** rmdir: refused while anything is under the folder (in the bucket, or open here); its placeholder goes. */
  async removeDir(path: string): Promise<void> {
    const entry = await this.files.entryOf(path);
    if (!entry) throw new RefusedError('ENOENT', `${path} does not exist`);
    if (entry.kind !== 'dir') throw new RefusedError('ENOTDIR', `${path} is not a folder`);
    if (this.hasLocalChildren(path)) throw new RefusedError('ENOTEMPTY', `${path} has files open for writing`);
    const prefix = this.deps.names.dirPrefix(path);
    const page = await this.deps.client.list({ prefix, maxResults: 2 });
    if (page.objects.some((o) => o.name !== prefix)) throw new RefusedError('ENOTEMPTY', `${path} is not empty`);
    const placeholder = page.objects.find((o) => o.name === prefix);
    if (placeholder) await deleteObject(this.deps.client, prefix, placeholder.generation);
    this.deps.changes.set(path, null);
  }

  /** rename of a file or a folder (flags: RENAME_NOREPLACE = 1, RENAME_EXCHANGE = 2). Returns the new entry. */
  async rename(from: string, to: string, flags: number): Promise<Entry> {
    if (flags & 2) throw new RefusedError('ESTALE', 'RENAME_EXCHANGE is not supported'); // answered EINVAL by the caller
    for (;;) {
      const first = await this.files.entryOf(from);
      if (!first) throw new RefusedError('ENOENT', `${from} does not exist`);
      const folder = first.kind === 'dir';
      // Looked up again in turn: a folder rename before it may have moved either name.
      const done = await this.turns.run(folder, async () => {
        const source = await this.files.entryOf(from);
        if (!source) throw new RefusedError('ENOENT', `${from} does not exist`);
        if ((source.kind === 'dir') !== folder) return null; // became the other kind meanwhile: the other turn
        const target = await this.files.entryOf(to);
        if (target && flags & 1) throw new RefusedError('EEXIST', `${to} exists`);
        if (source.kind === 'dir') return this.renameDir(from, to, target);
        if (target?.kind === 'dir') throw new RefusedError('EISDIR', `${to} is a folder`);
        return this.renameFile(from, to, source.meta, target);
      });
      if (done) return done;
    }
  }

  // ---------------------------------------------------------------- inside

  private hasLocalChildren(path: string): boolean {
    const prefix = `${path}/`;
    for (const p of this.files.states.keys()) if (p.startsWith(prefix)) return true;
    return false;
  }

  private async renameFile(from: string, to: string, meta: ObjectMeta, target: Entry | null): Promise<Entry> {
    const state = this.files.states.get(from);
    // The file's upload in flight (a close's) lands first, under the name it was started for.
    const release = state ? await state.hold() : null;
    try {
      if (state && this.files.states.get(from) !== state) {
        // Its last close ended while we waited (write, close, rename at once: how a file is saved
        // atomically): the object that close uploaded is what moves. Removed or renamed meanwhile: gone.
        if (state.unlinked || state.path !== from) throw new RefusedError('ENOENT', `${from} was removed meanwhile`);
        // Opened again meanwhile: that file is the one to move.
        if (this.files.states.has(from)) return await this.renameFile(from, to, meta, target);
        const now = await this.files.entryOf(from);
        if (now?.kind !== 'file') throw new RefusedError('ENOENT', `${from} was removed meanwhile`);
        return await this.renameFileNow(from, to, now.meta, target, null);
      }
      return await this.renameFileNow(from, to, meta, target, state ?? null);
    } finally {
      release?.();
    }
  }

  private async renameFileNow(from: string, to: string, meta: ObjectMeta, target: Entry | null, state: WriteState | null): Promise<Entry> {
    const states = this.files.states;
    const replaced = states.get(to);
    if (target?.kind === 'file') await this.files.readers()?.beforeRemoved(to, replaced);
    if (replaced) states.delete(to);
    let moved: WrittenObject | null = null;
    let source: string | null = null;
    let targetGen = '0';
    try {
      await replaced?.detach();
      // After detach(): it waited for the target's close in flight, whose upload is the generation
      // replaced now (read before, the move's precondition named the one that upload replaced: ESTALE).
      targetGen = replaced ? replaced.liveGeneration : target?.kind === 'file' ? target.meta.generation : '0';
      if (state && state.inBucket && !state.liveObject) {
        // A new file renamed over an object earlier: that object is one its close replaces, not its
        // bytes. It goes with the old name (moved along, it became the file's source, and a write past
        // the end showed its bytes where zeros belong); another writer's newer object there stays.
        await this.deps.client.deleteObject(this.deps.names.objectName(from), { ifGenerationMatch: state.liveGeneration }).catch(ignoreGoneOrReplaced);
      } else if (!state || state.inBucket) {
        // An open file moves the generation it knows is live (another writer's object there is theirs:
        // the move is refused, ESTALE); a closed one the generation its entry showed.
        const m = await moveObject(this.deps.client, this.deps.names.objectName(from), this.deps.names.objectName(to), state ? (state.liveObject ?? undefined) : meta, targetGen);
        moved = m.object;
        source = m.source;
      }
    } catch (err) {
      if (replaced) this.putBack(to, replaced);
      throw err;
    }
    // `meta` may be a newer generation than the one readers of `from` are pinned to (replaced behind
    // the mount): they follow only the generation moved.
    if (moved && source !== null) this.files.readers()?.moved(from, to, source, moved);
    this.deps.changes.set(from, null);
    if (state) {
      states.delete(from);
      state.renamed(to, this.deps.names.objectName(to), moved?.generation ?? targetGen, moved);
      states.set(to, state);
      // Shown while the file is open; once it closes, its upload (or the moved object) is what `to` is.
      const entry: Entry = { kind: 'file', meta: moved ?? state.meta() };
      this.deps.changes.set(to, entry);
      return { kind: 'file', meta: state.meta() };
    }
    const entry: Entry = { kind: 'file', meta: moved! };
    this.deps.changes.set(to, entry);
    return entry;
  }

  private movedUnder(from: string, to: string, rel: string, moved: WrittenObject): void {
    noteMoved(this.deps.changes, from, to, rel, moved);
  }

  private async renameDir(from: string, to: string, target: Entry | null): Promise<Entry> {
    const { client, names } = this.deps;
    const states = this.files.states;
    if (target?.kind === 'file') throw new RefusedError('ENOTDIR', `${to} is a file`);
    if (target?.kind === 'dir') {
      const page = await client.list({ prefix: names.dirPrefix(to), maxResults: 2 });
      if (page.objects.some((o) => o.name !== names.dirPrefix(to)) || this.hasLocalChildren(to)) throw new RefusedError('ENOTEMPTY', `${to} is not empty`);
    }
    // Uploads in flight of the folder's open files land first, under the names they were started for.
    const releases = await Promise.all([...states].filter(([p]) => p.startsWith(`${from}/`)).map(([, s]) => s.hold()));
    try {
      return await this.renameDirNow(from, to, target?.kind === 'dir');
    } finally {
      for (const release of releases) release();
    }
  }

  private async renameDirNow(from: string, to: string, replacesDir: boolean): Promise<Entry> {
    const { client, names } = this.deps;
    const states = this.files.states;
    const srcPrefix = names.dirPrefix(from);
    const destPrefix = names.dirPrefix(to);
    const objects: ObjectMeta[] = [];
    let pageToken: string | undefined;
    do {
      const page = await client.list({ prefix: srcPrefix, pageToken, maxResults: 1000 });
      objects.push(...page.objects);
      pageToken = page.nextPageToken ?? undefined;
      if (objects.filter((o) => o.name !== srcPrefix).length > this.deps.renameDirLimit) {
        throw new RefusedError('EMFILE', `${from} holds more than --rename-dir-limit (${this.deps.renameDirLimit}) objects`);
      }
    } while (pageToken);
    const hasPlaceholder = objects.some((o) => o.name === srcPrefix);
    const files = objects.filter((o) => o.name !== srcPrefix);
    if (replacesDir) await deleteObject(client, destPrefix);
    // The new placeholder first and the old one last, so the folder is never missing on either side.
    if (hasPlaceholder || files.length === 0) await client.uploadObject(destPrefix, Buffer.alloc(0), { ifGenerationMatch: '0' }).catch(ignorePrecondition);
    const movedByName = new Map<string, WrittenObject>();
    for (let i = 0; i < files.length; i += MOVE_PARALLEL) {
      await Promise.all(
        files.slice(i, i + MOVE_PARALLEL).map(async (o) => {
          const dest = destPrefix + o.name.slice(srcPrefix.length);
          const { object: moved, source } = await moveObject(client, o.name, dest, o, '0');
          movedByName.set(dest, moved);
          this.movedUnder(from, to, o.name.slice(srcPrefix.length), moved);
          const rel = o.name.slice(srcPrefix.length);
          if (!rel.endsWith('/')) this.files.readers()?.moved(`${from}/${rel}`, `${to}/${rel}`, source, moved);
        }),
      );
    }
    // Files of the folder open for writing here go with it, each now over its moved object (if it had one).
    for (const [path, state] of [...states]) {
      if (!path.startsWith(`${from}/`)) continue;
      const dest = to + path.slice(from.length);
      const moved = movedByName.get(names.objectName(dest)) ?? null;
      states.delete(path);
      state.renamed(dest, names.objectName(dest), moved?.generation ?? '0', moved);
      states.set(dest, state);
    }
    const placeholder = objects.find((o) => o.name === srcPrefix);
    if (placeholder) await deleteObject(client, srcPrefix, placeholder.generation);
    // What this mount recorded below the folder and GCS's listing did not name (a new file renamed into
    // it before its first upload) goes with it. Left at the old path, it showed again, an empty file that
    // was never there, once a folder of that name was made (the write differential, seed 20261210).
    for (const [path, entry] of this.deps.changes.under(from)) {
      this.deps.changes.set(path, null);
      if (entry) this.deps.changes.set(to + path.slice(from.length), entry);
    }
    this.deps.changes.set(from, null);
    const entry: Entry = { kind: 'dir', mtimeMs: Date.now() };
    this.deps.changes.set(to, entry);
    return entry;
  }
}

/** Records one object of a folder rename: it and the sub-folders it implies are gone under `from` and present under `to`. */
function noteMoved(changes: LocalChanges, from: string, to: string, rel: string, moved: WrittenObject): void {
  const isDir = rel.endsWith('/');
  const parts = (isDir ? rel.slice(0, -1) : rel).split('/');
  for (let i = 1; i <= parts.length; i++) {
    const sub = parts.slice(0, i).join('/');
    const leaf = i === parts.length;
    changes.set(`${from}/${sub}`, null);
    changes.set(`${to}/${sub}`, leaf && !isDir ? { kind: 'file', meta: moved } : { kind: 'dir', mtimeMs: moved.updatedMs });
  }
}

function ignorePrecondition(err: unknown): void {
  if (!isGcsError(err, 'PRECONDITION')) throw err;
}

function ignoreGoneOrReplaced(err: unknown): void {
  if (!isGcsError(err, 'PRECONDITION') && !isGcsError(err, 'NOT_FOUND')) throw err;
}
