// The native read path (see block_reads.h): its workers, the queue of reads for them, and what starts,
// counts and maintains it; the block memory they answer from is block_slots.c's.
#define _GNU_SOURCE
#include "block_reads_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#define AHEAD 2        // blocks loaded ahead of a sequential reader

pthread_mutex_t br_lock = PTHREAD_MUTEX_INITIALIZER;

// A read parked on a block on its way to disk longer than this goes back to JavaScript (which waits on
// the same download): a guard against a landing never said, not a timeout any read should meet.
#define WAIT_MAX_NS (10ull * 1000000000u)

static struct {
  pthread_cond_t work; // a job was queued
  int started;
  struct br_hooks hooks;
  size_t block_size;
  struct job *head, *tail;
  atomic_ullong stats[BR_NSTATS];
} eng = {.work = PTHREAD_COND_INITIALIZER};

uint64_t br_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void br_count(enum br_stat s, uint64_t n) { atomic_fetch_add_explicit(&eng.stats[s], n, memory_order_relaxed); }

void br_count_down(enum br_stat s) { atomic_fetch_sub_explicit(&eng.stats[s], 1, memory_order_relaxed); }

// ------------------------------------------------------------------ workers

void br_enqueue_locked(struct job *j) {
  j->next = NULL;
  if (eng.tail) eng.tail->next = j;
  else eng.head = j;
  eng.tail = j;
  pthread_cond_signal(&eng.work);
}

static void serve(struct job *j) {
  struct br_file *f = j->f;
  uint64_t end = j->off + j->size;
  uint64_t size = br_file_size(f);
  if (end > size) end = size;
  if (j->off >= end) {
    fuse_reply_buf(j->req, NULL, 0);
    br_count(BR_READS, 1);
    br_count(BR_READ_NS, br_now_ns() - j->submitted_ns);
    return;
  }
  uint64_t first = j->off / f->block_size, last = (end - 1) / f->block_size;
  unsigned n = (unsigned)(last - first + 1);
  struct reg regs[MAX_SPAN];
  struct slot *slots[MAX_SPAN];
  int reason = BR_OK;
  const char *bad = NULL;
  uint64_t bad_block = 0;
  unsigned got = 0;
  pthread_mutex_lock(&br_lock);
  // Resized since `size` was read (an upload landed: br_file_resize, which also clears the blocks, and
  // JavaScript may have registered the new generation's since): the read goes back. Its span and the
  // blocks' lengths must come from one size, or a block shorter than the read's offset in it made a
  // reply of 2^64 bytes, which failed, and the reader waited for an answer for ever.
  if (br_file_size(f) != size) reason = BR_BUSY;
  for (unsigned i = 0; reason == BR_OK && i < n; i++) {
    struct reg *r = br_find_reg(f, first + i);
    if (!r) {
      // Replaced in the ring since the read was queued.
      reason = BR_BUSY;
      break;
    }
    regs[i] = *r;
  }
  pthread_mutex_unlock(&br_lock);
  for (unsigned i = 0; reason == BR_OK && i < n; i++) {
    slots[i] = br_acquire(&regs[i], br_block_len_at(f, first + i, size), 1, 0, &reason);
    if (slots[i]) got++;
    else if (reason != BR_BUSY && reason != BR_UNAVAILABLE && reason != BR_NOT_LANDED) {
      bad = regs[i].key;
      bad_block = first + i;
    }
  }
  if (reason != BR_OK) {
    for (unsigned i = 0; i < got; i++) br_release(slots[i]);
    if (bad) {
      // This file's readers must not try the damaged block again: the next read of it goes to JavaScript.
      pthread_mutex_lock(&br_lock);
      struct reg *r = br_find_reg(f, bad_block);
      if (r && strcmp(r->key, bad) == 0) r->block = UINT64_MAX;
      pthread_mutex_unlock(&br_lock);
    }
    br_count(BR_FALLBACKS, 1);
    eng.hooks.fallback(j->req, j->ino, f->js_fh, j->off, j->size, reason, bad);
    return;
  }
  struct iovec iov[MAX_SPAN];
  for (unsigned i = 0; i < n; i++) {
    uint64_t start = (first + i) * f->block_size;
    uint64_t from = j->off > start ? j->off - start : 0;
    uint64_t to = end - start < slots[i]->len ? end - start : slots[i]->len;
    iov[i].iov_base = slots[i]->buf + from;
    iov[i].iov_len = to - from;
  }
  fuse_reply_iov(j->req, iov, (int)n);
  br_count(BR_READS, 1);
  br_count(BR_READ_BYTES, end - j->off);
  br_count(BR_READ_NS, br_now_ns() - j->submitted_ns);
  for (unsigned i = 0; i < n; i++) br_release(slots[i]);
}

