// objects.list semantics: prefix/delimiter collapsing, start/end offsets, and paging in name order.
import { allNamesBelow, compareNames } from './names.js';
import { join } from 'node:path';
import { firstKeyAtOrAfter, type SortedEntry } from './folder-entries.js';
import type { Store } from './store.js';

export interface ListQuery {
  prefix: string;
  delimiter: string | null;
  startOffset: string | null;
  endOffset: string | null;
  includeTrailingDelimiter: boolean;
  maxResults: number;
  after: Cursor | null;
}

/** Position after the last entry of a page. Items sort before a prefix with the same text. */
interface Cursor {
  key: string;
  isPrefix: boolean;
}

export interface ListPage {
  items: { name: string; path: string }[];
  prefixes: string[];
  nextPageToken: string | null;
  /** The page's first and last entries in name order (items and prefixes together); null if empty. */
  first: string | null;
  last: string | null;
}

export class ListQueryError extends Error {}

/** What a walk does with a folder: ignore it, list inside it, or report it as one prefix. */
type DirDecision = 'skip' | 'descend' | 'collapse';

export function parseListQuery(q: URLSearchParams, cap: number): ListQuery {
  let maxResults = cap;
  const mr = q.get('maxResults');
  if (mr !== null) {
    if (!/^\d{1,10}$/.test(mr) || Number(mr) < 1) throw new ListQueryError(`Invalid value for maxResults: ${mr}`);
    maxResults = Math.min(Number(mr), cap);
  }
  const itd = q.get('includeTrailingDelimiter');
  if (itd !== null && itd !== 'true' && itd !== 'false') {
    throw new ListQueryError(`Invalid value for includeTrailingDelimiter: ${itd}`);
  }
  const token = q.get('pageToken');
  return {
    prefix: q.get('prefix') ?? '',
    delimiter: q.get('delimiter') || null,
    startOffset: q.get('startOffset') || null,
    endOffset: q.get('endOffset') || null,
    includeTrailingDelimiter: itd === 'true',
    maxResults,
    after: token ? decodeToken(token) : null,
  };
}

/** Tokens are opaque to clients (as in GCS); they only need to survive a round trip. */
function encodeToken(c: Cursor): string {
  return Buffer.from(JSON.stringify([c.key, c.isPrefix ? 1 : 0]), 'utf8').toString('base64url');
}

function decodeToken(token: string): Cursor {
  try {
    if (!/^[A-Za-z0-9_-]+={0,2}$/.test(token)) throw new Error();
    const v: unknown = JSON.parse(Buffer.from(token, 'base64url').toString('utf8'));
    if (Array.isArray(v) && v.length === 2 && typeof v[0] === 'string' && (v[1] === 0 || v[1] === 1)) {
      return { key: v[0], isPrefix: v[1] === 1 };
    }
  } catch {
    // fall through to the uniform error below
  }
  throw new ListQueryError(`Invalid page token: ${token}`);
}

/**
 * One page, found by walking the bucket folder in name order from the page's lower bound (the prefix,
 * startOffset or page token, whichever is furthest) and stopping once the page is full: each request
 * costs about one page of work, however large the folder (ERA5-style Zarr arrays have 100,000+ chunks
 * in one folder). Side-store names (the few a file cannot hold) are merged in by sorting.
 */
