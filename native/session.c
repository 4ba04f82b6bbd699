// A mount's session: mounting, the receive thread (reads requests from /dev/fuse and never waits for
// JavaScript), the queue that hands requests to the JS thread, the notify thread that sends the kernel
// its cache invalidations, and the session's end. The session outlives its mount until every request
// handed to JavaScript is answered, so a reply after an unmount is harmless (the kernel has forgotten it).

#include "mount.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

// A kernel cache invalidation waiting for the notify thread: an inode's attributes and pages (entry 0),
// or the name `name` in the folder `ino` (entry 1).
struct notice {
  struct notice *next;
  uint64_t ino;
  int entry;
  size_t namelen;
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

void msg_send(struct mount *m, struct msg *msg) {
  if (msg->req) atomic_fetch_add(&m->outstanding, 1);
  if (napi_call_threadsafe_function(m->tsfn, msg, napi_tsfn_blocking) != napi_ok) {
    // JavaScript is going away: answer here, so nothing waits for it.
    if (msg->req) {
      atomic_fetch_sub(&m->outstanding, 1);
      fuse_reply_err(msg->req, EIO);
    }
    free(msg->data);
    free(msg);
  }
}

struct msg *msg_new(int op, fuse_req_t req, uint64_t ino, uint64_t a, uint64_t b, uint64_t c, const char *name, const char *name2) {
  size_t len = name ? strlen(name) + 1 : 0, len2 = name2 ? strlen(name2) + 1 : 0;
  struct msg *msg = malloc(sizeof *msg + len + len2);
  if (!msg) return NULL;
  msg->next = NULL;
  msg->op = op;
  msg->req = req;
  msg->ino = ino;
  msg->a = a;
  msg->b = b;
  msg->c = c;
  msg->reason = 0;
  msg->names = name ? (name2 ? 2 : 1) : 0;
  msg->data = NULL;
  msg->data_len = 0;
  if (name) memcpy(msg->name, name, len);
  if (name2) memcpy(msg->name + len, name2, len2);
  return msg;
}

void forward_reason(struct mount *m, int op, fuse_req_t req, uint64_t ino, uint64_t a, uint64_t b, uint64_t c, const char *name, int reason) {
  struct msg *msg = msg_new(op, req, ino, a, b, c, name, NULL);
  if (!msg) {
    if (req) fuse_reply_err(req, ENOMEM);
    return;
  }
  msg->reason = reason;
  msg_send(m, msg);
}

void forward_full(struct mount *m, int op, fuse_req_t req, uint64_t ino, uint64_t a, uint64_t b, uint64_t c, const char *name, const char *name2, const void *data, size_t data_len) {
  send_deferred(m);
  struct msg *msg = msg_new(op, req, ino, a, b, c, name, name2);
  // libfuse reuses its buffer for the next request once this returns: the bytes are copied.
  if (msg && data) {
    msg->data = malloc(data_len ? data_len : 1);
    if (msg->data) {
      memcpy(msg->data, data, data_len);
      msg->data_len = data_len;
    } else {
      free(msg);
      msg = NULL;
    }
  }
  if (!msg) {
    if (req) fuse_reply_err(req, ENOMEM);
    return;
  }
  msg_send(m, msg);
}

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
  deferred_wait(userdata, fd);
  return read(fd, buf, len);
}

static const struct fuse_custom_io dev_io = {.writev = dev_writev, .read = dev_read};

static void *receive_loop(void *arg) {
  struct mount *m = arg;
  fuse_session_loop(m->se);
  pthread_mutex_lock(&m->native_lock);
  m->exiting = 1;
  pthread_mutex_unlock(&m->native_lock);
  // Reads waiting for a block on its way to disk go back to JavaScript now (no read parks from here
  // on): else the end of the session would wait on a download.
  br_release_waiting(m);
  pthread_mutex_lock(&m->native_lock);
  while (m->native_jobs > 0) pthread_cond_wait(&m->native_idle, &m->native_lock);
  pthread_mutex_unlock(&m->native_lock);
  forward(m, OP_EXITED, NULL, 0, 0, 0, 0, NULL);
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

void maybe_destroy(struct mount *m) {
  if (m->destroyed || !m->loop_ended || atomic_load(&m->outstanding) > 0) return;
  m->destroyed = 1;
  pthread_join(m->thread, NULL);
  fuse_session_unmount(m->se);
  fuse_session_destroy(m->se);
  m->se = NULL;
}

static void free_data(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  free(data);
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
    free(msg->data);
    free(msg);
    return;
  }
  if (msg->op == OP_EXITED) {
    // Before anything can destroy the session (an answer below may), and before the queue is let go.
    stop_notify(m);
    m->loop_ended = 1;
  }
  napi_value argv[10], undefined;
  napi_get_undefined(env, &undefined);
  napi_create_int32(env, msg->op, &argv[0]);
  if (msg->req) {
    if (!req_handle(env, m, msg->req, &argv[1])) {
      fuse_reply_err(msg->req, ENOMEM);
      atomic_fetch_sub(&m->outstanding, 1);
      free(msg->data);
      free(msg);
      return;
    }
  } else {
    argv[1] = undefined;
  }
  napi_create_double(env, (double)msg->ino, &argv[2]);
  napi_create_double(env, (double)msg->a, &argv[3]);
  napi_create_double(env, (double)msg->b, &argv[4]);
  napi_create_double(env, (double)msg->c, &argv[5]);
  if (msg->names > 0) napi_create_string_utf8(env, msg->name, NAPI_AUTO_LENGTH, &argv[6]);
  else argv[6] = undefined;
  napi_create_int32(env, msg->reason, &argv[7]);
  if (msg->names > 1) napi_create_string_utf8(env, msg->name + strlen(msg->name) + 1, NAPI_AUTO_LENGTH, &argv[8]);
  else argv[8] = undefined;
  argv[9] = undefined;
  // The bytes become the Buffer's, freed when JavaScript lets go of it (no copy).
  if (msg->data && napi_create_external_buffer(env, msg->data_len, msg->data, free_data, NULL, &argv[9]) == napi_ok) msg->data = NULL;
  free(msg->data);
  int msg_op = msg->op;
  free(msg);
  napi_call_function(env, undefined, js_cb, 10, argv, NULL);
  if (msg_op == OP_EXITED) {
    // Nothing sends any more (the notify thread has ended): let the queue go, so it no longer keeps the
    // process alive.
    napi_release_threadsafe_function(m->tsfn, napi_tsfn_release);
    maybe_destroy(m);
  }
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
  if (napi_get_named_property(env, argv[3], "readHandlesBelow", &v) == napi_ok) {
    double d = num(env, v);
    if (d > 0) m->read_handles_below = (uint64_t)d;
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

int session_exports(napi_env env, napi_value exports) {
  EXPORT("mount", do_mount);
  EXPORT("invalidateInode", invalidate_inode);
  EXPORT("invalidateEntry", invalidate_entry);
  return 1;
}
