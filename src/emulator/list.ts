// objects.list semantics: prefix/delimiter collapsing, start/end offsets, and paging in name order.
import { allNamesBelow, compareNames } from './names.js';
import type { DirDecision, Store } from './store.js';

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
}

export class ListQueryError extends Error {}

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

export async function listPage(store: Store, bucket: string, q: ListQuery): Promise<ListPage> {
  const { prefix, delimiter, startOffset: S, endOffset: E, after } = q;
  const inRange = (n: string): boolean =>
    n.startsWith(prefix) &&
    (S === null || compareNames(n, S) >= 0) &&
    (E === null || compareNames(n, E) < 0) &&
    // Anything below the cursor (and every prefix of it) was on an earlier page.
    (after === null || compareNames(n, after.key) >= 0);

  const decide = (d: string): DirDecision => {
    if (!(d.startsWith(prefix) || prefix.startsWith(d))) return 'skip';
    if (E !== null && compareNames(d, E) >= 0) return 'skip';
    if (S !== null && allNamesBelow(d, S)) return 'skip';
    if (after !== null && allNamesBelow(d, after.key)) return 'skip';
    // A whole folder becomes one prefix only if the offsets cannot cut through it.
    const whole = (S === null || compareNames(d, S) >= 0) && (E === null || allNamesBelow(d, E));
    if (delimiter === '/' && d.length > prefix.length && d.startsWith(prefix) && whole) return 'collapse';
    return 'descend';
  };

  const walked = await store.walk(bucket, decide, inRange);
  const items = new Map<string, string>();
  const prefixes = new Set<string>(walked.collapsed);
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
  for (const o of walked.objects) add(o.name, o.path);
  // Side-store entries are added last so they win over a same-named file, matching lookups.
  for (const name of await store.sideNames(bucket)) if (inRange(name)) add(name, store.sidePath(bucket, name));

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
  };
}

function compareCursor(a: Cursor, b: Cursor): number {
  return compareNames(a.key, b.key) || Number(a.isPrefix) - Number(b.isPrefix);
}
