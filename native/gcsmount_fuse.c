// gcsmount's FUSE layer: libfuse3's low-level (inode) API, with every operation answered from JavaScript.
//
// One receive thread per mount reads requests from /dev/fuse and never waits for JavaScript: each request
// is handed to the JS thread through a threadsafe function (a bounded queue; a full queue stalls the
// receive thread, which is the back-pressure) and JavaScript answers when it is ready by calling one of
// the reply functions with the request's handle. A handle answers exactly once: a second reply throws,
// and a handle dropped unanswered is answered EIO when it is collected. The session outlives its mount
// until every handle is answered, so a reply after an unmount is harmless (the kernel has forgotten it).
//
// Reads of blocks already on disk never reach JavaScript: JavaScript registers, per open file, which
// block files hold which blocks and their CRC32C (from the block index), and the receive thread hands a
// read of registered blocks to a native worker, which reads the whole block file (O_DIRECT), checks its
// CRC32C and replies from that memory. A block that is missing, short or fails its check goes back to
// JavaScript with the reason (which drops the row and fetches the block again), as does a read of a
// block nobody registered.

#define FUSE_USE_VERSION 312
#define _GNU_SOURCE
#include <errno.h>
#include <fuse_lowlevel.h>
#include <malloc.h>
#include <node_api.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "block_reads.h"
#include "crc32c.h"

// The operations handed to JavaScript; keep in step with OP in src/fs/kernel.ts. Write operations get
// their own codes when they are added.
enum op_code {
  OP_LOOKUP = 1,
  OP_FORGET = 2,
  OP_GETATTR = 3,
  OP_OPEN = 4,
  OP_READ = 5,
  OP_RELEASE = 6,
  OP_OPENDIR = 7,
  OP_READDIR = 8,
  OP_RELEASEDIR = 9,
  OP_STATFS = 10,
  OP_READDIRPLUS = 11,
  OP_INVALIDATED = 12, // the kernel has dropped an inode's attributes and pages (no request)
  OP_EXITED = 100, // the receive loop has ended (unmounted, or the connection aborted)
};

struct mount;

// A kernel cache invalidation waiting for the notify thread: an inode's attributes and pages (entry 0),
// or the name `name` in the folder `ino` (entry 1).
struct notice {
  struct notice *next;
  uint64_t ino;
  int entry;
  size_t namelen;
  char name[];
};

// What JavaScript holds for one request: the libfuse request, answered at most once.
struct req_ref {
  fuse_req_t req;
  struct mount *m;
  int answered;
};

struct mount {
  struct fuse_session *se;
  pthread_t thread;
  int thread_started;
  napi_threadsafe_function tsfn;
  atomic_long outstanding; // requests handed to JS and not yet answered
  int loop_ended;          // set on the JS thread when OP_EXITED arrives
  int destroyed;
  unsigned max_background;
  unsigned congestion_threshold;
  unsigned want_parallel_dirops;
  atomic_int patch_init_reply; // set by ll_init, for the INIT reply that follows it (dev_writev runs on the notify thread too)
  // Reads the native path holds (block_reads.c). Once the receive loop has ended (`exiting`), no new one
  // starts, and OP_EXITED waits for these to be answered or handed to JavaScript.
  pthread_mutex_t native_lock;
  pthread_cond_t native_idle;
  long native_jobs;
  int exiting;
  // Invalidations of the kernel's caches, sent by a thread of their own: the kernel may hold locks (a
  // page being read, the folder's lock during a lookup) until a request is answered, and only the JS
  // thread answers it, so the JS thread must never wait for a notification. `notify_stop` ends the thread
  // (the queue left is discarded); set once the session has ended, before the session is destroyed.
  pthread_t notify_thread;
  int notify_started;
  pthread_mutex_t notify_lock;
  pthread_cond_t notify_wake;
  struct notice *notify_head, *notify_tail;
  int notify_stop;
  int notify_tsfn_gone; // the threadsafe function refused a call (the environment is going): never touch it again
};

// One request on its way to JavaScript. `name` is set for lookups, and for a read the native path gave
// back because of a damaged block (the block file's key; `reason` says what was wrong).
struct msg {
  int op;
  fuse_req_t req;
  uint64_t ino;
  uint64_t a, b, c;
  int reason;
  int has_name;
  char name[];
};

static char last_log[512];

static int log_to_stderr;

static void log_to_buffer(enum fuse_log_level level, const char *fmt, va_list ap) {
  (void)level;
  if (log_to_stderr) {
    va_list copy;
    va_copy(copy, ap);
    vfprintf(stderr, fmt, copy);
    va_end(copy);
  }
  vsnprintf(last_log, sizeof last_log, fmt, ap);
  size_t n = strlen(last_log);
  while (n > 0 && last_log[n - 1] == '\n') last_log[--n] = 0;
}

// ------------------------------------------------------------------ receive thread side

static void send_reason(struct mount *m, int op, fuse_req_t req, uint64_t ino, uint64_t a, uint64_t b, uint64_t c, const char *name, int reason) {
  size_t len = name ? strlen(name) + 1 : 0;
  struct msg *msg = malloc(sizeof *msg + len);
  if (!msg) {
    if (req) fuse_reply_err(req, ENOMEM);
    return;
  }
  msg->op = op;
  msg->req = req;
  msg->ino = ino;
  msg->a = a;
  msg->b = b;
  msg->c = c;
  msg->reason = reason;
  msg->has_name = name != NULL;
  if (name) memcpy(msg->name, name, len);
  if (req) atomic_fetch_add(&m->outstanding, 1);
  if (napi_call_threadsafe_function(m->tsfn, msg, napi_tsfn_blocking) != napi_ok) {
    // JavaScript is going away: answer here, so nothing waits for it.
    if (req) {
      atomic_fetch_sub(&m->outstanding, 1);
      fuse_reply_err(req, EIO);
    }
    free(msg);
  }
}

static void send(struct mount *m, int op, fuse_req_t req, uint64_t ino, uint64_t a, uint64_t b, uint64_t c, const char *name) {
  send_reason(m, op, req, ino, a, b, c, name, 0);
}

static struct mount *mount_of(fuse_req_t req) { return fuse_req_userdata(req); }

// Every open file's and folder's fi->fh is a struct br_file (set by replyOpen), holding JavaScript's number.
static struct br_file *file_of(const struct fuse_file_info *fi) { return (struct br_file *)(uintptr_t)fi->fh; }

// A read may go to the native path: not once the receive loop has ended.
static int native_begin(struct mount *m) {
  pthread_mutex_lock(&m->native_lock);
  int ok = !m->exiting;
  if (ok) m->native_jobs++;
  pthread_mutex_unlock(&m->native_lock);
  return ok;
}

