// Google API partial responses: the `fields` query parameter, e.g.
// `items(name,size,generation),prefixes,nextPageToken` or `items/name,kind`.

/** A selection: each key maps to its sub-selection, or `null` for "the whole value". */
export type FieldTree = Map<string, FieldTree | null>;

export class FieldsError extends Error {}

/** Parses the fields syntax: comma lists, `a/b` paths, nested parentheses, `*` wildcards. */
export function parseFields(text: string): FieldTree {
  let pos = 0;
  const peek = (): string | undefined => text[pos];
  const fail = (what: string): never => {
    throw new FieldsError(`Invalid field selection ${text}: ${what} at offset ${pos}`);
  };

  const list = (): FieldTree => {
    const tree: FieldTree = new Map();
    for (;;) {
      field(tree);
      if (peek() !== ',') return tree;
      pos++;
    }
  };

  const name = (): string => {
    const m = /^(?:\*|[A-Za-z0-9_$.-]+)/.exec(text.slice(pos));
    if (!m) fail('expected a field name');
    pos += m![0].length;
    return m![0];
  };

  const field = (into: FieldTree): void => {
    const path = [name()];
    while (peek() === '/') {
      pos++;
      path.push(name());
    }
    let sub: FieldTree | null = null;
    if (peek() === '(') {
      pos++;
      sub = list();
      if (peek() !== ')') fail("expected ')'");
      pos++;
    }
    for (let i = path.length - 1; i > 0; i--) sub = new Map([[path[i]!, sub]]);
    merge(into, path[0]!, sub);
  };

  const tree = list();
  if (pos !== text.length) fail('unexpected character');
  return tree;
}

function merge(into: FieldTree, key: string, sub: FieldTree | null): void {
  if (!into.has(key)) {
    into.set(key, sub);
    return;
  }
  const have = into.get(key)!;
  if (have === null || sub === null) {
    into.set(key, null);
    return;
  }
  for (const [k, v] of sub) merge(have, k, v);
}

/** Applies a selection to a JSON value; arrays apply it to each element. */
export function project(value: unknown, tree: FieldTree | null): unknown {
  if (tree === null) return value;
  if (Array.isArray(value)) return value.map((v) => project(v, tree));
  if (value === null || typeof value !== 'object') return value;
  const src = value as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  const star = tree.get('*');
  if (star !== undefined) {
    for (const k of Object.keys(src)) out[k] = project(src[k], star);
  }
  for (const [k, sub] of tree) {
    if (k === '*' || !(k in src)) continue;
    out[k] = project(src[k], sub);
  }
  return out;
}

/** Whether the selection includes the value at `path` (so the server must compute it). */
export function selects(tree: FieldTree | null, path: string[]): boolean {
  let t: FieldTree | null = tree;
  for (const seg of path) {
    if (t === null) return true;
    const next: FieldTree | null | undefined = t.has(seg) ? t.get(seg) : t.get('*');
    if (next === undefined) return false;
    t = next;
  }
  return true;
}
