// JavaScript's side of the native read path (block_reads.c): its open files and the blocks registered
// for them, reads handed over, preloads, counters; and the mount's count of the reads the path holds, so
// that the end of the receive loop waits for them.

#include "mount.h"

#include <stdbool.h>
#include <stdlib.h>

// A read may go to the native path: not once the receive loop has ended.
int native_begin(struct mount *m) {
  pthread_mutex_lock(&m->native_lock);
  int ok = !m->exiting;
  if (ok) m->native_jobs++;
  pthread_mutex_unlock(&m->native_lock);
  return ok;
}

void native_end(struct mount *m) {
  pthread_mutex_lock(&m->native_lock);
  if (--m->native_jobs == 0) pthread_cond_broadcast(&m->native_idle);
  pthread_mutex_unlock(&m->native_lock);
}

// Hooks of the native path (worker threads): a read it gives back goes to JavaScript like any other
// (counted outstanding before the native count drops, so the session never sees both at zero).
static void native_fallback(fuse_req_t req, uint64_t ino, uint64_t js_fh, uint64_t off, size_t size, int reason, const char *key) {
  forward_reason(mount_of(req), OP_READ, req, ino, js_fh, off, size, key, reason);
}

static void native_done(void *req_userdata) { native_end(req_userdata); }

// A read may wait for a block on its way to disk while the mount's session goes on; the end of the
// receive loop gives back the waiting ones (br_release_waiting) after it says the session is ending.
static int native_may_wait(void *req_userdata) {
  struct mount *m = req_userdata;
  pthread_mutex_lock(&m->native_lock);
  int ok = !m->exiting;
  pthread_mutex_unlock(&m->native_lock);
  return ok;
}

// A native file handle as JavaScript holds it, tagged so that no other external passes for one.
static const napi_type_tag FILE_TAG = {0x6763736d6f756e74ULL, 0x62725f66696c6531ULL};

struct br_file *file_arg(napi_env env, napi_value v) {
  bool ok = false;
  struct br_file *f = NULL;
  if (napi_check_object_type_tag(env, v, &FILE_TAG, &ok) != napi_ok || !ok || napi_get_value_external(env, v, (void **)&f) != napi_ok || !f) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: not a native file");
    return NULL;
  }
  return f;
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

// dropBlocks(file): a writer changes the file's bytes: none of its registered blocks answers a read now.
static napi_value drop_blocks(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  args_of(env, info, 1, argv);
  struct br_file *f = file_arg(env, argv[0]);
  if (!f) return NULL;
  br_file_clear(f);
  return NULL;
}

// setFileSize(file, size): the open file reads another generation, of `size` bytes: its registered
// blocks (the old one's) no longer answer, and its reads are clamped to the new size, not the size it
// was opened with (else reads past the old end would be answered EOF natively).
static napi_value set_file_size(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  args_of(env, info, 2, argv);
  struct br_file *f = file_arg(env, argv[0]);
  if (!f) return NULL;
  br_file_resize(f, (uint64_t)num(env, argv[1]));
  return NULL;
}

// A block key argument: 32 hex digits into `key` (BR_KEY_LEN + 2 bytes), or a TypeError thrown and 0.
static int key_arg(napi_env env, napi_value v, char *key) {
  size_t len = 0;
  if (napi_get_value_string_utf8(env, v, key, BR_KEY_LEN + 2, &len) != napi_ok || len != BR_KEY_LEN) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: a block key is 32 hex digits");
    return 0;
  }
  return 1;
}

// expectBlock(file, block, key): block `block` of the file is block file `key`, on its way to disk; a
// read of it waits for blockLanded(key). True when registered (then blockLanded(key) must follow).
static napi_value expect_block(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  args_of(env, info, 3, argv);
  struct br_file *f = file_arg(env, argv[0]);
  char key[BR_KEY_LEN + 2];
  if (!f || !key_arg(env, argv[2], key)) return NULL;
  napi_value out;
  napi_get_boolean(env, br_file_expect(f, (uint64_t)num(env, argv[1]), key), &out);
  return out;
}

// blockLanded(key, crc, length): block file `key` is on disk with that CRC32C and length (length 0:
// it will not be); the reads waiting for it go on.
static napi_value block_landed(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  args_of(env, info, 3, argv);
  char key[BR_KEY_LEN + 2];
  if (!key_arg(env, argv[0], key)) return NULL;
  br_landed(key, (uint32_t)num(env, argv[1]), (uint32_t)num(env, argv[2]));
  return NULL;
}

// lendBlock(key, bytes, landed): lends the whole, checked bytes of block file `key` (a Buffer) before the
// file is on disk, when reads expect the block, or (`landed` true) after, the bytes its registered CRC32C
// was taken of: they are answered from that memory (br_lend). True when lent: the memory must stay as it
// is until revokeBlock(key).
static napi_value lend_block(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  args_of(env, info, 3, argv);
  char key[BR_KEY_LEN + 2];
  if (!key_arg(env, argv[0], key)) return NULL;
  void *data = NULL;
  size_t len = 0;
  if (napi_get_buffer_info(env, argv[1], &data, &len) != napi_ok || len > UINT32_MAX) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: lendBlock wants a key and a Buffer");
    return NULL;
  }
  bool landed = false;
  napi_valuetype t;
  if (napi_typeof(env, argv[2], &t) == napi_ok && t == napi_boolean) napi_get_value_bool(env, argv[2], &landed);
  napi_value out;
  napi_get_boolean(env, br_lend(key, data, (uint32_t)len, landed ? 1 : 0), &out);
  return out;
}

// revokeBlock(key): ends the loan of block file `key`; once it returns, nothing reads that memory.
static napi_value revoke_block(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  args_of(env, info, 1, argv);
  char key[BR_KEY_LEN + 2];
  if (!key_arg(env, argv[0], key)) return NULL;
  br_revoke(key);
  return NULL;
}

// loanServed(key): whether block file `key` is lent and a read has been answered from it.
static napi_value loan_served(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  args_of(env, info, 1, argv);
  char key[BR_KEY_LEN + 2];
  if (!key_arg(env, argv[0], key)) return NULL;
  napi_value out;
  napi_get_boolean(env, br_loan_served(key), &out);
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
    napi_get_element(env, argv[2], i, &k);
    napi_get_element(env, argv[3], i, &c);
    if (!key_arg(env, k, key)) return NULL;
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
  if (!key_arg(env, argv[0], key)) return NULL;
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
  struct br_hooks hooks = {.fallback = native_fallback, .done = native_done, .may_wait = native_may_wait};
  napi_value out;
  napi_get_boolean(env, br_start(&cfg, &hooks) == 0, &out);
  return out;
}

// nativeStats(): [reads, readBytes, fallbacks, blockLoads, blockLoadBytes, blocksInMemory, blockHits, blockHitBytes, readNs, waited, lent]
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

int native_path_exports(napi_env env, napi_value exports) {
  EXPORT("nativeFile", native_file);
  EXPORT("addBlocks", add_blocks);
  EXPORT("expectBlock", expect_block);
  EXPORT("blockLanded", block_landed);
  EXPORT("lendBlock", lend_block);
  EXPORT("revokeBlock", revoke_block);
  EXPORT("loanServed", loan_served);
  EXPORT("dropBlocks", drop_blocks);
  EXPORT("setFileSize", set_file_size);
  EXPORT("readNative", read_native);
  EXPORT("startNativeReads", start_native_reads);
  EXPORT("nativeStats", native_stats);
  EXPORT("preloadBlock", preload_block);
  EXPORT("nativeMaintain", native_maintain);
  return 1;
}