static void native_end(struct mount *m) {
  pthread_mutex_lock(&m->native_lock);
  if (--m->native_jobs == 0) pthread_cond_broadcast(&m->native_idle);
  pthread_mutex_unlock(&m->native_lock);
}

// Hooks of the native path (worker threads): a read it gives back goes to JavaScript like any other
// (counted outstanding before the native count drops, so the session never sees both at zero).
static void native_fallback(fuse_req_t req, uint64_t ino, uint64_t js_fh, uint64_t off, size_t size, int reason, const char *key) {
  send_reason(mount_of(req), OP_READ, req, ino, js_fh, off, size, key, reason);
}

static void native_done(void *req_userdata) { native_end(req_userdata); }

static void ll_init(void *userdata, struct fuse_conn_info *conn) {
  struct mount *m = userdata;
  // Lookups and readdirs in one folder run in parallel, not one after another under the folder's lock.
  // libfuse 3.14 never tells the kernel (fixed in 3.16, libfuse #861): the INIT reply is patched on its
  // way out (dev_writev).
  if (m->want_parallel_dirops && (conn->capable & FUSE_CAP_PARALLEL_DIROPS)) {
    conn->want |= FUSE_CAP_PARALLEL_DIROPS;
    m->patch_init_reply = 1;
  }
  if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
  // Every listing comes with each entry's attributes (the listing has them already), so `ls -l`, `find
  // -ls` or os.walk + stat cost no LOOKUP per name. Always, not READDIRPLUS_AUTO (libfuse's default with
  // a readdirplus op): AUTO sends plain READDIRs after the first buffer unless stats came in between,
  // and `ls -l` reads the whole folder before its first stat, so all names after the first buffer were
  // looked up one by one.
  if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
  conn->want &= ~(unsigned)FUSE_CAP_READDIRPLUS_AUTO;
  // Pages are dropped on open (keep_cache off) and when a file's size or mtime moves.
  if (conn->capable & FUSE_CAP_AUTO_INVAL_DATA) conn->want |= FUSE_CAP_AUTO_INVAL_DATA;
  conn->want &= ~(unsigned)(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE | FUSE_CAP_WRITEBACK_CACHE);
  conn->max_background = m->max_background;
  conn->congestion_threshold = m->congestion_threshold;
  // libfuse 3.14 negotiates max_pages from max_write (1 MiB with its default buffer): reads of up to
  // 1 MiB, once read_ahead_kb lets the kernel ask for that much.
}

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
static int valid_utf8(const unsigned char *s) {
  while (*s) {
    unsigned c = *s++, n, min, cp;
    if (c < 0x80) continue;
    if ((c & 0xe0) == 0xc0) n = 1, min = 0x80, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0) n = 2, min = 0x800, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0) n = 3, min = 0x10000, cp = c & 0x07;
    else return 0;
    for (; n > 0; n--, s++) {
      if ((*s & 0xc0) != 0x80) return 0;
      cp = (cp << 6) | (*s & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  }
  return 1;
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
  // Object names are UTF-8: JavaScript would read other bytes with replacement characters, so "\xff" and
  // "\xfe" would both name the object "\uFFFD". No object has such a name.
  if (!valid_utf8((const unsigned char *)name)) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  send(mount_of(req), OP_LOOKUP, req, parent, 0, 0, 0, name);
}

static void ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  struct mount *m = mount_of(req);
  fuse_reply_none(req);
  send(m, OP_FORGET, NULL, ino, nlookup, 0, 0, NULL);
}

static void ll_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets) {
  struct mount *m = mount_of(req);
  for (size_t i = 0; i < count; i++) send(m, OP_FORGET, NULL, forgets[i].ino, forgets[i].nlookup, 0, 0, NULL);
  fuse_reply_none(req);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  // fh + 1, so 0 says "no open file" (a stat, not an fstat).
  // Only a regular file's getattr carries its open file (the kernel's FUSE_GETATTR_FH).
  send(mount_of(req), OP_GETATTR, req, ino, fi ? br_file_js_fh(file_of(fi)) + 1 : 0, 0, 0, NULL);
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  send(mount_of(req), OP_OPEN, req, ino, (uint64_t)(unsigned)fi->flags, 0, 0, NULL);
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  struct mount *m = mount_of(req);
  struct br_file *f = file_of(fi);
  // Blocks on disk that JavaScript registered for this file: answered by a native worker.
  if (br_started() && native_begin(m)) {
    if (br_submit(req, ino, f, (uint64_t)off, size)) return;
    native_end(m);
  }
  send(m, OP_READ, req, ino, br_file_js_fh(f), (uint64_t)off, size, NULL);
}

static void ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  struct br_file *f = file_of(fi);
  send(mount_of(req), OP_RELEASE, req, ino, br_file_js_fh(f), 0, 0, NULL);
  br_file_unref(f); // the kernel's reference, taken by replyOpen
}

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  send(mount_of(req), OP_OPENDIR, req, ino, (uint64_t)(unsigned)fi->flags, 0, 0, NULL);
}

static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  send(mount_of(req), OP_READDIR, req, ino, br_file_js_fh(file_of(fi)), (uint64_t)off, size, NULL);
}

static void ll_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  send(mount_of(req), OP_READDIRPLUS, req, ino, br_file_js_fh(file_of(fi)), (uint64_t)off, size, NULL);
}

static void ll_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  struct br_file *f = file_of(fi);
  send(mount_of(req), OP_RELEASEDIR, req, ino, br_file_js_fh(f), 0, 0, NULL);
  br_file_unref(f);
}

static void ll_statfs(fuse_req_t req, fuse_ino_t ino) { send(mount_of(req), OP_STATFS, req, ino, 0, 0, 0, NULL); }

static const struct fuse_lowlevel_ops ll_ops = {
    .init = ll_init,
    .lookup = ll_lookup,
    .forget = ll_forget,
    .forget_multi = ll_forget_multi,
    .getattr = ll_getattr,
    .open = ll_open,
    .read = ll_read,
    .release = ll_release,
    .opendir = ll_opendir,
    .readdir = ll_readdir,
    .readdirplus = ll_readdirplus,
    .releasedir = ll_releasedir,
    .statfs = ll_statfs,
};

// The kernel's INIT flag for parallel lookups and readdirs (linux/fuse.h), and where fuse_init_out
// keeps its flags: after major, minor and max_readahead.
#define KERNEL_FUSE_PARALLEL_DIROPS (1u << 18)
#define INIT_OUT_FLAGS_OFFSET 12

