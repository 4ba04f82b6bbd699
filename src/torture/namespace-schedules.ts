import { compareNames } from '../name-order.js';
import { MetadataCache } from '../namespace/metadata-cache.js';
import { NameMapper } from '../namespace/names.js';
import { Namespace } from '../namespace/namespace.js';
import { OnceLog, silentLogger } from '../observe/logger.js';
import { Metrics } from '../observe/metrics.js';
import { ModelBucket, seededRandom } from './model-bucket.js';

/**
 * Seeded random schedules of concurrent lookups and readdirs against the namespace, over a model bucket
 * that answers in any order, with objects replaced, created and deleted meanwhile and the clock jumping
 * past TTLs. Every answer is checked against what the model can prove:
 * - a name that exists throughout (a "stable" one: created before, never deleted) is never missing,
 *   and is a directory exactly when the model has names under it;
 * - a name that never existed is never found;
 * - a listing shows each name once, in GCS's order, every stable name of the folder, no name that never
 *   existed there, and a file's generation is one the name had.
 * Names that come and go ("volatile") may be answered either way within the TTLs, so only the last rule
 * holds for them.
 */

export interface ScheduleViolation {
  seed: number;
  op: string;
  problem: string;
}

export interface SchedulesReport {
  schedules: number;
  operations: number;
  requests: number;
  violations: ScheduleViolation[];
}

const NEGATIVE_TTL_MS = 5_000;
const TTL_MS = 60_000;

interface Shape {
  /** Every name the schedule may ask about, with what it is at the start. */
  stableFiles: Set<string>;
  stableDirs: Set<string>;
  /** Names (files and dirs, as paths without the leading '/') that exist at some time. */
  everFiles: Set<string>;
  everDirs: Set<string>;
  volatile: string[];
  /** Paths asked about that never exist. */
  missing: string[];
  generations: Map<string, Set<string>>;
}

/** Builds the bucket: Zarr-like nested chunk folders, a flat folder of many names, and awkward names. */
function populate(bucket: ModelBucket, random: () => number): Shape {
  const shape: Shape = { stableFiles: new Set(), stableDirs: new Set(), everFiles: new Set(), everDirs: new Set(), volatile: [], missing: [], generations: new Map() };
  const add = (name: string, stable: boolean) => {
    const meta = bucket.put(name);
    shape.generations.set(name, new Set([meta.generation]));
    if (stable) shape.stableFiles.add(name);
    else shape.volatile.push(name);
  };
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)]!;
  for (const v of ['t2m', 'u10'].slice(0, 1 + Math.floor(random() * 2))) {
    add(`store/${v}/zarr.json`, true);
    const nt = 2 + Math.floor(random() * 12);
    const ny = 1 + Math.floor(random() * 4);
    const nx = 1 + Math.floor(random() * 4);
    for (let t = 0; t < nt; t++) for (let y = 0; y < ny; y++) for (let x = 0; x < nx; x++) if (random() < 0.85) add(`store/${v}/c/${t}/${y}/${x}`, random() < 0.9);
  }
  add('store/zarr.json', true);
  const flat = 20 + Math.floor(random() * 200);
  for (let i = 0; i < flat; i++) add(`flat/c.${Math.floor(i / 10)}.${i % 10}`, random() < 0.9);
  for (const name of ['x', 'x.0', 'x-1', 'x!', 'x/', 'x/child', 'y/', 'y/z/', 'y/z/deep', 'a b', 'a/b/c/d/e']) if (random() < 0.8) add(name, true);
  // Names the schedule asks about that must never be found.
  for (let i = 0; i < 10; i++) shape.missing.push(pick(['store/t2m/c/99', 'store/t2m/c/0/9/9', 'flat/c.99.9', 'flat/d', 'nothing', 'x.9', 'y/zz', 'store/q', 'a/b/c/x', 'flat/c.0.0/x']));
  for (const n of shape.missing) if (bucket.has(n)) shape.missing.splice(shape.missing.indexOf(n), 1);
  // Volatile names are created and deleted later, alongside the stable ones of their folders.
  for (let i = 0; i < 6; i++) shape.volatile.push(`flat/c.${Math.floor(random() * 30)}.v${i}`, `store/t2m/c/${Math.floor(random() * 14)}/v${i}`);
  survey(bucket, shape);
  return shape;
}