static void *worker(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&br_lock);
    while (!eng.head) pthread_cond_wait(&eng.work, &br_lock);
    struct job *j = eng.head;
    eng.head = j->next;
    if (!eng.head) eng.tail = NULL;
    pthread_mutex_unlock(&br_lock);
    if (j->give_back) {
      br_count(BR_FALLBACKS, 1);
      eng.hooks.fallback(j->req, j->ino, j->f->js_fh, j->off, j->size, j->give_back, NULL);
      br_file_unref(j->f);
      eng.hooks.done(j->userdata);
    } else if (j->req) {
      serve(j);
      br_file_unref(j->f);
      eng.hooks.done(j->userdata);
    } else {
      int reason;
      struct slot *s = br_acquire(&j->ahead, j->ahead_len, 0, j->preload, &reason);
      if (s) br_release(s);
    }
    free(j);
  }
  return NULL;
}

int br_start(const struct br_config *cfg, const struct br_hooks *hooks) {
  pthread_mutex_lock(&br_lock);
  if (eng.started) {
    pthread_mutex_unlock(&br_lock);
    return 0;
  }
  int res = -1;
  if (cfg->workers == 0 || br_slots_init(cfg) != 0) goto out;
  eng.block_size = cfg->block_size;
  eng.hooks = *hooks;
  unsigned started = 0;
  for (; started < cfg->workers; started++) {
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) break;
    pthread_detach(t);
  }
  if (started == 0) {
    br_slots_free();
    goto out;
  }
  eng.started = 1;
  br_slots_ready();
  res = 0;
out:
  pthread_mutex_unlock(&br_lock);
  return res;
}

int br_started(void) { return eng.started; }

int br_may_wait(void *userdata) { return !eng.hooks.may_wait || eng.hooks.may_wait(userdata); }

int br_submit(fuse_req_t req, uint64_t ino, struct br_file *f, uint64_t off, size_t size) {
  if (!eng.started || f->block_size != eng.block_size) return 0;
  uint64_t fsize = br_file_size(f);
  // At or past the size this side knows: JavaScript's answer, which knows a file being written (a
  // writer's appends past it read as EOF here, and the kernel then cut the file to that size).
  if (off >= fsize) return 0;
  uint64_t end = off + size < fsize ? off + size : fsize;
  uint64_t first = off / f->block_size;
  uint64_t last = end > off ? (end - 1) / f->block_size : first;
  if (last - first >= MAX_SPAN) return 0;
  struct job *j = calloc(1, sizeof *j);
  if (!j) return 0;
  struct job *ahead[AHEAD];
  unsigned nahead = 0;
  pthread_mutex_lock(&br_lock);
  for (uint64_t b = first; end > off && b <= last; b++) {
    if (!br_find_reg(f, b)) {
      pthread_mutex_unlock(&br_lock);
      free(j);
      return 0;
    }
  }
  // A sequential reader: the next blocks are read from disk while this one is answered.
  if (off == f->next_off) {
    for (uint64_t b = last + 1; b <= last + AHEAD && b * f->block_size < fsize; b++) {
      if (b < f->ahead_upto) continue;
      struct reg *r = br_find_reg(f, b);
      if (!r || r->expected) break;
      f->ahead_upto = b + 1;
      if (br_slot_known_locked(r->key)) continue;
      struct job *a = calloc(1, sizeof *a);
      if (!a) break;
      a->ahead = *r;
      a->ahead_len = br_block_len(f, b);
      ahead[nahead++] = a;
    }
  }
  f->next_off = end;
  br_file_ref(f);
  j->req = req;
  j->userdata = fuse_req_userdata(req);
  j->ino = ino;
  j->f = f;
  j->off = off;
  j->size = size;
  j->submitted_ns = br_now_ns();
  br_route_locked(j);
  for (unsigned i = 0; i < nahead; i++) br_enqueue_locked(ahead[i]);
  pthread_mutex_unlock(&br_lock);
  return 1;
}

int br_preload(const char *key, uint32_t crc, uint32_t len) {
  if (!eng.started || strlen(key) != BR_KEY_LEN || len == 0 || len > eng.block_size) return 0;
  struct job *j = calloc(1, sizeof *j);
  if (!j) return 0;
  memcpy(j->ahead.key, key, BR_KEY_LEN + 1);
  j->ahead.crc = crc;
  j->ahead_len = len;
  j->preload = 1;
  pthread_mutex_lock(&br_lock);
  int queued = !br_slot_known_locked(key);
  if (queued) br_enqueue_locked(j);
  pthread_mutex_unlock(&br_lock);
  if (!queued) free(j);
  return queued;
}

void br_stats(uint64_t out[BR_NSTATS]) {
  for (int i = 0; i < BR_NSTATS; i++) out[i] = atomic_load_explicit(&eng.stats[i], memory_order_relaxed);
}

unsigned br_maintain(char (*out)[BR_KEY_LEN + 1], unsigned max, unsigned idle_secs) {
  if (!eng.started) return 0;
  unsigned n = 0;
  uint64_t cutoff = br_now_ns() - (uint64_t)idle_secs * 1000000000u;
  pthread_mutex_lock(&br_lock);
  br_expire_waiting_locked(WAIT_MAX_NS);
  n = br_slots_maintain_locked(out, max, cutoff);
  pthread_mutex_unlock(&br_lock);
  return n;
}
