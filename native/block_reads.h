// The native read path: reads of blocks already on disk, answered without JavaScript.
#pragma once
#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>
#include <stddef.h>
#include <stdint.h>

#define BR_KEY_LEN 32 // a block file's name: 32 hex digits (see blockFileKey in src/blocks/disk-cache.ts)

// Why a read went back to JavaScript; keep in step with FALLBACK in src/fs/kernel.ts.
enum br_reason {
  BR_OK = 0,
  BR_MISSING = 1, // the block file is gone (ENOENT and the like) or the disk fails it (EIO)
  BR_SHORT = 2,   // it holds fewer bytes than the block
  BR_CORRUPT = 3, // its bytes fail the CRC32C the index holds
  BR_BUSY = 4,    // no block memory free (every slot in use): nothing wrong with the block
  BR_UNAVAILABLE = 5, // the file could not be read just now (EMFILE, ENFILE, ENOMEM, EAGAIN, EACCES...):
                      // nothing known to be wrong with the block, which stays
  BR_NOT_LANDED = 6,  // a block it waited for did not reach the disk (or took too long, or the session
                      // ended): JavaScript answers it, from the download or GCS
};

// BR_LOADS: block files read and checked; BR_HITS: of those, blocks a read was answered from (a block
// loaded ahead that no read used is not a cache hit).
// BR_READ_NS: nanoseconds from a read's submission to its answer, summed over the reads answered.
// BR_WAITED: reads that waited for a block on its way to disk (br_file_expect).
// BR_LENT: blocks on their way to disk answered from their download's memory (br_lend).
enum br_stat { BR_READS, BR_READ_BYTES, BR_FALLBACKS, BR_LOADS, BR_LOAD_BYTES, BR_SLOTS, BR_HITS, BR_HIT_BYTES, BR_READ_NS, BR_WAITED, BR_LENT, BR_NSTATS };

struct br_config {
  const char *dir;   // the block folder (blocks-v2): files are dir/<key[0:2]>/<key>
  size_t block_size; // every registered block is this size (the last of a file shorter)
  unsigned slots;    // blocks held in memory at most
  unsigned workers;  // threads reading block files and replying
  int direct;        // read block files with O_DIRECT
};

// What the mount does with a read the native path gives back (on a worker thread), and when a native
// read is over (answered, or given back: the request is gone by then).
struct br_hooks {
  void (*fallback)(fuse_req_t req, uint64_t ino, uint64_t js_fh, uint64_t off, size_t size, int reason, const char *key);
  void (*done)(void *req_userdata); // the request's fuse_req_userdata, taken before it was answered
  int (*may_wait)(void *req_userdata); // whether a read may wait for a block (its session goes on)
};

// Starts the workers, once per process; 0 on success (or if already started), -1 otherwise.
int br_start(const struct br_config *cfg, const struct br_hooks *hooks);
int br_started(void);
// CLOCK_MONOTONIC in nanoseconds (the waits the native path times, the receive thread's kept messages).
uint64_t br_now_ns(void);

// One open file: its JavaScript handle, size, and which of its blocks are on disk. Reference counted
// (the kernel's open, JavaScript's handle on it, reads in progress).
struct br_file;
struct br_file *br_file_new(uint64_t js_fh, uint64_t size, uint64_t block_size);
void br_file_ref(struct br_file *f);
void br_file_unref(struct br_file *f);
uint64_t br_file_js_fh(const struct br_file *f);
// Forgets every block registered for the file (a writer changes its bytes): its reads go to JavaScript.
void br_file_clear(struct br_file *f);
// The file reads another generation now, of `size` bytes: every block registered for it (the old
// generation's) is forgotten. A read racing with it is clamped to either size.
void br_file_resize(struct br_file *f, uint64_t size);
// Registers block `block` of the file as the block file `key` with CRC32C `crc`.
void br_file_add(struct br_file *f, uint64_t block, const char *key, uint32_t crc);
// Registers block `block` of the file as the block file `key`, still on its way to disk: a read of it
// waits (holding no worker) until br_landed says it is there. The caller must call br_landed(key)
// once for every key it expects. 0 when out of memory (nothing registered).
int br_file_expect(struct br_file *f, uint64_t block, const char *key);
// Block file `key` is on disk with CRC32C `crc` and `len` bytes (len 0: it will not be): the files
// expecting it get it registered (when its length is the block's), and the reads waiting on it go on
// (or, when it did not land, back to JavaScript).
void br_landed(const char *key, uint32_t crc, uint32_t len);
// Lends the bytes of block file `key` (`len` of them at `bytes`: JavaScript's memory, downloaded whole and
// checked) before the file is on disk: when reads expect that block (br_file_expect), the reads waiting
// for it, and those after, are answered from that memory, no copy made, until br_revoke(key). Takes a
// slot that holds nothing or a block a read has used. 1 when lent: the memory must then stay as it is
// until br_revoke(key) returns. `landed`: the block is on disk already, registered with its CRC32C, and
// these are the bytes its CRC32C was taken of (a handle's readahead still holds them): lent whether or
// not a read expects it, so its reads are not answered from the file read back and checked again.
int br_lend(const char *key, const void *bytes, uint32_t len, int landed);
// Ends the loan of block file `key` (nothing when none): waits for the replies being sent from it, and
// no read uses the memory afterwards (a read of the block still on its way goes back to JavaScript).
void br_revoke(const char *key);
// 1 when block file `key` is lent and a read has been answered from it.
int br_loan_served(const char *key);
// Gives back every read of the mount `userdata` names that waits for a block (its session is ending).
void br_release_waiting(void *userdata);

// Queues a read of the file for a worker when every block it spans is registered: 1, and the request is
// the worker's (hooks.done follows); 0 otherwise, and the request is still the caller's.
int br_submit(fuse_req_t req, uint64_t ino, struct br_file *f, uint64_t off, size_t size);

// Queues a load of block file `key` (`len` bytes, CRC32C `crc`) into memory before any read asks for it:
// a prefetched block, whose reader is on its way. Only into memory that is free or holds a block a read
// has used; a block loaded ahead that no read has used yet is never pushed out for it. 1 when queued.
int br_preload(const char *key, uint32_t crc, uint32_t len);

void br_stats(uint64_t out[BR_NSTATS]);
// Keys of the blocks read since the last call (for the index's access times), `max` at most, into
// `out` (BR_KEY_LEN + 1 each); frees the memory of blocks unused for `idle_secs`. Returns the count.
unsigned br_maintain(char (*out)[BR_KEY_LEN + 1], unsigned max, unsigned idle_secs);