static ssize_t dev_writev(int fd, struct iovec *iov, int count, void *userdata) {
  struct mount *m = userdata;
  if (m->patch_init_reply && count >= 2 && iov[1].iov_len >= INIT_OUT_FLAGS_OFFSET + sizeof(uint32_t)) {
    // The first reply after ll_init is the INIT reply: [fuse_out_header][fuse_init_out].
    m->patch_init_reply = 0;
    uint32_t flags;
    memcpy(&flags, (char *)iov[1].iov_base + INIT_OUT_FLAGS_OFFSET, sizeof flags);
    flags |= KERNEL_FUSE_PARALLEL_DIROPS;
    memcpy((char *)iov[1].iov_base + INIT_OUT_FLAGS_OFFSET, &flags, sizeof flags);
  }
  return writev(fd, iov, count);
}

static ssize_t dev_read(int fd, void *buf, size_t len, void *userdata) {
  (void)userdata;
  return read(fd, buf, len);
}

static const struct fuse_custom_io dev_io = {.writev = dev_writev, .read = dev_read};

static void *receive_loop(void *arg) {
  struct mount *m = arg;
  fuse_session_loop(m->se);
  pthread_mutex_lock(&m->native_lock);
  m->exiting = 1;
  while (m->native_jobs > 0) pthread_cond_wait(&m->native_idle, &m->native_lock);
  pthread_mutex_unlock(&m->native_lock);
  send(m, OP_EXITED, NULL, 0, 0, 0, 0, NULL);
  return NULL;
}

// ------------------------------------------------------------------ notify thread

static void *notify_loop(void *arg) {
  struct mount *m = arg;
  pthread_mutex_lock(&m->notify_lock);
  for (;;) {
    while (!m->notify_head && !m->notify_stop) pthread_cond_wait(&m->notify_wake, &m->notify_lock);
    if (m->notify_stop) break;
    struct notice *n = m->notify_head;
    m->notify_head = n->next;
    if (!m->notify_head) m->notify_tail = NULL;
    pthread_mutex_unlock(&m->notify_lock);
    // May wait in the kernel (for a page a read holds locked, for the folder's lock while a lookup in it
    // runs) until the JS thread answers that request: which is why this is not the JS thread. -ENOENT:
    // the kernel no longer holds the inode or name, nothing to drop.
    int res = n->entry ? fuse_lowlevel_notify_inval_entry(m->se, n->ino, n->name, n->namelen) : fuse_lowlevel_notify_inval_inode(m->se, n->ino, 0, 0);
    if (!n->entry && res == 0 && !m->notify_tsfn_gone) {
      // JavaScript may now let an open read the new generation: the kernel asks for the size again.
      // Never blocking: a full queue would have this thread wait for the JS thread, which may be waiting
      // to join it; a lost message only keeps the old generation until the attribute timeout.
      struct msg *msg = malloc(sizeof *msg);
      if (msg) {
        memset(msg, 0, sizeof *msg);
        msg->op = OP_INVALIDATED;
        msg->ino = n->ino;
        napi_status st = napi_call_threadsafe_function(m->tsfn, msg, napi_tsfn_nonblocking);
        if (st != napi_ok) free(msg);
        if (st == napi_closing) m->notify_tsfn_gone = 1;
      }
    }
    free(n);
    pthread_mutex_lock(&m->notify_lock);
  }
  // The session has ended: what is left would reach no kernel.
  while (m->notify_head) {
    struct notice *n = m->notify_head;
    m->notify_head = n->next;
    free(n);
  }
  m->notify_tail = NULL;
  pthread_mutex_unlock(&m->notify_lock);
  if (!m->notify_tsfn_gone) napi_release_threadsafe_function(m->tsfn, napi_tsfn_release);
  return NULL;
}

// Ends the notify thread (JS thread, once the receive loop has ended and before the session and the
// threadsafe function go): a notification in progress fails at once on a connection that has ended.
static void stop_notify(struct mount *m) {
  if (!m->notify_started) return;
  pthread_mutex_lock(&m->notify_lock);
  m->notify_stop = 1;
  pthread_cond_signal(&m->notify_wake);
  pthread_mutex_unlock(&m->notify_lock);
  pthread_join(m->notify_thread, NULL);
  m->notify_started = 0;
}

// Queues a notice; false once the session has ended (nothing to invalidate any more).
static int enqueue_notice(struct mount *m, uint64_t ino, const char *name, size_t namelen) {
  struct notice *n = malloc(sizeof *n + namelen + 1);
  if (!n) return 0;
  n->next = NULL;
  n->ino = ino;
  n->entry = name != NULL;
  n->namelen = namelen;
  if (name) memcpy(n->name, name, namelen);
  n->name[namelen] = 0;
  pthread_mutex_lock(&m->notify_lock);
  int ok = m->notify_started && !m->notify_stop;
  if (ok) {
    if (m->notify_tail) m->notify_tail->next = n;
    else m->notify_head = n;
    m->notify_tail = n;
    pthread_cond_signal(&m->notify_wake);
  }
  pthread_mutex_unlock(&m->notify_lock);
  if (!ok) free(n);
  return ok;
}

// ------------------------------------------------------------------ JS thread side

