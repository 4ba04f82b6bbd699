// The low-level operations libfuse calls on the receive thread: each forwards its request to JavaScript
// (session.c's queue), except reads of blocks the native path holds (native_path.c), names that are not
// UTF-8, and the releases of read handles and folders, answered here and told later with the forgets
// (deferred.c). Never waits for JavaScript.

#include "mount.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>

// Every open file's and folder's fi->fh is a struct br_file (set by replyOpen), holding JavaScript's number.
static struct br_file *file_of(const struct fuse_file_info *fi) { return (struct br_file *)(uintptr_t)fi->fh; }

static void ll_init(void *userdata, struct fuse_conn_info *conn) {
  struct mount *m = userdata;
  // Lookups and readdirs in one folder run in parallel, not one after another under the folder's lock.
  // libfuse 3.14 never tells the kernel (fixed in 3.16, libfuse #861): the INIT reply is patched on its
  // way out (dev_writev, session.c).
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
  forward(mount_of(req), OP_LOOKUP, req, parent, 0, 0, 0, name);
}

// Forgets need no answer: they go to JavaScript with the next request (deferred.c).
static void ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  struct mount *m = mount_of(req);
  fuse_reply_none(req);
  defer(m, OP_FORGET, ino, nlookup);
}

static void ll_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets) {
  struct mount *m = mount_of(req);
  for (size_t i = 0; i < count; i++) defer(m, OP_FORGET, forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  // fh + 1, so 0 says "no open file" (a stat, not an fstat).
  // Only a regular file's getattr carries its open file (the kernel's FUSE_GETATTR_FH).
  forward(mount_of(req), OP_GETATTR, req, ino, fi ? br_file_js_fh(file_of(fi)) + 1 : 0, 0, 0, NULL);
}

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  forward(mount_of(req), OP_OPEN, req, ino, (uint64_t)(unsigned)fi->flags, 0, 0, NULL);
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  struct mount *m = mount_of(req);
  struct br_file *f = file_of(fi);
  // Blocks on disk that JavaScript registered for this file: answered by a native worker.
  if (br_started() && native_begin(m)) {
    if (br_submit(req, ino, f, (uint64_t)off, size)) return;
    native_end(m);
  }
  forward(m, OP_READ, req, ino, br_file_js_fh(f), (uint64_t)off, size, NULL);
}

static void ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  struct mount *m = mount_of(req);
  struct br_file *f = file_of(fi);
  uint64_t fh = br_file_js_fh(f);
  // A read handle's release has nothing to tell the kernel (JavaScript only drops the handle): answered
  // here, and JavaScript hears of it with its next request. A write handle's may upload, and fail.
  if ((fi->flags & O_ACCMODE) == O_RDONLY && fh < m->read_handles_below) {
    fuse_reply_err(req, 0);
    defer(m, OP_RELEASE, ino, fh);
  } else {
    forward(m, OP_RELEASE, req, ino, fh, 0, 0, NULL);
  }
  br_file_unref(f); // the kernel's reference, taken by replyOpen
}

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  forward(mount_of(req), OP_OPENDIR, req, ino, (uint64_t)(unsigned)fi->flags, 0, 0, NULL);
}

static void ll_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  forward(mount_of(req), OP_READDIR, req, ino, br_file_js_fh(file_of(fi)), (uint64_t)off, size, NULL);
}

static void ll_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  forward(mount_of(req), OP_READDIRPLUS, req, ino, br_file_js_fh(file_of(fi)), (uint64_t)off, size, NULL);
}

// As a read handle's release: JavaScript only drops the folder's listing.
static void ll_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  struct mount *m = mount_of(req);
  struct br_file *f = file_of(fi);
  fuse_reply_err(req, 0);
  defer(m, OP_RELEASEDIR, ino, br_file_js_fh(f));
  br_file_unref(f);
}

static void ll_statfs(fuse_req_t req, fuse_ino_t ino) { forward(mount_of(req), OP_STATFS, req, ino, 0, 0, 0, NULL); }

static void ll_readlink(fuse_req_t req, fuse_ino_t ino) { forward(mount_of(req), OP_READLINK, req, ino, 0, 0, 0, NULL); }

// ------------------------------------------------------------------ writes
// Names a write would create must be UTF-8 (object names are); one that is not names no object either.

