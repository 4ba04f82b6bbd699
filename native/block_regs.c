// Open files, the blocks registered for each (on disk, or on their way there), and the reads that wait
// for a block on its way. Why reads wait here: a prefetched chunk file is often opened and read while
// its download is in flight or its block file is being written, and such reads went to JavaScript (four
// of five reads of cold chunk files), each costing the main thread a request, a reply and lookups.
// Parked here, a read holds no worker and no JavaScript, and goes to a worker once JavaScript says the
// block file is in place (br_landed).
// Why it is safe: a registration names the block file by its key (a hash that includes the object's
// generation), so a read waits only for those exact bytes, and the worker then reads the file and
// checks its CRC32C as for any registered block. A block that does not land, a wait longer than
// WAIT_MAX_NS, or the end of the session gives the read back to JavaScript: never a hang.
#define _GNU_SOURCE
#include "block_reads_internal.h"

#include <stdlib.h>
#include <string.h>

// ------------------------------------------------------------------ files and registrations

struct br_file *br_file_new(uint64_t js_fh, uint64_t size, uint64_t block_size) {
  struct br_file *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  atomic_init(&f->refs, 1);
  f->js_fh = js_fh;
  atomic_init(&f->size, size);
  f->block_size = block_size;
  for (unsigned i = 0; i < REGS; i++) f->regs[i].block = UINT64_MAX;
  return f;
}

void br_file_ref(struct br_file *f) { atomic_fetch_add(&f->refs, 1); }

void br_file_unref(struct br_file *f) {
  if (atomic_fetch_sub(&f->refs, 1) == 1) free(f);
}

uint64_t br_file_js_fh(const struct br_file *f) { return f->js_fh; }

struct reg *br_find_reg(struct br_file *f, uint64_t block) {
  for (unsigned i = 0; i < REGS; i++)
    if (f->regs[i].block == block) return &f->regs[i];
  return NULL;
}

// The registration of `block`, or the ring's oldest, which makes room: a reader that comes back to that
// one goes through JavaScript. Under br_lock.
static struct reg *place_reg(struct br_file *f, uint64_t block) {
  struct reg *r = br_find_reg(f, block);
  if (!r) {
    r = &f->regs[f->next_reg];
    f->next_reg = (f->next_reg + 1) % REGS;
  }
  return r;
}

void br_file_add(struct br_file *f, uint64_t block, const char *key, uint32_t crc) {
  if (strlen(key) != BR_KEY_LEN) return;
  pthread_mutex_lock(&br_lock);
  struct reg *r = place_reg(f, block);
  r->block = block;
  r->crc = crc;
  r->expected = 0;
  memcpy(r->key, key, BR_KEY_LEN + 1);
  pthread_mutex_unlock(&br_lock);
}

static void clear_locked(struct br_file *f) {
  for (unsigned i = 0; i < REGS; i++) f->regs[i].block = UINT64_MAX;
  f->ahead_upto = 0;
}

void br_file_clear(struct br_file *f) {
  pthread_mutex_lock(&br_lock);
  clear_locked(f);
  pthread_mutex_unlock(&br_lock);
}

void br_file_resize(struct br_file *f, uint64_t size) {
  pthread_mutex_lock(&br_lock);
  // Together under the lock: a read routed after it finds neither an old block nor the old size.
  clear_locked(f);
  atomic_store_explicit(&f->size, size, memory_order_relaxed);
  pthread_mutex_unlock(&br_lock);
}

uint64_t br_file_size(const struct br_file *f) { return atomic_load_explicit(&f->size, memory_order_relaxed); }

uint32_t br_block_len_at(const struct br_file *f, uint64_t block, uint64_t size) {
  uint64_t start = block * f->block_size;
  uint64_t left = size > start ? size - start : 0;
  return (uint32_t)(left < f->block_size ? left : f->block_size);
}

uint32_t br_block_len(const struct br_file *f, uint64_t block) { return br_block_len_at(f, block, br_file_size(f)); }


// ------------------------------------------------------------------ blocks on their way to disk

struct expecter {
  struct br_file *f; // holds a reference, let go at br_landed
  uint64_t block;
};

// One block file on its way to disk: the registrations expecting it, and the reads parked on it.
struct expect {
  struct expect *next;
  char key[BR_KEY_LEN + 1];
  struct expecter *files;
  unsigned nfiles, cap;
  struct job *parked; // in arrival order, chained by job->next
};

// Under br_lock. As many as the blocks in flight that JavaScript registered: each ends at br_landed.
static struct expect *expects;

static struct expect **find_expect(const char *key) {
  struct expect **pp = &expects;
  while (*pp && memcmp((*pp)->key, key, BR_KEY_LEN) != 0) pp = &(*pp)->next;
  return pp;
}

static int expects_already(const struct expect *e, const struct br_file *f, uint64_t block) {
  for (unsigned i = 0; i < e->nfiles; i++)
    if (e->files[i].f == f && e->files[i].block == block) return 1;
  return 0;
}

