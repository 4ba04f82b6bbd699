// writeBlockFile: a block file written whole and renamed into place in one job on a libuv pool thread.
// Through fs.promises the same took five round trips (open, write, truncate, close, rename), each a
// promise, a FileHandle and a pool thread woken by the JS thread: a good part of the JS thread's cost
// per cold chunk file. Here the JS thread queues one job and hears back once.

#include "mount.h" // defines _GNU_SOURCE first (O_DIRECT, strerrorname_np)

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum stage { STAGE_OPEN, STAGE_WRITE, STAGE_RENAME, STAGE_DONE };
static const char *const STAGE_NAMES[] = {"open", "write", "rename", "done"};

struct block_write {
  napi_async_work work;
  napi_ref buf, done;
  char *tmp, *final; // final: NULL when the caller renames
  const char *data;
  size_t count;  // bytes written from data (padded to the alignment with O_DIRECT)
  size_t length; // the file's length
  int direct;
  int mode;
  int err;       // errno of the stage that failed
  enum stage stage;
};

static void write_file(napi_env env, void *data) {
  (void)env;
  struct block_write *w = data;
  w->stage = STAGE_OPEN;
  int fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (w->direct ? O_DIRECT : 0), w->mode);
  if (fd < 0) {
    w->err = errno;
    return;
  }
  w->stage = STAGE_WRITE;
  size_t done = 0;
  while (done < w->count) {
    ssize_t n = pwrite(fd, w->data + done, w->count - done, (off_t)done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      w->err = n < 0 ? errno : EIO;
      close(fd);
      return;
    }
    done += (size_t)n;
  }
  if (w->count != w->length && ftruncate(fd, (off_t)w->length) != 0) {
    w->err = errno;
    close(fd);
    return;
  }
  if (close(fd) != 0) {
    w->err = errno;
    return;
  }
  if (w->final) {
    w->stage = STAGE_RENAME;
    if (rename(w->tmp, w->final) != 0) {
      w->err = errno;
      return;
    }
  }
  w->stage = STAGE_DONE;
}

static void free_write(napi_env env, struct block_write *w) {
  if (w->buf) napi_delete_reference(env, w->buf);
  if (w->done) napi_delete_reference(env, w->done);
  if (w->work) napi_delete_async_work(env, w->work);
  free(w->tmp);
  free(w->final);
  free(w);
}

// done(code, stage): code null when written (and renamed), else the errno's name; stage the step that
// failed ("open", "write", "rename") or "done".
static void written(napi_env env, napi_status status, void *data) {
  struct block_write *w = data;
  if (status == napi_cancelled) {
    w->err = ECANCELED;
  }
  napi_value done = NULL, undefined, argv[2];
  napi_get_undefined(env, &undefined);
  napi_get_reference_value(env, w->done, &done);
  if (w->stage == STAGE_DONE && !w->err) napi_get_null(env, &argv[0]);
  else {
    const char *name = strerrorname_np(w->err);
    char fallback[24];
    if (!name) {
      snprintf(fallback, sizeof fallback, "E%d", w->err);
      name = fallback;
    }
    napi_create_string_utf8(env, name, NAPI_AUTO_LENGTH, &argv[0]);
  }
  napi_create_string_utf8(env, STAGE_NAMES[w->stage], NAPI_AUTO_LENGTH, &argv[1]);
  free_write(env, w);
  if (done) napi_call_function(env, undefined, done, 2, argv, NULL);
}

static char *string_arg(napi_env env, napi_value v) {
  size_t len = 0;
  if (napi_get_value_string_utf8(env, v, NULL, 0, &len) != napi_ok) return NULL;
  char *s = malloc(len + 1);
  if (s && napi_get_value_string_utf8(env, v, s, len + 1, &len) != napi_ok) {
    free(s);
    return NULL;
  }
  return s;
}

// writeBlockFile(tmp, final, buffer, count, length, direct, mode, done): writes count bytes of buffer to
// a new file tmp (O_DIRECT when direct: count is then the aligned length, cut back to length), closes it
// and renames it to final (unless final is null). done(code, stage) on the JS thread. The Buffer's bytes
// must not change until then.
static napi_value write_block_file(napi_env env, napi_callback_info info) {
  napi_value argv[8];
  args_of(env, info, 8, argv);
  napi_valuetype final_type, done_type;
  napi_typeof(env, argv[1], &final_type);
  napi_typeof(env, argv[7], &done_type);
  void *bytes = NULL;
  size_t available = 0;
  bool direct = false;
  if (napi_get_buffer_info(env, argv[2], &bytes, &available) != napi_ok || done_type != napi_function) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: writeBlockFile(tmp, final, buffer, count, length, direct, mode, done)");
    return NULL;
  }
  napi_get_value_bool(env, argv[5], &direct);
  double count = num(env, argv[3]), length = num(env, argv[4]);
  if (count < 0 || count > (double)available || length < 0 || length > count) {
    napi_throw_range_error(env, NULL, "gcsmount_fuse: writeBlockFile: count or length outside the buffer");
    return NULL;
  }
  struct block_write *w = calloc(1, sizeof *w);
  napi_value name;
  if (!w || !(w->tmp = string_arg(env, argv[0])) || (final_type == napi_string && !(w->final = string_arg(env, argv[1]))) ||
      napi_create_string_utf8(env, "gcsmount block write", NAPI_AUTO_LENGTH, &name) != napi_ok ||
      napi_create_async_work(env, NULL, name, write_file, written, w, &w->work) != napi_ok) {
    if (w) free_write(env, w);
    napi_throw_error(env, "ENOMEM", "gcsmount_fuse: writeBlockFile: out of memory");
    return NULL;
  }
  w->data = bytes;
  w->count = (size_t)count;
  w->length = (size_t)length;
  w->direct = direct;
  w->mode = (int)num(env, argv[6]);
  napi_create_reference(env, argv[2], 1, &w->buf);
  napi_create_reference(env, argv[7], 1, &w->done);
  if (napi_queue_async_work(env, w->work) != napi_ok) {
    free_write(env, w);
    napi_throw_error(env, NULL, "gcsmount_fuse: writeBlockFile: cannot queue");
  }
  return NULL;
}

int block_write_exports(napi_env env, napi_value exports) {
  EXPORT("writeBlockFile", write_block_file);
  return 1;
}
