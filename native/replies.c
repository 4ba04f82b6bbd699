// The reply functions JavaScript answers requests with, and the handles it holds for them (each answers
// once: gcsmount_fuse.c).

#include "mount.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

void answered(struct req_ref *r) {
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

int req_handle(napi_env env, struct mount *m, fuse_req_t req, napi_value *out) {
  struct req_ref *r = malloc(sizeof *r);
  if (!r) return 0;
  r->req = req;
  r->m = m;
  r->answered = 0;
  napi_create_external(env, r, req_finalize, NULL, out);
  return 1;
}

// Takes the request out of argv[0]; throws for a handle already answered.
struct req_ref *take_req(napi_env env, napi_value v) {
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
#define OPEN_FLUSH 8

// The file info of an open or create: fi->fh becomes the native file, with the kernel's reference taken
// (dropped at release). A folder (or a file opened without one) gets a struct of its own, which registers
// nothing, so that every fi->fh names one. False when out of memory.
static int open_info(double fh, unsigned flags, struct br_file *f, struct fuse_file_info *fi) {
  memset(fi, 0, sizeof *fi);
  fi->keep_cache = (flags & OPEN_KEEP_CACHE) != 0;
  fi->cache_readdir = (flags & OPEN_CACHE_READDIR) != 0;
  fi->direct_io = (flags & OPEN_DIRECT_IO) != 0;
  // Only a file open for writing has anything to upload at close(2): the others need not wait for us.
  fi->noflush = (flags & OPEN_FLUSH) == 0;
  if (f) br_file_ref(f);
  else if (!(f = br_file_new((uint64_t)fh, 0, 0))) return 0;
  fi->fh = (uint64_t)(uintptr_t)f;
  return 1;
}

// replyOpen(req, fh, flags, file?): flags OPEN_KEEP_CACHE | OPEN_CACHE_READDIR | OPEN_DIRECT_IO |
// OPEN_FLUSH. A file's open passes its native file (nativeFile()), which the kernel's handle then names;
// a folder's need not. Returns 0, or -errno when the kernel did not take the answer.
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
  if (!open_info(num(env, argv[1]), (unsigned)num(env, argv[2]), f, &fi)) {
    fuse_reply_err(r->req, ENOMEM);
    answered(r);
    return NULL;
  }
  int res = fuse_reply_open(r->req, &fi);
  if (res != 0) br_file_unref((struct br_file *)(uintptr_t)fi.fh); // no release will come for an open the kernel did not take
  answered(r);
  napi_value out;
  napi_create_int32(env, res, &out);
  return out;
}

// replyCreate(req, attr, entryTimeoutSec, attrTimeoutSec, fh, flags, file?): a new file's entry and its
// open, as replyEntry and replyOpen. Returns 0, or -errno when the kernel did not take the answer (then
// neither the lookup nor the open counts: no forget or release will come).
static napi_value reply_create(napi_env env, napi_callback_info info) {
  napi_value argv[7];
  args_of(env, info, 7, argv);
  napi_valuetype t;
  napi_typeof(env, argv[6], &t);
  struct br_file *f = NULL;
  if (t != napi_undefined && !(f = file_arg(env, argv[6]))) return NULL;
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  struct fuse_entry_param e;
  memset(&e, 0, sizeof e);
  if (fill_stat(env, argv[1], &e.attr) != 0) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: bad attributes");
    return NULL;
  }
  e.ino = e.attr.st_ino;
  e.generation = 1;
  e.entry_timeout = num(env, argv[2]);
  e.attr_timeout = num(env, argv[3]);
  struct fuse_file_info fi;
  if (!open_info(num(env, argv[4]), (unsigned)num(env, argv[5]), f, &fi)) {
    fuse_reply_err(r->req, ENOMEM);
    answered(r);
    return NULL;
  }
  int res = fuse_reply_create(r->req, &e, &fi);
  if (res != 0) br_file_unref((struct br_file *)(uintptr_t)fi.fh);
  answered(r);
  napi_value out;
  napi_create_int32(env, res, &out);
  return out;
}

// replyWrite(req, count): `count` bytes were written.
static napi_value reply_write(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  args_of(env, info, 2, argv);
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  fuse_reply_write(r->req, (size_t)num(env, argv[1]));
  answered(r);
  return NULL;
}

int reply_bytes(napi_env env, napi_value buffer, napi_value length, void **data, size_t *len) {
  if (napi_get_buffer_info(env, buffer, data, len) != napi_ok) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: a read's reply wants a Buffer");
    return 0;
  }
  double n = num(env, length);
  if (n >= 0 && n < (double)*len) *len = (size_t)n;
  return 1;
}

// replyBuf(req, buffer, length): the kernel copies straight out of the Buffer's memory.
static napi_value reply_buf(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  args_of(env, info, 3, argv);
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  void *data = NULL;
  size_t len = 0;
  if (!reply_bytes(env, argv[1], argv[2], &data, &len)) return NULL;
  fuse_reply_buf(r->req, data, len);
  answered(r);
  return NULL;
}

// replyReadlink(req, target): a symbolic link's target (at most PATH_MAX bytes: the kernel's limit too).
static napi_value reply_readlink(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  args_of(env, info, 2, argv);
  struct req_ref *r = take_req(env, argv[0]);
  if (!r) return NULL;
  char target[PATH_MAX];
  size_t len = 0;
  if (napi_get_value_string_utf8(env, argv[1], target, sizeof target, &len) != napi_ok) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: replyReadlink wants a string");
    return NULL;
  }
  fuse_reply_readlink(r->req, target);
  answered(r);
  return NULL;
}

// replyDir(req, names, inos, types, start, size): entries from index `start` that fit in `size` bytes;
// entry i has offset i + 1 and file type bits types[i]. Returns how many were sent.
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
    napi_value nv, iv, tv;
    size_t nlen = 0;
    napi_get_element(env, argv[1], i, &nv);
    napi_get_element(env, argv[2], i, &iv);
    napi_get_element(env, argv[3], i, &tv);
    if (napi_get_value_string_utf8(env, nv, name, sizeof name, &nlen) != napi_ok) break;
    struct stat st;
    memset(&st, 0, sizeof st);
    st.st_ino = (ino_t)num(env, iv);
    st.st_mode = (mode_t)num(env, tv) & S_IFMT;
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

int replies_exports(napi_env env, napi_value exports) {
  EXPORT("replyErr", reply_err);
  EXPORT("replyEntry", reply_entry);
  EXPORT("replyAttr", reply_attr);
  EXPORT("replyOpen", reply_open);
  EXPORT("replyBuf", reply_buf);
  EXPORT("replyDir", reply_dir);
  EXPORT("replyReadlink", reply_readlink);
  EXPORT("replyDirPlus", reply_dir_plus);
  EXPORT("replyStatfs", reply_statfs);
  EXPORT("replyCreate", reply_create);
  EXPORT("replyWrite", reply_write);
  return 1;
}
