// The native read path (see block_reads.h). Correctness rests on three things:
// - A block file's name is a hash of bucket, object, generation, block size and block number, and a
//   generation's bytes never change: every copy of a key holds the same bytes, or is damaged.
// - The bytes replied are the bytes checked: a block file is read whole into memory, its CRC32C checked
//   against the index's, and every reply of that block is cut from that memory. Nothing is served from
//   the file after the check, so a file damaged, truncated or replaced later cannot leak into a reply.
// - A block whose file is gone, short or fails its check is never served: the read goes back to
//   JavaScript, which drops the row and fetches the block from GCS, as its own reads of the cache do.
//   A file that cannot be read just now (no descriptor or memory to spare) sends the read to JavaScript
//   too, but the block stays: nothing is known to be wrong with it.
#define _GNU_SOURCE
#include "block_reads_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"

#define AHEAD 2        // blocks loaded ahead of a sequential reader
#define ALIGN 4096     // O_DIRECT wants memory, offset and length aligned to the device's block
#define TOUCHED_MAX 4096

enum slot_state { EMPTY, LOADING, READY, FAILED };

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

pthread_mutex_t br_lock = PTHREAD_MUTEX_INITIALIZER;

// A read parked on a block on its way to disk longer than this goes back to JavaScript (which waits on
// the same download): a guard against a landing never said, not a timeout any read should meet.
#define WAIT_MAX_NS (10ull * 1000000000u)

static struct {
  pthread_cond_t work;   // a job was queued
  pthread_cond_t loaded; // a slot left LOADING, or a lent one's last reader let go
  int started;
  struct br_hooks hooks;
  char dir[4096];
  size_t block_size;
  size_t buf_size;
  atomic_int direct; // cleared for good when the file system refuses O_DIRECT
  struct slot *slots;
  unsigned nslots;
  struct job *head, *tail;
  char (*touched)[BR_KEY_LEN + 1]; // keys of touched slots reused before br_maintain saw them
  unsigned ntouched;
  atomic_ullong stats[BR_NSTATS];
} eng = {.work = PTHREAD_COND_INITIALIZER, .loaded = PTHREAD_COND_INITIALIZER};

uint64_t br_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void br_count(enum br_stat s, uint64_t n) { atomic_fetch_add_explicit(&eng.stats[s], n, memory_order_relaxed); }

// ------------------------------------------------------------------ block memory

static struct slot *find_slot(const char *key) {
  for (unsigned i = 0; i < eng.nslots; i++)
    if (eng.slots[i].state != EMPTY && memcmp(eng.slots[i].key, key, BR_KEY_LEN) == 0) return &eng.slots[i];
  return NULL;
}

static void remember_touch(const char *key) {
  if (eng.ntouched < TOUCHED_MAX) memcpy(eng.touched[eng.ntouched++], key, BR_KEY_LEN + 1);
}

// Block memory: page-aligned for O_DIRECT, and in transparent huge pages where the system allows them
// (MADV_HUGEPAGE): each reply's writev pins the pages it copies from, 256 small pages per MiB otherwise
// (measured: a third of the kernel's time on a warm read, beside the copy itself).
#define HUGE_PAGE (2u << 20)

static char *alloc_buf(size_t size) {
  size_t len = size + HUGE_PAGE;
  char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
  if (a > (uintptr_t)p) munmap(p, a - (uintptr_t)p);
  size_t tail = (uintptr_t)p + len - (a + size);
  if (tail) munmap((char *)a + size, tail);
  madvise((void *)a, size, MADV_HUGEPAGE);
  return (char *)a;
}

static void free_buf(char *buf) { munmap(buf, eng.buf_size); }