#define CHECK(call)                                                              \
  do {                                                                           \
    if ((call) != napi_ok) {                                                     \
      napi_throw_error(env, NULL, "gcsmount_fuse: " #call " failed");           \
      return NULL;                                                               \
    }                                                                            \
  } while (0)

static void maybe_destroy(struct mount *m) {
  if (m->destroyed || !m->loop_ended || atomic_load(&m->outstanding) > 0) return;
  m->destroyed = 1;
  pthread_join(m->thread, NULL);
  fuse_session_unmount(m->se);
  fuse_session_destroy(m->se);
  m->se = NULL;
}

static void answered(struct req_ref *r) {
  r->answered = 1;
  atomic_fetch_sub(&r->m->outstanding, 1);
  maybe_destroy(r->m);
}

static void req_finalize(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  struct req_ref *r = data;
  // Dropped without an answer (a bug in JavaScript): the kernel must not wait for ever.
  if (!r->answered) {
    fuse_reply_err(r->req, EIO);
    answered(r);
  }
  free(r);
}

static void call_js(napi_env env, napi_value js_cb, void *context, void *data) {
  struct mount *m = context;
  struct msg *msg = data;
  if (env == NULL) {
    // The threadsafe function is being torn down with this message still queued.
    if (msg->req) {
      fuse_reply_err(msg->req, EIO);
      atomic_fetch_sub(&m->outstanding, 1);
    }
    free(msg);
    return;
  }
  if (msg->op == OP_EXITED) {
    // Before anything can destroy the session (an answer below may), and before the queue is let go.
    stop_notify(m);
    m->loop_ended = 1;
  }
  napi_value argv[8], undefined;
  napi_get_undefined(env, &undefined);
  napi_create_int32(env, msg->op, &argv[0]);
  if (msg->req) {
    struct req_ref *r = malloc(sizeof *r);
    if (!r) {
      fuse_reply_err(msg->req, ENOMEM);
      atomic_fetch_sub(&m->outstanding, 1);
      free(msg);
      return;
    }
    r->req = msg->req;
    r->m = m;
    r->answered = 0;
    napi_create_external(env, r, req_finalize, NULL, &argv[1]);
  } else {
    argv[1] = undefined;
  }
  napi_create_double(env, (double)msg->ino, &argv[2]);
  napi_create_double(env, (double)msg->a, &argv[3]);
  napi_create_double(env, (double)msg->b, &argv[4]);
  napi_create_double(env, (double)msg->c, &argv[5]);
  if (msg->has_name) napi_create_string_utf8(env, msg->name, NAPI_AUTO_LENGTH, &argv[6]);
  else argv[6] = undefined;
  napi_create_int32(env, msg->reason, &argv[7]);
  int msg_op = msg->op;
  free(msg);
  napi_call_function(env, undefined, js_cb, 8, argv, NULL);
  if (msg_op == OP_EXITED) {
    // Nothing sends any more (the notify thread has ended): let the queue go, so it no longer keeps the
    // process alive.
    napi_release_threadsafe_function(m->tsfn, napi_tsfn_release);
    maybe_destroy(m);
  }
}

// Takes the request out of argv[0]; throws for a handle already answered.
static struct req_ref *take_req(napi_env env, napi_value v) {
  struct req_ref *r = NULL;
  if (napi_get_value_external(env, v, (void **)&r) != napi_ok || r == NULL) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: not a request handle");
    return NULL;
  }
  if (r->answered) {
    napi_throw_error(env, "ERR_FUSE_ANSWERED", "gcsmount_fuse: request answered twice");
    return NULL;
  }
  return r;
}

static double num(napi_env env, napi_value v) {
  double d = 0;
  napi_get_value_double(env, v, &d);
  return d;
}

static void args_of(napi_env env, napi_callback_info info, size_t want, napi_value *argv) {
  size_t argc = want;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  for (size_t i = argc; i < want; i++) napi_get_undefined(env, &argv[i]);
}

// Times are whole milliseconds (GCS's resolution): split in integers, since ms / 1000 in floating point
// would show 0.258 s as 257999999 ns, a millisecond early.
static void set_time(struct timespec *ts, double ms) {
  int64_t whole = (int64_t)(ms + (ms >= 0 ? 0.5 : -0.5));
  ts->tv_sec = (time_t)(whole / 1000);
  ts->tv_nsec = (long)(whole % 1000) * 1000000L;
  if (ts->tv_nsec < 0) {
    ts->tv_sec -= 1;
    ts->tv_nsec += 1000000000L;
  }
}

// Attributes as JavaScript gives them: [ino, mode, nlink, uid, gid, size, mtimeMs].
static void stat_of(const double *v, struct stat *st) {
  memset(st, 0, sizeof *st);
  st->st_ino = (ino_t)v[0];
  st->st_mode = (mode_t)v[1];
  st->st_nlink = (nlink_t)v[2];
  st->st_uid = (uid_t)v[3];
  st->st_gid = (gid_t)v[4];
  st->st_size = (off_t)v[5];
  st->st_blocks = (blkcnt_t)((st->st_size + 511) / 512);
  st->st_blksize = 1 << 20;
  set_time(&st->st_mtim, v[6]);
  st->st_atim = st->st_mtim;
  st->st_ctim = st->st_mtim;
}

// attr from a JS array
static int fill_stat(napi_env env, napi_value arr, struct stat *st) {
  double v[7];
  for (uint32_t i = 0; i < 7; i++) {
    napi_value e;
    if (napi_get_element(env, arr, i, &e) != napi_ok) return -1;
    v[i] = num(env, e);
  }
  stat_of(v, st);
  return 0;
}

// replyErr(req, errno)
static napi_value reply_err(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  args_of(env, info, 2, argv);
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  fuse_reply_err(r->req, (int)num(env, argv[1]));
  answered(r);
  return NULL;
}

// replyEntry(req, attr, entryTimeoutSec, attrTimeoutSec): attr null is a negative entry (ino 0).
// Returns 0, or -errno when the kernel did not take the answer.
static napi_value reply_entry(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  args_of(env, info, 4, argv);
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  struct fuse_entry_param e;
  memset(&e, 0, sizeof e);
  napi_valuetype t;
  napi_typeof(env, argv[1], &t);
  if (t == napi_object && fill_stat(env, argv[1], &e.attr) != 0) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: bad attributes");
    return NULL;
  }
  e.ino = e.attr.st_ino;
  e.generation = 1;
  e.entry_timeout = num(env, argv[2]);
  e.attr_timeout = num(env, argv[3]);
  // Not 0 when the kernel no longer waited for it (an interrupted request): the lookup did not count.
  int res = fuse_reply_entry(r->req, &e);
  answered(r);
  napi_value out;
  napi_create_int32(env, res, &out);
  return out;
}

// replyAttr(req, attr, attrTimeoutSec)
static napi_value reply_attr(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  args_of(env, info, 3, argv);
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  struct stat st;
  if (fill_stat(env, argv[1], &st) != 0) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: bad attributes");
    return NULL;
  }
  fuse_reply_attr(r->req, &st, num(env, argv[2]));
  answered(r);
  return NULL;
}

#define OPEN_KEEP_CACHE 1
#define OPEN_CACHE_READDIR 2
#define OPEN_DIRECT_IO 4

// A native file handle as JavaScript holds it, tagged so that no other external passes for one.
static const napi_type_tag FILE_TAG = {0x6763736d6f756e74ULL, 0x62725f66696c6531ULL};

static struct br_file *file_arg(napi_env env, napi_value v) {
  bool ok = false;
  struct br_file *f = NULL;
  if (napi_check_object_type_tag(env, v, &FILE_TAG, &ok) != napi_ok || !ok || napi_get_value_external(env, v, (void **)&f) != napi_ok || !f) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: not a native file");
    return NULL;
  }
  return f;
}

