// What the addon's files share: the mount, the messages its threads hand to JavaScript, and the functions
// one file calls in another (gcsmount_fuse.c says which file holds what).
#pragma once
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>
#include <node_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "block_reads.h"

// Functions shared between the addon's files stay out of the .node's dynamic symbols: the addon is
// loaded into Node's process, and a global named like another library's function would be one name
// for two things.
#pragma GCC visibility push(hidden)

// The operations handed to JavaScript; keep in step with OP in src/fs/kernel.ts.
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
  // writes (ll_ops.c's writes group)
  OP_CREATE = 13,
  OP_WRITE = 14,
  OP_FLUSH = 15,
  OP_FSYNC = 16,
  OP_SETATTR = 17,
  OP_UNLINK = 18,
  OP_MKDIR = 19,
  OP_RMDIR = 20,
  OP_RENAME = 21,
  OP_MKNOD = 22,
  OP_READLINK = 23,
  OP_SYMLINK = 24,
  OP_EXITED = 100, // the receive loop has ended (unmounted, or the connection aborted)
};

struct mount;

struct notice; // an invalidation queued for the notify thread (session.c)

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
  // Messages that need no answer (releases answered here, forgets), kept on the receive thread until it
  // next hands JavaScript a request, or idles (deferred.c). Only the receive thread touches these.
  struct msg *deferred_head, *deferred_tail;
  unsigned deferred_count;
  uint64_t deferred_since_ns; // when the oldest was kept (CLOCK_MONOTONIC)
  uint64_t read_handles_below; // a read-only handle below this is a read handle of JavaScript's (0: none is)
};

// One request on its way to JavaScript. `name` is set for lookups and the other requests that name an
// entry, and for a read the native path gave back because of a damaged block (the block file's key;
// `reason` says what was wrong). A rename's new name follows the name's NUL
// (`names` 2). `data` (malloc'd, handed to JavaScript as a Buffer) is a write's bytes or a setattr's values.
struct msg {
  struct msg *next; // in the deferred list
  int op;
  fuse_req_t req;
  uint64_t ino;
  uint64_t a, b, c;
  int reason;
  int names;
  void *data;
  size_t data_len;
  char name[];
};

#define CHECK(call)                                                              \
  do {                                                                           \
    if ((call) != napi_ok) {                                                     \
      napi_throw_error(env, NULL, "gcsmount_fuse: " #call " failed");           \
      return NULL;                                                               \
    }                                                                            \
  } while (0)

static inline struct mount *mount_of(fuse_req_t req) { return fuse_req_userdata(req); }

static inline double num(napi_env env, napi_value v) {
  double d = 0;
  napi_get_value_double(env, v, &d);
  return d;
}

static inline void args_of(napi_env env, napi_callback_info info, size_t want, napi_value *argv) {
  size_t argc = want;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  for (size_t i = argc; i < want; i++) napi_get_undefined(env, &argv[i]);
}

// Adds `fn` to the exports as `name`; false, with an exception pending, when N-API refuses.
static inline int export_fn(napi_env env, napi_value exports, const char *name, napi_callback fn) {
  napi_value f;
  if (napi_create_function(env, name, NAPI_AUTO_LENGTH, fn, NULL, &f) != napi_ok || napi_set_named_property(env, exports, name, f) != napi_ok) {
    napi_throw_error(env, NULL, "gcsmount_fuse: cannot export a function");
    return 0;
  }
  return 1;
}

#define EXPORT(name, fn)                             \
  do {                                               \
    if (!export_fn(env, exports, name, fn)) return 0; \
  } while (0)

// Each file adds its own N-API functions to the addon's exports (gcsmount_fuse.c's init calls these), so
// they stay static. False with an exception pending.
int session_exports(napi_env env, napi_value exports);
int replies_exports(napi_env env, napi_value exports);
int reply_later_exports(napi_env env, napi_value exports);
int block_write_exports(napi_env env, napi_value exports);
int native_path_exports(napi_env env, napi_value exports);
int log_socket_exports(napi_env env, napi_value exports);

// ll_ops.c: the low-level operations, which hand each request to JavaScript.
extern const struct fuse_lowlevel_ops ll_ops;

// session.c. forward_reason hands a request (or, req NULL, a notice) to JavaScript, never from the JS
// thread (a full queue blocks the caller until the JS thread takes from it). maybe_destroy destroys the
// session once its loop has ended and every request handed to JavaScript is answered. msg_new and
// msg_send are the two halves of forward_reason.
void forward_reason(struct mount *m, int op, fuse_req_t req, uint64_t ino, uint64_t a, uint64_t b, uint64_t c, const char *name, int reason);
struct msg *msg_new(int op, fuse_req_t req, uint64_t ino, uint64_t a, uint64_t b, uint64_t c, const char *name, const char *name2);
void msg_send(struct mount *m, struct msg *msg);
void maybe_destroy(struct mount *m);

// deferred.c, receive thread only: defer keeps a message that needs no answer; send_deferred sends those
// kept, in order, before the receive thread hands JavaScript anything else (forward, forward_full), so
// JavaScript sees every request in the kernel's order; deferred_wait has dev_read send them once the
// kernel has been quiet for a while, so none waits long.
void defer(struct mount *m, int op, uint64_t ino, uint64_t a);
void send_deferred(struct mount *m);
void deferred_wait(struct mount *m, int fd);

// The receive thread's way to JavaScript: messages kept for later go first.
static inline void forward(struct mount *m, int op, fuse_req_t req, uint64_t ino, uint64_t a, uint64_t b, uint64_t c, const char *name) {
  send_deferred(m);
  forward_reason(m, op, req, ino, a, b, c, name, 0);
}
// forward for the write requests: a second name (or NULL) and bytes copied for JavaScript (or NULL).
void forward_full(struct mount *m, int op, fuse_req_t req, uint64_t ino, uint64_t a, uint64_t b, uint64_t c, const char *name, const char *name2, const void *data, size_t data_len);

// replies.c: the handles JavaScript holds for requests. req_handle wraps a request for JavaScript (0 when
// out of memory); take_req takes it back out of a reply's argument, and answered marks it answered.
int req_handle(napi_env env, struct mount *m, fuse_req_t req, napi_value *out);
struct req_ref *take_req(napi_env env, napi_value v);
void answered(struct req_ref *r);
// A read's reply bytes: the Buffer's memory, cut to `length` when that is shorter; 0 with a TypeError
// pending when `buffer` is none.
int reply_bytes(napi_env env, napi_value buffer, napi_value length, void **data, size_t *len);

// native_path.c: a read held by the native path (native_begin is false once the receive loop has
// ended), and an open file's native side as JavaScript passes it.
int native_begin(struct mount *m);
void native_end(struct mount *m);
struct br_file *file_arg(napi_env env, napi_value v);

#pragma GCC visibility pop
