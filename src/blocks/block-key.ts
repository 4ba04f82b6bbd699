import { hash } from 'node:crypto';

/** Which block of which generation of which object, cut at which block size. */
export interface BlockKey {
  bucket: string;
  object: string;
  generation: string;
  block: number;
  /**
   * Part of the key because block N means different bytes at different sizes, and a size check alone
   * cannot tell (block 1 of 12 MiB is bytes 4-8 MiB at 4 MiB blocks, 8-12 MiB at 8 MiB: both 4 MiB long).
   */
  blockSize: number;
}

export function blockFileKey(k: BlockKey): string {
  const name = `${k.bucket}\0${k.object}\0${k.generation}\0${k.blockSize}\0${k.block}`;
  let key = recentKeys.get(name);
  if (key === undefined) {
    // crypto.hash: one call, no Hash object (createHash was 2% of a cold GiB's main thread).
    key = hash('sha256', name, 'hex').slice(0, 32);
    if (recentKeys.size >= RECENT_KEYS) recentKeys.clear();
    recentKeys.set(name, key);
  }
  return key;
}

/**
 * Keys of the blocks asked about lately: one block is looked up, written and looked up again within
 * moments (about five hashes per cold chunk file, each a crypto object: ~40 ms per 1,000 files on the
 * main thread). Forgotten all at once when full: cheaper than an LRU, and a miss only costs a hash.
 */
const recentKeys = new Map<string, string>();
const RECENT_KEYS = 16_384;