export async function listPage(store: Store, bucket: string, q: ListQuery): Promise<ListPage> {
  const { prefix, delimiter, startOffset: S, endOffset: E, after } = q;
  const inRange = (n: string): boolean =>
    n.startsWith(prefix) &&
    (S === null || compareNames(n, S) >= 0) &&
    (E === null || compareNames(n, E) < 0) &&
    // Anything below the cursor (and every prefix of it) was on an earlier page.
    (after === null || compareNames(n, after.key) >= 0);
  // Names sort at or after this; folders wholly before it are never opened.
  let lower = prefix;
  if (S !== null && compareNames(S, lower) > 0) lower = S;
  if (after !== null && compareNames(after.key, lower) > 0) lower = after.key;

  const decide = (d: string): DirDecision => {
    if (!(d.startsWith(prefix) || prefix.startsWith(d))) return 'skip';
    if (E !== null && compareNames(d, E) >= 0) return 'skip';
    if (allNamesBelow(d, lower)) return 'skip';
    // A whole folder becomes one prefix only if the offsets cannot cut through it.
    const whole = (S === null || compareNames(d, S) >= 0) && (E === null || allNamesBelow(d, E));
    if (delimiter === '/' && d.length > prefix.length && d.startsWith(prefix) && whole) return 'collapse';
    return 'descend';
  };

  const items = new Map<string, string>();
  const prefixes = new Set<string>();
  const add = (name: string, path: string): void => {
    if (delimiter !== null) {
      const rest = name.slice(prefix.length);
      const i = rest.indexOf(delimiter);
      if (i >= 0) {
        const end = i + delimiter.length;
        prefixes.add(prefix + rest.slice(0, end));
        if (!(q.includeTrailingDelimiter && end === rest.length)) return;
      }
    }
    items.set(name, path);
  };
  // Entries found so far; the walk stops past a full page (to know there is more)
  // (two more: the entry at the cursor itself may be counted once again, and the page needs one beyond it).
  const wanted = q.maxResults + 3;
  const found = (): number => items.size + prefixes.size;

  // The names with the prefix are one run in name order: a name after the prefix without it is after all
  // of them, and so is everything after it (a lookup's list in a 100,000-name folder reads its few names,
  // not the rest of the folder).
  const pastPrefix = (key: string): boolean => !key.startsWith(prefix) && compareNames(key, prefix) > 0;

  /** Walks one folder in name order; returns false once the page is full, or the end offset or the prefix is passed. */
  const visit = async (abs: string, rel: string, targets: ReadonlySet<string>): Promise<boolean> => {
    const entries = await store.folders.sorted(abs);
    for (let i = firstAtOrAfter(entries, rel, lower); i < entries.length; i++) {
      const e = entries[i]!;
      const r = await store.folders.resolve(abs, e, targets);
      const name = rel + e.name;
      if (r.kind === 'file') {
        if (E !== null && compareNames(name, E) >= 0) return false;
        if (pastPrefix(name)) return false;
        if (inRange(name)) add(name, join(abs, e.name));
      } else if (r.kind === 'dir' && r.targets) {
        const d = `${name}/`;
        if (E !== null && compareNames(d, E) >= 0) return false;
        if (!prefix.startsWith(d) && pastPrefix(d)) return false;
        const decision = decide(d);
        if (decision === 'descend' && !(await visit(join(abs, e.name), d, r.targets))) return false;
        if (decision === 'collapse') {
          // A folder below a child of the prefix rolls up into that child's prefix.
          const rolled = prefix + d.slice(prefix.length, d.indexOf('/', prefix.length) + 1);
          const fresh = !prefixes.has(rolled) && (after === null || compareCursor({ key: rolled, isPrefix: true }, after) > 0);
          if (fresh && (await store.folders.hasFile(join(abs, e.name), r.targets))) prefixes.add(rolled);
        }
      }
      if (found() >= wanted) return false;
    }
    return true;
  };
  await visit(store.bucketDir(bucket), '', new Set());
  // Side-store entries are added last so they win over a same-named file, matching lookups.
  for (const name of await store.side.names(bucket)) if (inRange(name)) add(name, store.side.objectPath(bucket, name));

  const entries: Cursor[] = [];
  for (const key of items.keys()) entries.push({ key, isPrefix: false });
  for (const key of prefixes) entries.push({ key, isPrefix: true });
  entries.sort(compareCursor);
  const rest = after === null ? entries : entries.filter((e) => compareCursor(e, after) > 0);
  const page = rest.slice(0, q.maxResults);
  const last = page[page.length - 1];
  return {
    items: page.filter((e) => !e.isPrefix).map((e) => ({ name: e.key, path: items.get(e.key)! })),
    prefixes: page.filter((e) => e.isPrefix).map((e) => e.key),
    nextPageToken: rest.length > page.length && last ? encodeToken(last) : null,
    first: page[0]?.key ?? null,
    last: last?.key ?? null,
  };
}

/**
 * The first entry of a sorted folder that can hold a name at or after `lower`: a file or folder key at
 * or after it, or the one folder on `lower`'s own path (its key is a prefix of `lower` and sorts before).
 */
function firstAtOrAfter(entries: readonly SortedEntry[], rel: string, lower: string): number {
  if (compareNames(rel, lower) >= 0 || !lower.startsWith(rel)) return compareNames(rel, lower) >= 0 ? 0 : entries.length;
  const want = lower.slice(rel.length);
  const lo = firstKeyAtOrAfter(entries, want);
  const before = entries[lo - 1];
  return before && before.key.endsWith('/') && want.startsWith(before.key) ? lo - 1 : lo;
}

function compareCursor(a: Cursor, b: Cursor): number {
  return compareNames(a.key, b.key) || Number(a.isPrefix) - Number(b.isPrefix);
}