// A slot to load a block into: an empty one with memory, else one never used, else the least recently
// used block a read has used, else (not for a preload) the least recently loaded block nobody has read
// yet; never one a reader holds. A block a read has used is in the kernel's page cache too, while one
// loaded ahead is still to be read: it goes last. Under br_lock.
static struct slot *victim(int preload) {
  struct slot *unused = NULL, *lru_served = NULL, *lru_unread = NULL;
  for (unsigned i = 0; i < eng.nslots; i++) {
    struct slot *s = &eng.slots[i];
    if (s->refs > 0 || s->lent) continue;
    if (s->state == EMPTY && s->buf) return s;
    if (s->state == EMPTY) {
      if (!unused) unused = s;
    } else if (s->served) {
      if (!lru_served || s->used_ns < lru_served->used_ns) lru_served = s;
    } else if (!lru_unread || s->used_ns < lru_unread->used_ns) {
      lru_unread = s;
    }
  }
  if (unused && (unused->buf = alloc_buf(eng.buf_size))) {
    br_count(BR_SLOTS, 1);
    return unused;
  }
  if (lru_served) return lru_served;
  return preload ? NULL : lru_unread;
}

static void put_locked(struct slot *s) {
  if (--s->refs == 0 && s->state == FAILED) {
    s->state = EMPTY;
    s->key[0] = 0;
  }
  if (s->refs == 0 && s->lent) pthread_cond_broadcast(&eng.loaded); // br_revoke may wait for it
}

// Why open or pread failed, as a reason: only a file that is not there (or not ours: a symlink, a
// folder) or a disk error says the block is damaged. Running out of descriptors or memory says nothing
// about it, and dropping the block for it emptied the cache of a daemon at its fd limit.
static int failure(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
    case ELOOP:
    case EISDIR:
    case EIO:
      return BR_MISSING;
    default:
      return BR_UNAVAILABLE;
  }
}

// open(2), again when a signal interrupts it.
static int open_retrying(const char *path, int flags) {
  int fd;
  do fd = open(path, flags);
  while (fd < 0 && errno == EINTR);
  return fd;
}

