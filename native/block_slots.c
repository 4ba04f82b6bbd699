// The native read path's block memory (see block_reads.h): which block each slot holds, loaded from its
// file and checked, or lent by JavaScript. Correctness rests on three things:
// - A block file's name is a hash of bucket, object, generation, block size and block number, and a
//   generation's bytes never change: every copy of a key holds the same bytes, or is damaged.
// - The bytes replied are the bytes checked: a block file is read whole into memory, its CRC32C checked
//   against the index's, and every reply of that block is cut from that memory. Nothing is served from
//   the file after the check, so a file damaged, truncated or replaced later cannot leak into a reply.
// - A block whose file is gone, short or fails its check is never served: the read goes back to
//   JavaScript, which drops the row and fetches the block from GCS, as its own reads of the cache do.
//   A file that cannot be read just now (no descriptor or memory to spare) sends the read to JavaScript
//   too, but the block stays: nothing is known to be wrong with it.
// - Lent memory (br_lend) is JavaScript's buffer of a block on its way to disk, lent only once the
//   download is whole (and a whole object matches GCS's CRC32C); JavaScript keeps it unchanged until
//   br_revoke returns, which waits for every reply cut from it. No load or eviction touches it here.
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
#include <unistd.h>

#include "crc32c.h"

#define ALIGN 4096     // O_DIRECT wants memory, offset and length aligned to the device's block
#define TOUCHED_MAX 4096

static struct {
  pthread_cond_t loaded; // a slot left LOADING, or a lent one's last reader let go
  int ready;
  char dir[4096];
  size_t block_size;
  size_t buf_size;
  atomic_int direct; // cleared for good when the file system refuses O_DIRECT
  struct slot *slots;
  unsigned nslots;
  char (*touched)[BR_KEY_LEN + 1]; // keys of touched slots reused before br_maintain saw them
  unsigned ntouched;
} eng = {.loaded = PTHREAD_COND_INITIALIZER};

int br_slots_init(const struct br_config *cfg) {
  if (strlen(cfg->dir) >= sizeof eng.dir || cfg->block_size == 0 || cfg->slots == 0) return -1;
  eng.slots = calloc(cfg->slots, sizeof *eng.slots);
  eng.touched = calloc(TOUCHED_MAX, sizeof *eng.touched);
  if (!eng.slots || !eng.touched) {
    br_slots_free();
    return -1;
  }
  strcpy(eng.dir, cfg->dir);
  eng.block_size = cfg->block_size;
  eng.buf_size = (cfg->block_size + ALIGN - 1) / ALIGN * ALIGN;
  eng.nslots = cfg->slots;
  atomic_store(&eng.direct, cfg->direct);
  return 0;
}

void br_slots_free(void) {
  free(eng.slots);
  free(eng.touched);
  eng.slots = NULL;
  eng.touched = NULL;
  eng.nslots = 0;
}

void br_slots_ready(void) { eng.ready = 1; }

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
struct slot *br_acquire(const struct reg *r, uint32_t len, int for_read, int preload, int *reason) {
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

void br_release(struct slot *s) {
  pthread_mutex_lock(&br_lock);
  put_locked(s);
  pthread_mutex_unlock(&br_lock);
}

int br_slot_known_locked(const char *key) { return find_slot(key) != NULL; }

// ------------------------------------------------------------------ lent memory

int br_in_memory_locked(const char *key) {
  struct slot *s = find_slot(key);
  return s && s->state == READY;
}

int br_lend(const char *key, const void *bytes, uint32_t len, int landed) {
  if (strlen(key) != BR_KEY_LEN || len == 0) return 0;
  pthread_mutex_lock(&br_lock);
  // Only for reads that wait for the block (or will read it: landed), and once: a slot holding nothing,
  // or a block a read has used.
  struct slot *s = NULL;
  if (eng.ready && len <= eng.block_size && (landed || br_expecting_locked(key)) && !find_slot(key)) {
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
  if (!landed) br_count(BR_LENT, 1);
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

int br_loan_served(const char *key) {
  pthread_mutex_lock(&br_lock);
  struct slot *s = find_slot(key);
  int served = s && s->lent && s->served;
  pthread_mutex_unlock(&br_lock);
  return served;
}

unsigned br_slots_maintain_locked(char (*out)[BR_KEY_LEN + 1], unsigned max, uint64_t cutoff) {
  unsigned n = 0;
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
      br_count_down(BR_SLOTS);
    }
  }
  return n;
}