// replyOpen(req, fh, flags, file?): flags OPEN_KEEP_CACHE | OPEN_CACHE_READDIR | OPEN_DIRECT_IO. A file's
// open passes its native file (nativeFile()), which the kernel's handle then names; a folder's need not.
// Returns 0, or -errno when the kernel did not take the answer.
static napi_value reply_open(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  args_of(env, info, 4, argv);
  napi_valuetype t;
  napi_typeof(env, argv[3], &t);
  struct br_file *f = NULL;
  if (t != napi_undefined && !(f = file_arg(env, argv[3]))) return NULL;
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  struct fuse_file_info fi;
  memset(&fi, 0, sizeof fi);
  fi.fh = (uint64_t)num(env, argv[1]);
  unsigned flags = (unsigned)num(env, argv[2]);
  fi.keep_cache = (flags & OPEN_KEEP_CACHE) != 0;
  fi.cache_readdir = (flags & OPEN_CACHE_READDIR) != 0;
  fi.direct_io = (flags & OPEN_DIRECT_IO) != 0;
  fi.noflush = 1; // nothing is ever written back: close(2) need not wait for us
  // The kernel's reference, dropped at release(dir); a folder (or a file opened without one) gets a
  // struct of its own, which registers nothing, so that every fi->fh names one.
  if (f) br_file_ref(f);
  else if (!(f = br_file_new(fi.fh, 0, 0))) {
    fuse_reply_err(r->req, ENOMEM);
    answered(r);
    return NULL;
  }
  fi.fh = (uint64_t)(uintptr_t)f;
  int res = fuse_reply_open(r->req, &fi);
  if (res != 0) br_file_unref(f); // no release will come for an open the kernel did not take
  answered(r);
  napi_value out;
  napi_create_int32(env, res, &out);
  return out;
}

static void file_finalize(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  br_file_unref(data);
}

// nativeFile(fh, size, blockSize): an open file's native side, for replyOpen, addBlocks and readNative.
static napi_value native_file(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  args_of(env, info, 3, argv);
  struct br_file *f = br_file_new((uint64_t)num(env, argv[0]), (uint64_t)num(env, argv[1]), (uint64_t)num(env, argv[2]));
  if (!f) {
    napi_throw_error(env, NULL, "gcsmount_fuse: out of memory");
    return NULL;
  }
  napi_value out;
  if (napi_create_external(env, f, file_finalize, NULL, &out) != napi_ok) {
    br_file_unref(f);
    napi_throw_error(env, NULL, "gcsmount_fuse: cannot create a native file");
    return NULL;
  }
  napi_type_tag_object(env, out, &FILE_TAG);
  return out;
}

// addBlocks(file, first, keys, crcs): block first + i of the file is block file keys[i], CRC32C crcs[i].
static napi_value add_blocks(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  args_of(env, info, 4, argv);
  struct br_file *f = file_arg(env, argv[0]);
  if (!f) return NULL;
  double first = num(env, argv[1]);
  uint32_t n = 0;
  napi_get_array_length(env, argv[2], &n);
  for (uint32_t i = 0; i < n; i++) {
    napi_value k, c;
    char key[BR_KEY_LEN + 2];
    size_t len = 0;
    napi_get_element(env, argv[2], i, &k);
    napi_get_element(env, argv[3], i, &c);
    if (napi_get_value_string_utf8(env, k, key, sizeof key, &len) != napi_ok || len != BR_KEY_LEN) {
      napi_throw_type_error(env, NULL, "gcsmount_fuse: a block key is 32 hex digits");
      return NULL;
    }
    br_file_add(f, (uint64_t)first + i, key, (uint32_t)num(env, c));
  }
  return NULL;
}

// preloadBlock(key, crc, length): a worker loads that block file into memory before a read asks for it.
// Returns whether it was queued (not when in memory already, or the native path is not running).
static napi_value preload_block(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  args_of(env, info, 3, argv);
  char key[BR_KEY_LEN + 2];
  size_t len = 0;
  if (napi_get_value_string_utf8(env, argv[0], key, sizeof key, &len) != napi_ok || len != BR_KEY_LEN) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: a block key is 32 hex digits");
    return NULL;
  }
  napi_value out;
  napi_get_boolean(env, br_preload(key, (uint32_t)num(env, argv[1]), (uint32_t)num(env, argv[2])), &out);
  return out;
}

// readNative(req, ino, file, pos, size): hands a read to the native path. True: the request is answered
// (by a worker); false: a block it spans is not registered, and the request is still the caller's.
static napi_value read_native(napi_env env, napi_callback_info info) {
  napi_value argv[5];
  args_of(env, info, 5, argv);
  struct br_file *f = file_arg(env, argv[2]);
  if (!f) return NULL;
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  bool handed = false;
  if (br_started() && native_begin(r->m)) {
    handed = br_submit(r->req, (uint64_t)num(env, argv[1]), f, (uint64_t)num(env, argv[3]), (size_t)num(env, argv[4]));
    if (handed) answered(r);
    else native_end(r->m);
  }
  napi_value out;
  napi_get_boolean(env, handed, &out);
  return out;
}

static double opt_num(napi_env env, napi_value obj, const char *name, double fallback) {
  napi_value v;
  napi_valuetype t;
  if (napi_get_named_property(env, obj, name, &v) != napi_ok || napi_typeof(env, v, &t) != napi_ok || t != napi_number) return fallback;
  return num(env, v);
}

// startNativeReads({dir, blockSize, slots, workers, direct}): once per process. True when running.
static napi_value start_native_reads(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  args_of(env, info, 1, argv);
  char dir[4096];
  size_t len = 0;
  napi_value v;
  bool direct = true;
  if (napi_get_named_property(env, argv[0], "dir", &v) != napi_ok || napi_get_value_string_utf8(env, v, dir, sizeof dir, &len) != napi_ok) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: startNativeReads wants {dir}");
    return NULL;
  }
  if (napi_get_named_property(env, argv[0], "direct", &v) == napi_ok) napi_get_value_bool(env, v, &direct);
  struct br_config cfg = {
      .dir = dir,
      .block_size = (size_t)opt_num(env, argv[0], "blockSize", 0),
      .slots = (unsigned)opt_num(env, argv[0], "slots", 0),
      .workers = (unsigned)opt_num(env, argv[0], "workers", 0),
      .direct = direct,
  };
  struct br_hooks hooks = {.fallback = native_fallback, .done = native_done};
  napi_value out;
  napi_get_boolean(env, br_start(&cfg, &hooks) == 0, &out);
  return out;
}

// nativeStats(): [reads, readBytes, fallbacks, blockLoads, blockLoadBytes, blocksInMemory, blockHits, blockHitBytes, readNs]
static napi_value native_stats(napi_env env, napi_callback_info info) {
  (void)info;
  uint64_t s[BR_NSTATS];
  br_stats(s);
  napi_value out;
  napi_create_array_with_length(env, BR_NSTATS, &out);
  for (uint32_t i = 0; i < BR_NSTATS; i++) {
    napi_value e;
    napi_create_double(env, (double)s[i], &e);
    napi_set_element(env, out, i, e);
  }
  return out;
}

