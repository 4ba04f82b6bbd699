// What block_reads.c (workers), block_slots.c (block memory) and block_regs.c (open files, their registered blocks and
// the blocks on their way to disk) share. Everything marked "under br_lock" is guarded by that one lock.
#pragma once
#include "block_reads.h"

#include <pthread.h>
#include <stdatomic.h>

#define REGS 64     // blocks registered per open file at once (a window, not the whole file)
#define MAX_SPAN 4  // blocks one read may span (a 1 MiB read spans at most 2 of 1 MiB or more)

extern pthread_mutex_t br_lock;

enum slot_state { EMPTY, LOADING, READY, FAILED };

// One block in memory (block_slots.c): loaded from its file and checked, or lent by JavaScript.
struct slot {
  char key[BR_KEY_LEN + 1];
  int state;
  int reason; // why, when FAILED
  uint32_t len;
  char *buf;  // block_size rounded up to ALIGN (alloc_buf); NULL until first used
  int refs;   // readers between acquire and release; a slot with refs is never reused
  int touched; // read since the last br_maintain
  int served;  // a read was answered from this load (counted once as a cache hit)
  int lent;    // buf is JavaScript's memory (br_lend), answered from until br_revoke; never a cache hit
  char *own;   // while lent: this slot's own memory (or NULL), back in buf once revoked
  uint64_t used_ns;
};

struct reg {
  uint64_t block; // UINT64_MAX: unused
  uint32_t crc;   // meaningless while `expected`
  int expected;   // on its way to disk: reads of it wait for br_landed (block_regs.c)
  char key[BR_KEY_LEN + 1];
};

struct br_file {
  atomic_int refs;
  uint64_t js_fh;
  // Atomic: br_file_resize changes it while readers on other threads clamp to it (either value will do).
  _Atomic uint64_t size;
  uint64_t block_size;
  // Under br_lock:
  struct reg regs[REGS];
  unsigned next_reg; // the ring's next place
  uint64_t next_off; // where a sequential reader's next read starts
  uint64_t ahead_upto; // blocks up to here were queued for loading ahead (+1; 0: none)
};

struct job {
  struct job *next;
  fuse_req_t req; // NULL: load `ahead` into memory, nobody waits
  void *userdata; // the request's, for hooks.done once the request is answered
  uint64_t ino;
  struct br_file *f;
  uint64_t off;
  size_t size;
  struct reg ahead;
  uint32_t ahead_len;
  int preload; // a load ahead of any read (br_preload): takes only memory no unread block holds
  int give_back; // a br_reason: the worker hands the read to JavaScript (never done on the JS thread)
  uint64_t submitted_ns;
  uint64_t parked_ns; // when it began waiting for a block on its way to disk
};

void br_count(enum br_stat s, uint64_t n);
void br_count_down(enum br_stat s);

// Block memory (block_slots.c). br_slots_init: the slots for `cfg`, 0 or -1 (then nothing is held);
// br_slots_ready: workers run, loans may be taken.
int br_slots_init(const struct br_config *cfg);
void br_slots_free(void);
void br_slots_ready(void);
// The block in memory, checked, with a reference br_release lets go; NULL and *reason otherwise.
// `for_read`: a read will be answered from it; `preload`: only into memory no unread block holds.
struct slot *br_acquire(const struct reg *r, uint32_t len, int for_read, int preload, int *reason);
void br_release(struct slot *s);
// Whether a slot holds (or is loading) block file `key`. Under br_lock.
int br_slot_known_locked(const char *key);
// Keys of blocks read since the last call (for the index's access times), then frees the memory of
// slots unused since `cutoff_ns`; returns the count. Under br_lock.
unsigned br_slots_maintain_locked(char (*out)[BR_KEY_LEN + 1], unsigned max, uint64_t cutoff_ns);
// Queues a job for the workers. Under br_lock.
void br_enqueue_locked(struct job *j);
// Whether a read of the mount `userdata` names may wait for a block (not once its session ends).
int br_may_wait(void *userdata);

struct reg *br_find_reg(struct br_file *f, uint64_t block);
uint64_t br_file_size(const struct br_file *f);
uint32_t br_block_len(const struct br_file *f, uint64_t block);
// The length block `block` has in a file of `size` bytes (a size read once, for a whole read).
uint32_t br_block_len_at(const struct br_file *f, uint64_t block, uint64_t size);
// Sends job `j` (a read of registered blocks) on: to the workers when none of its blocks is on its way
// (or those that are are in memory already, br_lend), else parked on the first that is (or, where it
// may not wait, given back). Under br_lock.
void br_route_locked(struct job *j);
// Whether block file `key` is in block memory, ready to answer from. Under br_lock.
int br_in_memory_locked(const char *key);
// Whether reads expect block file `key` on its way to disk (br_file_expect). Under br_lock.
int br_expecting_locked(const char *key);
// Block file `key` is in memory now (br_lend): the reads parked on it go on. Under br_lock.
void br_lent_locked(const char *key);
// Gives back the reads parked longer than `max_ns`. Under br_lock.
void br_expire_waiting_locked(uint64_t max_ns);