/** Adds each folder above `name` ('a' and 'a/b' for 'a/b/c') to `into`. */
function addFoldersAbove(into: Set<string>, name: string): void {
  const parts = name.split('/');
  for (let k = 1; k < parts.length; k++) into.add(parts.slice(0, k).join('/'));
}

/** Adds `name`, and the folders above it, to the names that ever existed. */
function existed(shape: Shape, name: string): void {
  if (!name.endsWith('/')) shape.everFiles.add(name);
  addFoldersAbove(shape.everDirs, name);
}

/**
 * Which names and folders are stable, and which existed, once the bucket is built. Later, only a put adds
 * to what existed (a delete never takes from it), and the stable files never change: each change adds
 * its one name (recomputing all of it after every change was a quarter of the schedules' time).
 */
function survey(bucket: ModelBucket, shape: Shape): void {
  for (const name of bucket.objectNames) existed(shape, name);
  for (const name of shape.stableFiles) addFoldersAbove(shape.stableDirs, name);
}

/** Runs `count` schedules from `firstSeed` on; each is independent and replayable by its seed. */
export async function runNamespaceSchedules(opts: { firstSeed: number; count: number; actors?: number; opsPerActor?: number }): Promise<SchedulesReport> {
  const report: SchedulesReport = { schedules: 0, operations: 0, requests: 0, violations: [] };
  for (let k = 0; k < opts.count; k++) {
    const seed = opts.firstSeed + k;
    const one = await runSchedule(seed, opts.actors ?? 6, opts.opsPerActor ?? 25);
    report.schedules++;
    report.operations += one.operations;
    report.requests += one.requests;
    report.violations.push(...one.violations);
  }
  return report;
}