static int refuse_name(fuse_req_t req, const char *name, int err) {
  if (valid_utf8((const unsigned char *)name)) return 0;
  fuse_reply_err(req, err);
  return 1;
}

static void ll_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi) {
  if (refuse_name(req, name, EINVAL)) return;
  forward(mount_of(req), OP_CREATE, req, parent, (uint64_t)(unsigned)fi->flags, mode, 0, name);
}

static void ll_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
  forward_full(mount_of(req), OP_WRITE, req, ino, br_file_js_fh(file_of(fi)), (uint64_t)off, size, NULL, NULL, buf, size);
}

static void ll_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  forward(mount_of(req), OP_FLUSH, req, ino, br_file_js_fh(file_of(fi)), 0, 0, NULL);
}

static void ll_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi) {
  forward(mount_of(req), OP_FSYNC, req, ino, br_file_js_fh(file_of(fi)), (uint64_t)datasync, 0, NULL);
}

// Milliseconds since the epoch (GCS keeps no finer time); -1 for "now".
static double ms_of(const struct timespec *ts, int now) { return now ? -1 : (double)ts->tv_sec * 1000.0 + (double)(ts->tv_nsec / 1000000); }

static void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi) {
  // a: the open file's handle + 1 (0: none), b: FUSE_SET_ATTR_* bits, c: the new size; then the values.
  double v[5] = {(double)attr->st_mode, (double)attr->st_uid, (double)attr->st_gid, ms_of(&attr->st_atim, to_set & FUSE_SET_ATTR_ATIME_NOW),
                 ms_of(&attr->st_mtim, to_set & FUSE_SET_ATTR_MTIME_NOW)};
  forward_full(mount_of(req), OP_SETATTR, req, ino, fi ? br_file_js_fh(file_of(fi)) + 1 : 0, (uint64_t)(unsigned)to_set, (uint64_t)attr->st_size, NULL, NULL, v, sizeof v);
}

static void ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) {
  if (refuse_name(req, name, ENOENT)) return;
  forward(mount_of(req), OP_UNLINK, req, parent, 0, 0, 0, name);
}

static void ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode) {
  if (refuse_name(req, name, EINVAL)) return;
  forward(mount_of(req), OP_MKDIR, req, parent, mode, 0, 0, name);
}

static void ll_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) {
  if (refuse_name(req, name, ENOENT)) return;
  forward(mount_of(req), OP_RMDIR, req, parent, 0, 0, 0, name);
}

static void ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent, const char *newname, unsigned int flags) {
  if (refuse_name(req, name, ENOENT) || refuse_name(req, newname, EINVAL)) return;
  forward_full(mount_of(req), OP_RENAME, req, parent, newparent, flags, 0, name, newname, NULL, 0);
}

// A link's target goes into the object's metadata, which holds UTF-8 only.
static void ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name) {
  if (refuse_name(req, name, EINVAL) || refuse_name(req, link, EINVAL)) return;
  forward_full(mount_of(req), OP_SYMLINK, req, parent, 0, 0, 0, name, link, NULL, 0);
}

static void ll_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev) {
  (void)rdev;
  if (refuse_name(req, name, EINVAL)) return;
  forward(mount_of(req), OP_MKNOD, req, parent, mode, 0, 0, name);
}

// Grouped by family; each family's codes are in enum op_code (mount.h).
const struct fuse_lowlevel_ops ll_ops = {
    .init = ll_init,
    // names and attributes
    .lookup = ll_lookup,
    .forget = ll_forget,
    .forget_multi = ll_forget_multi,
    .getattr = ll_getattr,
    .statfs = ll_statfs,
    .readlink = ll_readlink,
    // reads
    .open = ll_open,
    .read = ll_read,
    .release = ll_release,
    // folders
    .opendir = ll_opendir,
    .readdir = ll_readdir,
    .readdirplus = ll_readdirplus,
    .releasedir = ll_releasedir,
    // writes (hard links are left to libfuse, which answers ENOSYS, as gcsfuse does)
    .create = ll_create,
    .write = ll_write,
    .flush = ll_flush,
    .fsync = ll_fsync,
    .setattr = ll_setattr,
    .unlink = ll_unlink,
    .mkdir = ll_mkdir,
    .rmdir = ll_rmdir,
    .rename = ll_rename,
    .mknod = ll_mknod,
    .symlink = ll_symlink,
};
