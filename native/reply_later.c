// replyBufLater: a read's reply sent from a libuv pool thread. The kernel's copy of a large reply (a
// megabyte into the reader's page cache pages) cost the JS thread about 0.8 ms per MiB, most of its time
// per cold chunk file: here the JS thread only queues it. Until the reply is sent the request counts as
// outstanding (the session outlives it), its handle and the Buffer are held by references, and JavaScript
// is told by its callback once the kernel has the bytes, so the memory behind the Buffer stays unchanged
// until then (a block's memory is pinned, a pooled buffer kept out of its pool).

#include "mount.h"

#include <stdlib.h>

struct later {
  napi_async_work work;
  napi_ref req, buf, done;
  struct req_ref *r;
  const void *data;
  size_t len;
};

static void later_send(napi_env env, void *data) {
  (void)env;
  struct later *l = data;
  fuse_reply_buf(l->r->req, l->data, l->len);
}

static void later_sent(napi_env env, napi_status status, void *data) {
  (void)status; // never cancelled: the reply was sent
  struct later *l = data;
  struct mount *m = l->r->m;
  napi_value done = NULL, undefined;
  napi_get_undefined(env, &undefined);
  napi_get_reference_value(env, l->done, &done);
  napi_delete_reference(env, l->done);
  napi_delete_reference(env, l->buf);
  napi_delete_reference(env, l->req);
  napi_delete_async_work(env, l->work);
  free(l);
  atomic_fetch_sub(&m->outstanding, 1);
  maybe_destroy(m);
  if (done) napi_call_function(env, undefined, done, 0, NULL, NULL);
}

// Where no pool thread can take it: sent here, and the callback follows as after any reply.
static void send_now(napi_env env, struct req_ref *r, const void *data, size_t len, napi_value done) {
  fuse_reply_buf(r->req, data, len);
  answered(r);
  napi_value undefined;
  napi_get_undefined(env, &undefined);
  napi_call_function(env, undefined, done, 0, NULL, NULL);
}

// replyBufLater(req, buffer, length, done): as replyBuf, the kernel copying on a pool thread; done() on
// the JS thread once it has. The Buffer's bytes must not change before then.
static napi_value reply_buf_later(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  args_of(env, info, 4, argv);
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  void *data = NULL;
  size_t len = 0;
  if (!reply_bytes(env, argv[1], argv[2], &data, &len)) return NULL;
  napi_valuetype t;
  if (napi_typeof(env, argv[3], &t) != napi_ok || t != napi_function) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: replyBufLater wants a function to call once sent");
    return NULL;
  }
  struct later *l = calloc(1, sizeof *l);
  napi_value name;
  if (!l || napi_create_string_utf8(env, "gcsmount reply", NAPI_AUTO_LENGTH, &name) != napi_ok ||
      napi_create_async_work(env, NULL, name, later_send, later_sent, l, &l->work) != napi_ok) {
    free(l);
    send_now(env, r, data, len, argv[3]);
    return NULL;
  }
  // Filled in before it is queued: a pool thread may take it at once.
  l->r = r;
  l->data = data;
  l->len = len;
  napi_create_reference(env, argv[0], 1, &l->req);
  napi_create_reference(env, argv[1], 1, &l->buf);
  napi_create_reference(env, argv[3], 1, &l->done);
  if (napi_queue_async_work(env, l->work) != napi_ok) {
    napi_delete_reference(env, l->req);
    napi_delete_reference(env, l->buf);
    napi_delete_reference(env, l->done);
    napi_delete_async_work(env, l->work);
    free(l);
    send_now(env, r, data, len, argv[3]);
    return NULL;
  }
  // Answered for JavaScript (a second reply throws); outstanding for the session until sent.
  r->answered = 1;
  return NULL;
}

int reply_later_exports(napi_env env, napi_value exports) {
  EXPORT("replyBufLater", reply_buf_later);
  return 1;
}
