import { describe, expect, it } from 'vitest';
import { DEFAULT_REPORTED_SIZES } from '../src/fs/handles.js';
import { OP, type FuseAddon, type FuseRequest } from '../src/fs/kernel.js';
import { createOperations, type OperationDeps } from '../src/fs/operations.js';
import type { Namespace } from '../src/namespace/namespace.js';
import { silentLogger } from '../src/observe/logger.js';
import { Metrics } from '../src/observe/metrics.js';

/**
 * The kernel takes no OPENDIR answer once its connection is aborted (the request is gone), and then
 * sends no RELEASEDIR: the folder handle must not stay behind. Driven without a mount, because only an
 * abort makes the kernel refuse an open (a signal, even SIGKILL, waits for the answer and releases).
 */
describe('open folder handles', () => {
  const operations = (openResult: () => number) => {
    const metrics = new Metrics();
    const fuse = { replyOpen: () => openResult(), replyErr: () => undefined } as unknown as FuseAddon;
    const deps = {
      fuse,
      namespace: { observe: () => undefined } as unknown as Namespace,
      attributes: { uid: 0, gid: 0, fileMode: 0o644, dirMode: 0o755, mountTimeMs: 0 },
      reportedSizes: DEFAULT_REPORTED_SIZES,
      timeouts: { entrySec: 1, attrSec: 1, negativeSec: 1, listCacheMs: 0 },
      log: silentLogger,
      metrics,
    } as unknown as OperationDeps;
    const { onRequest } = createOperations(deps);
    const req = () => ({}) as FuseRequest;
    return { onRequest, req, open: () => metrics.snapshot().gauges.open_dirs };
  };

  it('keeps a handle the kernel took until RELEASEDIR', () => {
    const ops = operations(() => 0);
    ops.onRequest(OP.OPENDIR, ops.req(), 1, 0, 0, 0, undefined, 0);
    expect(ops.open()).toBe(1);
    ops.onRequest(OP.RELEASEDIR, ops.req(), 1, 1, 0, 0, undefined, 0);
    expect(ops.open()).toBe(0);
  });

  it('answers FLUSH and FSYNC of a read handle with success, with or without writes (kernels before 5.16 flush at every close)', () => {
    const replies: number[] = [];
    const metrics = new Metrics();
    const fuse = { replyOpen: () => 0, replyErr: (_req: unknown, err: number) => void replies.push(err) } as unknown as FuseAddon;
    const deps = { fuse, namespace: { observe: () => undefined } as unknown as Namespace, attributes: { uid: 0, gid: 0, fileMode: 0o644, dirMode: 0o755, mountTimeMs: 0 }, reportedSizes: DEFAULT_REPORTED_SIZES, timeouts: { entrySec: 1, attrSec: 1, negativeSec: 1, listCacheMs: 0 }, log: silentLogger, metrics } as unknown as OperationDeps;
    const { onRequest } = createOperations(deps); // no writes: -o ro
    onRequest(OP.FLUSH, {} as FuseRequest, 2, 7, 0, 0, undefined, 0);
    onRequest(OP.FSYNC, {} as FuseRequest, 2, 7, 0, 0, undefined, 0);
    expect(replies).toEqual([0, 0]); // EROFS before
  });

  it('drops the handle of an OPENDIR whose answer the kernel did not take', () => {
    const ops = operations(() => -2); // -ENOENT: the request is no longer there
    for (let i = 0; i < 3; i++) ops.onRequest(OP.OPENDIR, ops.req(), 1, 0, 0, 0, undefined, 0);
    expect(ops.open()).toBe(0);
  });
});
