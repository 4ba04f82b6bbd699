// The fuse-ceiling bench's reference: the file memory-fs.ts serves (SIZE_MIB MiB, byte i is i mod 251),
// answered by a plain C server on libfuse3's low-level API with nothing in between, so the bench can
// tell what the addon's hand-off to JavaScript costs against what libfuse3 itself does on this machine.
// Compiled by the bench (cc -O2, pkg-config fuse3) into a temporary folder; not part of gcsmount.
//
//   memfs-libfuse3 MOUNTPOINT SIZE_MIB buffered|direct single|multi
//
// Prints "ready" once mounted; SIGTERM (libfuse's handler) unmounts and exits.
#define FUSE_USE_VERSION 34
#include <errno.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PERIOD 251
#define MAX_REPLY (1u << 20)

static size_t file_size;
static char *pattern;
static int direct_io;

static void attr_of(fuse_ino_t ino, struct stat *st) {
  memset(st, 0, sizeof *st);
  st->st_ino = ino;
  if (ino == FUSE_ROOT_ID) {
    st->st_mode = S_IFDIR | 0555;
    st->st_nlink = 2;
  } else {
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    st->st_size = (off_t)file_size;
  }
}

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
  if (parent != FUSE_ROOT_ID || strcmp(name, "data") != 0) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  struct fuse_entry_param e;
  memset(&e, 0, sizeof e);
  e.ino = 2;
  e.attr_timeout = 3600;
  e.entry_timeout = 3600;
  attr_of(2, &e.attr);
  fuse_reply_entry(req, &e);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  (void)fi;
  struct stat st;
  attr_of(ino, &st);
  fuse_reply_attr(req, &st, 3600);
}

// keep_cache off, as memory-fs.ts answers: every open reads through the server again.
static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
  (void)ino;
  fi->direct_io = direct_io;
  fi->keep_cache = 0;
  fuse_reply_open(req, fi);
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi) {
  (void)ino;
  (void)fi;
  size_t n = 0;
  if ((size_t)off < file_size) n = file_size - (size_t)off < size ? file_size - (size_t)off : size;
  if (n > MAX_REPLY) n = MAX_REPLY;
  fuse_reply_buf(req, pattern + (size_t)off % PERIOD, n);
}

static const struct fuse_lowlevel_ops ops = {
    .lookup = ll_lookup,
    .getattr = ll_getattr,
    .open = ll_open,
    .read = ll_read,
};

int main(int argc, char **argv) {
  if (argc != 5 || atol(argv[2]) <= 0) {
    fprintf(stderr, "usage: memfs-libfuse3 MOUNTPOINT SIZE_MIB buffered|direct single|multi\n");
    return 2;
  }
  file_size = (size_t)atol(argv[2]) << 20;
  direct_io = strcmp(argv[3], "direct") == 0;
  int multi = strcmp(argv[4], "multi") == 0;
  pattern = malloc(2 * MAX_REPLY + PERIOD);
  if (!pattern) return 1;
  for (size_t i = 0; i < 2 * MAX_REPLY + PERIOD; i++) pattern[i] = (char)(i % PERIOD);

  char *fuse_argv[] = {argv[0], "-o", "ro,fsname=memfs-libfuse3", NULL};
  struct fuse_args args = FUSE_ARGS_INIT(3, fuse_argv);
  struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
  if (!se) return 1;
  if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, argv[1]) != 0) {
    fuse_session_destroy(se);
    return 1;
  }
  printf("ready\n");
  fflush(stdout);
  int r;
  if (multi) {
    struct fuse_loop_config cfg = {.clone_fd = 0, .max_idle_threads = 10};
    r = fuse_session_loop_mt(se, &cfg);
  } else {
    r = fuse_session_loop(se);
  }
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  free(pattern);
  return r < 0 ? 1 : 0;
}