// nativeMaintain(idleSecs): keys of the block files read since the last call; frees idle block memory.
static napi_value native_maintain(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  args_of(env, info, 1, argv);
  enum { MAX = 8192 };
  char(*keys)[BR_KEY_LEN + 1] = malloc(MAX * sizeof *keys);
  napi_value out;
  napi_create_array(env, &out);
  if (!keys) return out;
  unsigned n = br_maintain(keys, MAX, (unsigned)num(env, argv[0]));
  for (unsigned i = 0; i < n; i++) {
    napi_value k;
    napi_create_string_utf8(env, keys[i], BR_KEY_LEN, &k);
    napi_set_element(env, out, i, k);
  }
  free(keys);
  return out;
}

// raiseFileLimit(): lifts the soft RLIMIT_NOFILE to the hard one (every open block file, socket and
// reader costs a descriptor; a daemon at its limit falls back to GCS for cached blocks). Returns the
// limits now in force, [soft, hard], -1 for unlimited.
static napi_value raise_file_limit(napi_env env, napi_callback_info info) {
  (void)info;
  struct rlimit lim = {0, 0};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != lim.rlim_max) {
    struct rlimit want = {lim.rlim_max, lim.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) lim = want;
  }
  napi_value out, v;
  napi_create_array_with_length(env, 2, &out);
  napi_create_double(env, lim.rlim_cur == RLIM_INFINITY ? -1 : (double)lim.rlim_cur, &v);
  napi_set_element(env, out, 0, v);
  napi_create_double(env, lim.rlim_max == RLIM_INFINITY ? -1 : (double)lim.rlim_max, &v);
  napi_set_element(env, out, 1, v);
  return out;
}

// crc32c(buffer, crc = 0): the CRC32C the native path checks blocks with; JavaScript checks with it too (src/crc32c.ts).
static napi_value crc32c_js(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  args_of(env, info, 2, argv);
  void *data = NULL;
  size_t len = 0;
  if (napi_get_buffer_info(env, argv[0], &data, &len) != napi_ok) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: crc32c wants a Buffer");
    return NULL;
  }
  napi_value out;
  napi_create_uint32(env, crc32c((uint32_t)num(env, argv[1]), data, len), &out);
  return out;
}

// The whole `align`-aligned span [*from, *to) inside the ArrayBuffer of argument 0, for madvise; false
// (a TypeError thrown, naming `fn`) when the argument is not an ArrayBuffer.
static int aligned_span(napi_env env, napi_callback_info info, uintptr_t align, const char *fn, uintptr_t *from, uintptr_t *to) {
  napi_value argv[1];
  args_of(env, info, 1, argv);
  void *data = NULL;
  size_t len = 0;
  if (napi_get_arraybuffer_info(env, argv[0], &data, &len) != napi_ok) {
    char msg[96];
    snprintf(msg, sizeof msg, "gcsmount_fuse: %s wants an ArrayBuffer", fn);
    napi_throw_type_error(env, NULL, msg);
    return 0;
  }
  *from = ((uintptr_t)data + align - 1) & ~(align - 1);
  *to = ((uintptr_t)data + len) & ~(align - 1);
  return 1;
}

// adviseHugePages(arrayBuffer): asks for transparent huge pages (MADV_HUGEPAGE) over the 2 MiB-aligned
// part of the memory; returns the bytes advised (0 where refused). For JavaScript's block buffers, which
// GCS downloads are copied into, O_DIRECT writes pin and FUSE replies pin and copy from: per 4 KiB page
// the pinning cost as much as a third of the kernel's time on a cold read, and first touches fault per
// page (the native path's own memory does the same, block_reads.c).
static napi_value advise_huge_pages(napi_env env, napi_callback_info info) {
  uintptr_t from, to;
  if (!aligned_span(env, info, (uintptr_t)2 << 20, "adviseHugePages", &from, &to)) return NULL;
  double advised = 0;
  if (to > from && madvise((void *)from, to - from, MADV_HUGEPAGE) == 0) advised = (double)(to - from);
  napi_value out;
  napi_create_double(env, advised, &out);
  return out;
}

// discardMemory(arrayBuffer): gives its pages back to the system now (MADV_DONTNEED), ahead of the
// garbage collector; the memory reads as zeros if touched again. For block memory nobody holds.
static napi_value discard_memory(napi_env env, napi_callback_info info) {
  uintptr_t from, to;
  if (!aligned_span(env, info, (uintptr_t)sysconf(_SC_PAGESIZE), "discardMemory", &from, &to)) return NULL;
  napi_value out;
  napi_get_boolean(env, to > from && madvise((void *)from, to - from, MADV_DONTNEED) == 0, &out);
  return out;
}

// trimMalloc(): gives the C heap's free pages back to the system (malloc_trim, which also returns free
// pages inside the heap, not only at its top). Socket buffers the garbage collector has just freed stay
// resident otherwise: glibc keeps freed memory for reuse. For a daemon gone idle.
static napi_value trim_malloc(napi_env env, napi_callback_info info) {
  (void)info;
  napi_value out;
  napi_get_boolean(env, malloc_trim(0) == 1, &out);
  return out;
}

// replyBuf(req, buffer, length): the kernel copies straight out of the Buffer's memory.
static napi_value reply_buf(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  args_of(env, info, 3, argv);
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  void *data = NULL;
  size_t len = 0;
  if (napi_get_buffer_info(env, argv[1], &data, &len) != napi_ok) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: replyBuf wants a Buffer");
    return NULL;
  }
  double n = num(env, argv[2]);
  if (n >= 0 && n < (double)len) len = (size_t)n;
  fuse_reply_buf(r->req, data, len);
  answered(r);
  return NULL;
}

