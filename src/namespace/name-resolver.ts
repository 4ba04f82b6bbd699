import type { ListPage, ListRequest, ObjectClient } from '../gcs/object-client.js';
import type { Entry } from './entry.js';
import { componentProblem, type NameMapper } from './names.js';
import { baseName } from './paths.js';

export interface NameResolverDeps {
  client: ObjectClient;
  names: NameMapper;
  /** Items on the one page a lookup asks for. */
  lookupPageSize: number;
  /** A file hidden by a same-named directory (logged once). */
  hideConflict(objectName: string): void;
}

/** Answers what one name is, file or directory, straight from GCS (no caches). */
export class NameResolver {
  constructor(private readonly deps: NameResolverDeps) {}

  /**
   * One objects.list with prefix=NAME and delimiter='/' answers both questions at once: the object NAME,
   * if it exists, is the very first item (no other name with that prefix sorts before it), and the
   * directory NAME/ shows up among `prefixes` (placeholder or implicit alike). A stat plus a list would
   * cost two requests for the same answer. Only when the page ends before the point where NAME/ would
   * sort (many siblings like NAME.0, NAME-1 in between) does a second, one-item list settle it.
   */
  async resolve(path: string): Promise<Entry | null> {
    const base = baseName(path);
    if (componentProblem(base) !== null) return null;
    const name = this.deps.names.objectName(path);
    const dirPrefix = `${name}/`;
    const page = await this.firstItems({ prefix: name, delimiter: '/', maxResults: this.deps.lookupPageSize });
    const file = page.objects.find((o) => o.name === name) ?? null;
    let isDir = page.prefixes.includes(dirPrefix);
    if (!isDir && !pageReaches(page, dirPrefix)) {
      const more = await this.firstItems({ prefix: dirPrefix, delimiter: '/', maxResults: 1 });
      isDir = more.objects.length > 0 || more.prefixes.length > 0;
    }
    if (isDir) {
      if (file) this.deps.hideConflict(file.name);
      return { kind: 'dir', mtimeMs: null };
    }
    return file ? { kind: 'file', meta: file } : null;
  }

  /**
   * The first page of a list request that holds an item, or says there is none. GCS may answer a page
   * with no items and a token to go on (it skipped many names): taken as it is, that page would make an
   * existing name "missing".
   */
  private async firstItems(req: ListRequest): Promise<ListPage> {
    let page = await this.deps.client.list(req);
    while (page.objects.length === 0 && page.prefixes.length === 0 && page.nextPageToken !== null) {
      page = await this.deps.client.list({ ...req, pageToken: page.nextPageToken });
    }
    return page;
  }
}

/** True when the page shows everything that sorts before `bound` (so its absence from the page is proof). */
function pageReaches(page: ListPage, bound: string): boolean {
  if (page.nextPageToken === null) return true;
  const lastItem = page.objects.at(-1)?.name ?? '';
  const lastPrefix = page.prefixes.at(-1) ?? '';
  const last = lastItem > lastPrefix ? lastItem : lastPrefix;
  return last >= bound;
}