// Reads block file `key` whole into `buf` and checks it: BR_OK or why not.
static int load(char *buf, const char *key, uint32_t len, uint32_t crc) {
  char path[sizeof eng.dir + 2 * BR_KEY_LEN];
  snprintf(path, sizeof path, "%s/%.2s/%s", eng.dir, key, key);
  int direct = atomic_load(&eng.direct);
  int fd = -1;
  if (direct) {
    fd = open_retrying(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_DIRECT);
    if (fd < 0 && errno == EINVAL) {
      direct = 0; // the file system refuses O_DIRECT
      atomic_store(&eng.direct, 0);
    }
  }
  if (fd < 0 && !direct) fd = open_retrying(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return failure(errno);
  size_t want = direct ? (len + ALIGN - 1) / ALIGN * ALIGN : len;
  size_t got = 0;
  while (got < want) {
    ssize_t n = pread(fd, buf + got, want - got, (off_t)got);
    if (n > 0) {
      got += (size_t)n;
      // A short O_DIRECT read leaves the next offset unaligned: the end of the file, or read on buffered.
      if (direct && got % ALIGN) break;
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    if (direct && errno == EINVAL) {
      // This read refused O_DIRECT (an odd device block): the whole block again, through the page cache.
      close(fd);
      int fd2 = open_retrying(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd2 < 0) return failure(errno);
      fd = fd2;
      direct = 0;
      want = len;
      got = 0;
      continue;
    }
    int err = errno;
    close(fd);
    return failure(err);
  }
  close(fd);
  if (got < len) return BR_SHORT;
  if (crc32c(0, buf, len) != crc) return BR_CORRUPT;
  br_count(BR_LOADS, 1);
  br_count(BR_LOAD_BYTES, len);
  return BR_OK;
}

static void served(struct slot *s) {
  if (s->served) return;
  s->served = 1;
  if (s->lent) return;
  br_count(BR_HITS, 1);
  br_count(BR_HIT_BYTES, s->len);
}

// The block in memory, checked, with a reference the caller releases; NULL and *reason otherwise.
// `for_read`: a read will be answered from it (not a load ahead). A block still on its way to disk
// (`r->expected`) is never read from its file: only memory lent to it (br_lend) answers for it.
static struct slot *acquire(const struct reg *r, uint32_t len, int for_read, int preload, int *reason) {
  pthread_mutex_lock(&br_lock);
  struct slot *s = find_slot(r->key);
  if (!s && r->expected) {
    pthread_mutex_unlock(&br_lock);
    *reason = BR_NOT_LANDED;
    return NULL;
  }
  if (s) {
    s->refs++;
    while (s->state == LOADING) pthread_cond_wait(&eng.loaded, &br_lock);
    if (s->state == READY && s->len == len) {
      s->used_ns = br_now_ns();
      s->touched = 1;
      if (for_read) served(s);
      pthread_mutex_unlock(&br_lock);
      return s;
    }
    *reason = s->state == FAILED ? s->reason : BR_SHORT;
    put_locked(s);
    pthread_mutex_unlock(&br_lock);
    return NULL;
  }
  s = victim(preload);
  if (!s) {
    pthread_mutex_unlock(&br_lock);
    *reason = BR_BUSY;
    return NULL;
  }
  if (s->touched) remember_touch(s->key);
  memcpy(s->key, r->key, BR_KEY_LEN + 1);
  s->state = LOADING;
  s->refs = 1;
  s->touched = 0;
  s->served = 0;
  s->len = len;
  pthread_mutex_unlock(&br_lock);

  int res = load(s->buf, r->key, len, r->crc);

  pthread_mutex_lock(&br_lock);
  s->state = res == BR_OK ? READY : FAILED;
  s->reason = res;
  s->used_ns = br_now_ns();
  s->touched = res == BR_OK;
  if (res == BR_OK && for_read) served(s);
  pthread_cond_broadcast(&eng.loaded);
  if (res != BR_OK) {
    put_locked(s);
    s = NULL;
    *reason = res;
  }
  pthread_mutex_unlock(&br_lock);
  return s;
}

static void release(struct slot *s) {
  pthread_mutex_lock(&br_lock);
  put_locked(s);
  pthread_mutex_unlock(&br_lock);
}

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
  if (end > f->size) end = f->size;
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
  for (unsigned i = 0; i < n; i++) {
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
    slots[i] = acquire(&regs[i], br_block_len(f, first + i), 1, 0, &reason);
    if (slots[i]) got++;
    else if (reason != BR_BUSY && reason != BR_UNAVAILABLE && reason != BR_NOT_LANDED) {
      bad = regs[i].key;
      bad_block = first + i;
    }
  }
  if (reason != BR_OK) {
    for (unsigned i = 0; i < got; i++) release(slots[i]);
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
  for (unsigned i = 0; i < n; i++) release(slots[i]);
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
      struct slot *s = acquire(&j->ahead, j->ahead_len, 0, j->preload, &reason);
      if (s) release(s);
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
  if (strlen(cfg->dir) >= sizeof eng.dir || cfg->block_size == 0 || cfg->slots == 0 || cfg->workers == 0) goto out;
  eng.slots = calloc(cfg->slots, sizeof *eng.slots);
  eng.touched = calloc(TOUCHED_MAX, sizeof *eng.touched);
  if (!eng.slots || !eng.touched) goto out;
  strcpy(eng.dir, cfg->dir);
  eng.block_size = cfg->block_size;
  eng.buf_size = (cfg->block_size + ALIGN - 1) / ALIGN * ALIGN;
  eng.nslots = cfg->slots;
  atomic_store(&eng.direct, cfg->direct);
  eng.hooks = *hooks;
  unsigned started = 0;
  for (; started < cfg->workers; started++) {
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) break;
    pthread_detach(t);
  }
  if (started == 0) goto out;
  eng.started = 1;
  res = 0;
out:
  if (res != 0) {
    free(eng.slots);
    free(eng.touched);
    eng.slots = NULL;
    eng.touched = NULL;
  }
  pthread_mutex_unlock(&br_lock);
  return res;
}

int br_started(void) { return eng.started; }

int br_may_wait(void *userdata) { return !eng.hooks.may_wait || eng.hooks.may_wait(userdata); }

int br_submit(fuse_req_t req, uint64_t ino, struct br_file *f, uint64_t off, size_t size) {
  if (!eng.started || f->block_size != eng.block_size) return 0;
  uint64_t end = off + size < f->size ? off + size : f->size;
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
    for (uint64_t b = last + 1; b <= last + AHEAD && b * f->block_size < f->size; b++) {
      if (b < f->ahead_upto) continue;
      struct reg *r = br_find_reg(f, b);
      if (!r || r->expected) break;
      f->ahead_upto = b + 1;
      if (find_slot(r->key)) continue;
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
  int queued = !find_slot(key);
  if (queued) br_enqueue_locked(j);
  pthread_mutex_unlock(&br_lock);
  if (!queued) free(j);
  return queued;
}

int br_in_memory_locked(const char *key) {
  struct slot *s = find_slot(key);
  return s && s->state == READY;
}

int br_lend(const char *key, const void *bytes, uint32_t len) {
  if (strlen(key) != BR_KEY_LEN || len == 0) return 0;
  pthread_mutex_lock(&br_lock);
  // Only for reads that wait for the block, and once: a slot holding nothing, or a block a read has used.
  struct slot *s = NULL;
  if (eng.started && len <= eng.block_size && br_expecting_locked(key) && !find_slot(key)) {
    for (unsigned i = 0; i < eng.nslots; i++) {
      struct slot *c = &eng.slots[i];
      if (c->refs > 0 || c->lent || c->state == LOADING) continue;
      if (c->state == EMPTY || c->state == FAILED) {
        s = c;
        break;
      }
      if (c->served && (!s || c->used_ns < s->used_ns)) s = c;
    }
  }
  if (!s) {
    pthread_mutex_unlock(&br_lock);
    return 0;
  }
  if (s->touched) remember_touch(s->key);
  memcpy(s->key, key, BR_KEY_LEN + 1);
  s->own = s->buf;
  s->buf = (char *)bytes;
  s->lent = 1;
  s->state = READY;
  s->touched = 0;
  s->served = 0;
  s->len = len;
  s->used_ns = br_now_ns();
  br_count(BR_LENT, 1);
  br_lent_locked(key);
  pthread_mutex_unlock(&br_lock);
  return 1;
}

void br_revoke(const char *key) {
  pthread_mutex_lock(&br_lock);
  struct slot *s = find_slot(key);
  if (s && s->lent) {
    // The readers replying from it are copying into the kernel (a reply never waits on a reader): brief.
    while (s->refs > 0) pthread_cond_wait(&eng.loaded, &br_lock);
    s->buf = s->own;
    s->own = NULL;
    s->lent = 0;
    s->state = EMPTY;
    s->key[0] = 0;
  }
  pthread_mutex_unlock(&br_lock);
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
  for (unsigned i = 0; i < eng.ntouched && n < max; i++) memcpy(out[n++], eng.touched[i], BR_KEY_LEN + 1);
  eng.ntouched = 0;
  for (unsigned i = 0; i < eng.nslots; i++) {
    struct slot *s = &eng.slots[i];
    if (s->touched && s->state == READY && !s->lent && n < max) {
      memcpy(out[n++], s->key, BR_KEY_LEN + 1);
      s->touched = 0;
    }
    if (s->refs == 0 && s->buf && !s->lent && s->used_ns < cutoff && s->state != LOADING) {
      free_buf(s->buf);
      s->buf = NULL;
      s->state = EMPTY;
      s->key[0] = 0;
      atomic_fetch_sub(&eng.stats[BR_SLOTS], 1);
    }
  }
  pthread_mutex_unlock(&br_lock);
  return n;
}