// replyDir(req, names, inos, isDir, start, size): entries from index `start` that fit in `size` bytes;
// entry i has offset i + 1. Returns how many were sent.
static napi_value reply_dir(napi_env env, napi_callback_info info) {
  napi_value argv[6];
  args_of(env, info, 6, argv);
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  uint32_t count = 0;
  napi_get_array_length(env, argv[1], &count);
  uint32_t start = (uint32_t)num(env, argv[4]);
  size_t size = (size_t)num(env, argv[5]);
  char *buf = malloc(size ? size : 1);
  if (!buf) {
    fuse_reply_err(r->req, ENOMEM);
    answered(r);
    return NULL;
  }
  size_t used = 0;
  uint32_t i = start;
  char name[1024];
  for (; i < count; i++) {
    napi_value nv, iv, dv;
    size_t nlen = 0;
    napi_get_element(env, argv[1], i, &nv);
    napi_get_element(env, argv[2], i, &iv);
    napi_get_element(env, argv[3], i, &dv);
    if (napi_get_value_string_utf8(env, nv, name, sizeof name, &nlen) != napi_ok) break;
    bool dir = false;
    napi_get_value_bool(env, dv, &dir);
    struct stat st;
    memset(&st, 0, sizeof st);
    st.st_ino = (ino_t)num(env, iv);
    st.st_mode = dir ? S_IFDIR : S_IFREG;
    size_t need = fuse_add_direntry(r->req, buf + used, size - used, name, &st, (off_t)i + 1);
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(r->req, buf, used);
  free(buf);
  answered(r);
  napi_value out;
  napi_create_uint32(env, i - start, &out);
  return out;
}

static int is_dot(const char *name) { return name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0)); }

// replyDirPlus(req, names, attrs: Float64Array, start, size, entryTimeoutSec, attrTimeoutSec): the
// entries that fit in `size` bytes, names[i] at listing offset start + i + 1 with attributes attrs[7i..].
// Returns how many were sent, or -errno when the kernel did not take the reply. The kernel counts each
// entry it takes as a lookup of its inode, except those sent without one (inode 0): "." and "..", and
// entries whose ino JavaScript negated (the kernel holds them already, and keeps what it holds).
static napi_value reply_dir_plus(napi_env env, napi_callback_info info) {
  napi_value argv[7];
  args_of(env, info, 7, argv);
  napi_typedarray_type type;
  size_t nattrs = 0;
  void *data = NULL;
  if (napi_get_typedarray_info(env, argv[2], &type, &nattrs, &data, NULL, NULL) != napi_ok || type != napi_float64_array) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: replyDirPlus wants a Float64Array of attributes");
    return NULL;
  }
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  const double *attrs = data;
  uint32_t count = 0;
  napi_get_array_length(env, argv[1], &count);
  if ((size_t)count * 7 > nattrs) count = (uint32_t)(nattrs / 7);
  uint32_t start = (uint32_t)num(env, argv[3]);
  size_t size = (size_t)num(env, argv[4]);
  double entry_timeout = num(env, argv[5]), attr_timeout = num(env, argv[6]);
  char *buf = malloc(size ? size : 1);
  if (!buf) {
    fuse_reply_err(r->req, ENOMEM);
    answered(r);
    return NULL;
  }
  size_t used = 0;
  uint32_t i = 0;
  char name[1024];
  for (; i < count; i++) {
    napi_value nv;
    size_t nlen = 0;
    napi_get_element(env, argv[1], i, &nv);
    if (napi_get_value_string_utf8(env, nv, name, sizeof name, &nlen) != napi_ok) break;
    struct fuse_entry_param e;
    memset(&e, 0, sizeof e);
    double v[7];
    memcpy(v, attrs + 7 * (size_t)i, sizeof v);
    int bare = is_dot(name) || v[0] < 0;
    if (v[0] < 0) v[0] = -v[0];
    stat_of(v, &e.attr);
    e.ino = bare ? 0 : e.attr.st_ino;
    e.generation = 1;
    e.entry_timeout = entry_timeout;
    e.attr_timeout = attr_timeout;
    size_t need = fuse_add_direntry_plus(r->req, buf + used, size - used, name, &e, (off_t)(start + i) + 1);
    if (need > size - used) break;
    used += need;
  }
  int res = fuse_reply_buf(r->req, buf, used);
  free(buf);
  answered(r);
  napi_value out;
  napi_create_int32(env, res == 0 ? (int32_t)i : res, &out);
  return out;
}

static struct mount *session_arg(napi_env env, napi_value v) {
  struct mount *m = NULL;
  if (napi_get_value_external(env, v, (void **)&m) != napi_ok || !m) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: not a session");
    return NULL;
  }
  return m;
}

// invalidateInode(session, ino): queues dropping the kernel's attributes and pages of `ino`; an
// OP_INVALIDATED for it follows once the kernel has. Returns at once: false when the session has ended.
static napi_value invalidate_inode(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  args_of(env, info, 2, argv);
  struct mount *m = session_arg(env, argv[0]);
  if (!m) return NULL;
  napi_value out;
  napi_get_boolean(env, enqueue_notice(m, (uint64_t)num(env, argv[1]), NULL, 0), &out);
  return out;
}

// invalidateEntry(session, parentIno, name): queues dropping the kernel's entry for `name` in the folder
// `parentIno` (the next use of the name is a LOOKUP). Returns at once: false when the session has ended.
static napi_value invalidate_entry(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  args_of(env, info, 3, argv);
  struct mount *m = session_arg(env, argv[0]);
  if (!m) return NULL;
  char name[1024];
  size_t len = 0;
  if (napi_get_value_string_utf8(env, argv[2], name, sizeof name, &len) != napi_ok) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: invalidateEntry wants a name");
    return NULL;
  }
  napi_value out;
  napi_get_boolean(env, enqueue_notice(m, (uint64_t)num(env, argv[1]), name, len), &out);
  return out;
}

// replyStatfs(req, [bsize, frsize, blocks, bfree, bavail, files, ffree, favail, fsid, flag, namemax])
static napi_value reply_statfs(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  args_of(env, info, 2, argv);
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  double v[11];
  for (uint32_t i = 0; i < 11; i++) {
    napi_value e;
    napi_get_element(env, argv[1], i, &e);
    v[i] = num(env, e);
  }
  struct statvfs s;
  memset(&s, 0, sizeof s);
  s.f_bsize = (unsigned long)v[0];
  s.f_frsize = (unsigned long)v[1];
  s.f_blocks = (fsblkcnt_t)v[2];
  s.f_bfree = (fsblkcnt_t)v[3];
  s.f_bavail = (fsblkcnt_t)v[4];
  s.f_files = (fsfilcnt_t)v[5];
  s.f_ffree = (fsfilcnt_t)v[6];
  s.f_favail = (fsfilcnt_t)v[7];
  s.f_fsid = (unsigned long)v[8];
  s.f_flag = (unsigned long)v[9];
  s.f_namemax = (unsigned long)v[10];
  fuse_reply_statfs(r->req, &s);
  answered(r);
  return NULL;
}

static void tsfn_finalize(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  (void)data;
}

static napi_value throw_mount_error(napi_env env, const char *what) {
  char text[700];
  snprintf(text, sizeof text, "%s%s%s", what, last_log[0] ? ": " : "", last_log);
  napi_throw_error(env, "ERR_FUSE_MOUNT", text);
  return NULL;
}