int br_file_expect(struct br_file *f, uint64_t block, const char *key) {
  if (strlen(key) != BR_KEY_LEN) return 0;
  pthread_mutex_lock(&br_lock);
  struct expect *e = *find_expect(key);
  int made = 0;
  if (!e) {
    e = calloc(1, sizeof *e);
    if (!e) goto fail;
    memcpy(e->key, key, BR_KEY_LEN + 1);
    made = 1;
  }
  if (!expects_already(e, f, block)) {
    if (e->nfiles == e->cap) {
      unsigned cap = e->cap ? e->cap * 2 : 2;
      struct expecter *files = realloc(e->files, cap * sizeof *files);
      if (!files) {
        if (made) free(e);
        goto fail;
      }
      e->files = files;
      e->cap = cap;
    }
    e->files[e->nfiles++] = (struct expecter){f, block};
    br_file_ref(f);
  }
  if (made) {
    e->next = expects;
    expects = e;
  }
  struct reg *r = place_reg(f, block);
  r->block = block;
  r->crc = 0;
  r->expected = 1;
  memcpy(r->key, key, BR_KEY_LEN + 1);
  pthread_mutex_unlock(&br_lock);
  return 1;
fail:
  pthread_mutex_unlock(&br_lock);
  return 0;
}

// The worker hands the read to JavaScript: never here, as this may be the JavaScript thread, whose
// message queue a blocking send could wait on forever.
static void give_back_locked(struct job *j, int reason) {
  j->give_back = reason;
  br_enqueue_locked(j);
}

static void park_locked(struct expect *e, struct job *j) {
  if (!j->parked_ns) {
    j->parked_ns = br_now_ns();
    br_count(BR_WAITED, 1);
  }
  j->next = NULL;
  struct job **pp = &e->parked;
  while (*pp) pp = &(*pp)->next;
  *pp = j;
}

void br_route_locked(struct job *j) {
  struct br_file *f = j->f;
  uint64_t size = br_file_size(f);
  uint64_t end = j->off + j->size < size ? j->off + j->size : size;
  for (uint64_t b = j->off / f->block_size; end > j->off && b <= (end - 1) / f->block_size; b++) {
    struct reg *r = br_find_reg(f, b);
    // Dropped since it was submitted: it did not land, a writer opened the file, or the ring moved on.
    if (!r) return give_back_locked(j, BR_NOT_LANDED);
    if (!r->expected || br_in_memory_locked(r->key)) continue;
    struct expect *e = *find_expect(r->key);
    if (!e || !br_may_wait(j->userdata)) return give_back_locked(j, BR_NOT_LANDED);
    return park_locked(e, j);
  }
  br_enqueue_locked(j);
}

void br_landed(const char *key, uint32_t crc, uint32_t len) {
  pthread_mutex_lock(&br_lock);
  struct expect **pp = find_expect(key);
  struct expect *e = *pp;
  if (!e) {
    pthread_mutex_unlock(&br_lock);
    return;
  }
  *pp = e->next;
  for (unsigned i = 0; i < e->nfiles; i++) {
    struct reg *r = br_find_reg(e->files[i].f, e->files[i].block);
    if (!r || !r->expected || memcmp(r->key, key, BR_KEY_LEN) != 0) continue;
    if (len > 0 && len == br_block_len(e->files[i].f, e->files[i].block)) {
      r->crc = crc;
      r->expected = 0;
    } else {
      r->block = UINT64_MAX;
    }
  }
  for (struct job *j = e->parked, *next; j; j = next) {
    next = j->next;
    br_route_locked(j);
  }
  pthread_mutex_unlock(&br_lock);
  for (unsigned i = 0; i < e->nfiles; i++) br_file_unref(e->files[i].f);
  free(e->files);
  free(e);
}

int br_expecting_locked(const char *key) { return *find_expect(key) != NULL; }

void br_lent_locked(const char *key) {
  struct expect *e = *find_expect(key);
  if (!e) return;
  struct job *j = e->parked;
  e->parked = NULL;
  for (struct job *next; j; j = next) {
    next = j->next;
    br_route_locked(j);
  }
}

// Gives back the parked reads `leave` picks. Under br_lock.
static void give_back_parked_locked(int (*leave)(const struct job *j, const void *arg), const void *arg) {
  for (struct expect *e = expects; e; e = e->next) {
    struct job **pp = &e->parked;
    while (*pp) {
      struct job *j = *pp;
      if (!leave(j, arg)) {
        pp = &j->next;
        continue;
      }
      *pp = j->next;
      give_back_locked(j, BR_NOT_LANDED);
    }
  }
}

static int of_mount(const struct job *j, const void *userdata) { return j->userdata == userdata; }

void br_release_waiting(void *userdata) {
  pthread_mutex_lock(&br_lock);
  give_back_parked_locked(of_mount, userdata);
  pthread_mutex_unlock(&br_lock);
}

static int parked_before(const struct job *j, const void *cutoff) { return j->parked_ns < *(const uint64_t *)cutoff; }

void br_expire_waiting_locked(uint64_t max_ns) {
  uint64_t now = br_now_ns();
  if (now < max_ns) return;
  uint64_t cutoff = now - max_ns;
  give_back_parked_locked(parked_before, &cutoff);
}