export async function runSchedule(seed: number, actors: number, opsPerActor: number): Promise<{ operations: number; requests: number; violations: ScheduleViolation[] }> {
  const random = seededRandom(seed);
  const bucket = new ModelBucket(random, { maxTurns: 1 + Math.floor(random() * 6), shortPages: random() < 0.5 ? 0.15 : 0 });
  const shape = populate(bucket, random);
  let now = 1_000_000;
  const clock = { now: () => now };
  const smallBudget = random() < 0.3;
  const metrics = new Metrics();
  const cache = new MetadataCache(
    {
      ttl: { kind: 'ms', ms: TTL_MS },
      negativeTtl: { kind: 'ms', ms: NEGATIVE_TTL_MS },
      statBudget: smallBudget ? { kind: 'bytes', bytes: 6_000 + Math.floor(random() * 20_000) } : { kind: 'unlimited' },
      typeBudget: { kind: 'unlimited' },
      clock,
    },
    metrics,
  );
  const ns = new Namespace({
    client: bucket,
    names: new NameMapper(null),
    cache,
    listTtlMs: TTL_MS,
    prefetch: { enabled: random() < 0.85, entriesLimit: random() < 0.2 ? 5 + Math.floor(random() * 40) : Number.POSITIVE_INFINITY, maxWorkers: 1 + Math.floor(random() * 6) },
    once: new OnceLog(silentLogger),
    metrics,
    pageSizes: { lookup: 2 + Math.floor(random() * 5), list: 3 + Math.floor(random() * 8) },
  });
  const violations: ScheduleViolation[] = [];
  let operations = 0;
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)]!;
  const stableFiles = [...shape.stableFiles].filter((n) => !n.endsWith('/'));
  const stableDirs = [...shape.stableDirs];
  const fail = (op: string, problem: string) => violations.push({ seed, op, problem });

  const lookup = async (path: string) => {
    const entry = await ns.lookup(`/${path}`);
    const op = `lookup ${path}`;
    if (shape.stableDirs.has(path)) {
      if (entry?.kind !== 'dir') fail(op, `a directory that exists throughout answered ${entry ? entry.kind : 'missing'}`);
    } else if (shape.stableFiles.has(path)) {
      if (entry?.kind !== 'file') fail(op, `a file that exists throughout answered ${entry ? entry.kind : 'missing'}`);
    } else if (!shape.everFiles.has(path) && !shape.everDirs.has(path)) {
      if (entry !== null) fail(op, `a name that never existed answered ${entry.kind}`);
    }
    if (entry?.kind === 'file' && !shape.generations.get(path)?.has(entry.meta.generation)) fail(op, `generation ${entry.meta.generation} never existed`);
  };

  const readdir = async (dir: string) => {
    const listing = await ns.readdir(dir === '' ? '/' : `/${dir}`);
    const op = `readdir ${dir || '/'}`;
    const names: string[] = [];
    const keys: string[] = [];
    listing.forEachName((name, isDir) => {
      names.push(name);
      keys.push(isDir ? `${name}/` : name);
    });
    const seen = new Set<string>();
    for (let i = 0; i < names.length; i++) {
      const name = names[i]!;
      if (seen.has(name)) fail(op, `${name} listed twice`);
      seen.add(name);
      if (i > 0 && compareNames(keys[i - 1]!, keys[i]!) > 0) fail(op, `${keys[i - 1]} listed before ${keys[i]}`);
      const path = dir === '' ? name : `${dir}/${name}`;
      if (!shape.everFiles.has(path) && !shape.everDirs.has(path)) fail(op, `${name} never existed`);
      const entry = listing.get(name);
      if (entry?.kind === 'file' && !shape.generations.get(path)?.has(entry.meta.generation)) fail(op, `${name}: generation ${entry.meta.generation} never existed`);
    }
    const prefix = dir === '' ? '' : `${dir}/`;
    for (const p of [...shape.stableFiles, ...shape.stableDirs]) {
      if (!p.startsWith(prefix) || p.slice(prefix.length).includes('/') || p === prefix.slice(0, -1)) continue;
      if (p.endsWith('/')) continue;
      if (!seen.has(p.slice(prefix.length))) fail(op, `${p.slice(prefix.length)} exists throughout but is not listed`);
    }
  };

  const change = () => {
    const name = pick(shape.volatile);
    const r = random();
    if (r < 0.4 && bucket.has(name)) bucket.delete(name);
    else {
      const meta = bucket.put(name);
      const gens = shape.generations.get(name) ?? new Set<string>();
      gens.add(meta.generation);
      shape.generations.set(name, gens);
      existed(shape, name);
    }
    // Stable files are replaced too: a new generation, never a gap.
    if (random() < 0.3) {
      const s = pick(stableFiles);
      shape.generations.get(s)!.add(bucket.put(s).generation);
    }
  };

  const pathPool = (): string => {
    const r = random();
    if (r < 0.45) return pick(stableFiles);
    if (r < 0.7) return pick(stableDirs);
    if (r < 0.85) return pick(shape.volatile);
    return pick(shape.missing);
  };

  const actor = async () => {
    for (let k = 0; k < opsPerActor; k++) {
      const r = random();
      operations++;
      try {
        if (r < 0.6) await lookup(pathPool());
        else if (r < 0.85) await readdir(random() < 0.1 ? '' : pick(stableDirs));
        else if (r < 0.93) change();
        else now += Math.floor(random() * (random() < 0.5 ? NEGATIVE_TTL_MS * 2 : TTL_MS * 1.5));
      } catch (err) {
        fail('any', `threw ${(err as Error).message}`);
      }
    }
  };
  await Promise.all(Array.from({ length: actors }, actor));
  return { operations, requests: bucket.requests, violations };
}