// mount(mountPoint, options: string[] (argv for fuse_session_new), onRequest, {maxBackground,
// congestionThreshold, parallelDirops}) -> mount handle. Mounts and starts the receive thread.
static napi_value do_mount(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  args_of(env, info, 4, argv);
  char mountpoint[4096];
  size_t len = 0;
  CHECK(napi_get_value_string_utf8(env, argv[0], mountpoint, sizeof mountpoint, &len));
  uint32_t nopts = 0;
  CHECK(napi_get_array_length(env, argv[1], &nopts));
  char **fargv = calloc(nopts + 2, sizeof(char *));
  if (!fargv) return throw_mount_error(env, "out of memory");
  fargv[0] = strdup("gcsmount");
  for (uint32_t i = 0; i < nopts; i++) {
    napi_value e;
    size_t n = 0;
    napi_get_element(env, argv[1], i, &e);
    napi_get_value_string_utf8(env, e, NULL, 0, &n);
    fargv[i + 1] = malloc(n + 1);
    napi_get_value_string_utf8(env, e, fargv[i + 1], n + 1, &n);
  }
  struct mount *m = calloc(1, sizeof *m);
  napi_value v;
  m->max_background = 64;
  m->congestion_threshold = 48;
  m->want_parallel_dirops = 1;
  if (napi_get_named_property(env, argv[3], "maxBackground", &v) == napi_ok) {
    double d = num(env, v);
    if (d > 0) m->max_background = (unsigned)d;
  }
  if (napi_get_named_property(env, argv[3], "congestionThreshold", &v) == napi_ok) {
    double d = num(env, v);
    if (d > 0) m->congestion_threshold = (unsigned)d;
  }
  if (napi_get_named_property(env, argv[3], "parallelDirops", &v) == napi_ok) {
    bool b = true;
    if (napi_get_value_bool(env, v, &b) == napi_ok) m->want_parallel_dirops = b;
  }
  atomic_init(&m->outstanding, 0);
  atomic_init(&m->patch_init_reply, 0);
  pthread_mutex_init(&m->native_lock, NULL);
  pthread_cond_init(&m->native_idle, NULL);
  pthread_mutex_init(&m->notify_lock, NULL);
  pthread_cond_init(&m->notify_wake, NULL);

  last_log[0] = 0;
  log_to_stderr = getenv("GCSMOUNT_FUSE_DEBUG") != NULL;
  fuse_set_log_func(log_to_buffer);
  struct fuse_args args = FUSE_ARGS_INIT((int)nopts + 1, fargv);
  m->se = fuse_session_new(&args, &ll_ops, sizeof ll_ops, m);
  fuse_opt_free_args(&args);
  for (uint32_t i = 0; i <= nopts; i++) free(fargv[i]);
  free(fargv);
  if (!m->se) {
    free(m);
    return throw_mount_error(env, "libfuse3 refused the options");
  }
  if (fuse_session_mount(m->se, mountpoint) != 0) {
    fuse_session_destroy(m->se);
    free(m);
    return throw_mount_error(env, "cannot mount");
  }
  // The same /dev/fuse descriptor, read and written through dev_read/dev_writev.
  if (fuse_session_custom_io(m->se, &dev_io, fuse_session_fd(m->se)) != 0) {
    fuse_session_unmount(m->se);
    fuse_session_destroy(m->se);
    free(m);
    return throw_mount_error(env, "cannot set up /dev/fuse I/O");
  }
  napi_value name;
  napi_create_string_utf8(env, "gcsmount_fuse", NAPI_AUTO_LENGTH, &name);
  // 1024 requests queued for JavaScript at most; past that the receive thread waits.
  if (napi_create_threadsafe_function(env, argv[2], NULL, name, 1024, 1, NULL, tsfn_finalize, m, call_js, &m->tsfn) != napi_ok) {
    fuse_session_unmount(m->se);
    fuse_session_destroy(m->se);
    free(m);
    return throw_mount_error(env, "cannot create the request queue");
  }
  if (pthread_create(&m->thread, NULL, receive_loop, m) != 0) {
    napi_release_threadsafe_function(m->tsfn, napi_tsfn_abort);
    fuse_session_unmount(m->se);
    fuse_session_destroy(m->se);
    free(m);
    return throw_mount_error(env, "cannot start the receive thread");
  }
  m->thread_started = 1;
  // The notify thread holds the request queue too (for OP_INVALIDATED). Without it the mount works,
  // and invalidations are refused (the kernel's caches then expire by their timeouts alone).
  if (napi_acquire_threadsafe_function(m->tsfn) == napi_ok) {
    if (pthread_create(&m->notify_thread, NULL, notify_loop, m) == 0) m->notify_started = 1;
    else napi_release_threadsafe_function(m->tsfn, napi_tsfn_release);
  }
  napi_value out;
  // The handle lives as long as the process: the session may outlive every JS reference to it.
  CHECK(napi_create_external(env, m, NULL, NULL, &out));
  return out;
}

#define EXPORT(name, fn)                                                   \
  do {                                                                     \
    napi_value f;                                                          \
    CHECK(napi_create_function(env, name, NAPI_AUTO_LENGTH, fn, NULL, &f)); \
    CHECK(napi_set_named_property(env, exports, name, f));                 \
  } while (0)

static napi_value init(napi_env env, napi_value exports) {
  EXPORT("mount", do_mount);
  EXPORT("replyErr", reply_err);
  EXPORT("replyEntry", reply_entry);
  EXPORT("replyAttr", reply_attr);
  EXPORT("replyOpen", reply_open);
  EXPORT("replyBuf", reply_buf);
  EXPORT("replyDir", reply_dir);
  EXPORT("replyDirPlus", reply_dir_plus);
  EXPORT("invalidateInode", invalidate_inode);
  EXPORT("invalidateEntry", invalidate_entry);
  EXPORT("replyStatfs", reply_statfs);
  EXPORT("nativeFile", native_file);
  EXPORT("addBlocks", add_blocks);
  EXPORT("readNative", read_native);
  EXPORT("startNativeReads", start_native_reads);
  EXPORT("nativeStats", native_stats);
  EXPORT("preloadBlock", preload_block);
  EXPORT("nativeMaintain", native_maintain);
  EXPORT("crc32c", crc32c_js);
  EXPORT("raiseFileLimit", raise_file_limit);
  EXPORT("adviseHugePages", advise_huge_pages);
  EXPORT("discardMemory", discard_memory);
  EXPORT("trimMalloc", trim_malloc);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
