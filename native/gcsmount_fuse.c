// gcsmount's FUSE layer: libfuse3's low-level (inode) API, with every operation answered from JavaScript.
//
// One receive thread per mount reads requests from /dev/fuse and never waits for JavaScript: each request
// is handed to the JS thread through a threadsafe function (a bounded queue; a full queue stalls the
// receive thread, which is the back-pressure) and JavaScript answers when it is ready by calling one of
// the reply functions with the request's handle. A handle answers exactly once: a second reply throws,
// and a handle dropped unanswered is answered EIO when it is collected.
//
// Reads of blocks already on disk never reach JavaScript: JavaScript registers, per open file, which
// block files hold which blocks and their CRC32C (from the block index), and the receive thread hands a
// read of registered blocks to a native worker, which reads the whole block file (O_DIRECT), checks its
// CRC32C and replies from that memory. A block that is missing, short or fails its check goes back to
// JavaScript with the reason (which drops the row and fetches the block again), as does a read of a
// block nobody registered.

// Files: mount.h (the mount and what the files share), ll_ops.c (the operations, forwarding requests),
// session.c (mounting, the receive and notify threads, invalidations), replies.c (the reply functions),
// reply_later.c (large read replies sent from a pool thread),
// native_path.c (JavaScript's side of the native read path, block_reads.c), crc32c.c; this file: the
// module's exports and the process-wide helpers (file limit, memory advice).

#include "mount.h"

#include <stdbool.h>

#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "crc32c.h"

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

// copyCrc32c(source, from, to, target, at, crc): copies source[from, to) to target[at...] and returns the
// CRC32C of those bytes continued from `crc`. For a download worker's body chunks: V8 copies into shared
// memory (the block buffers) word by word with relaxed atomics, and a CRC pass over the whole block
// after it landed reads it back from memory; here both happen while the chunk is in the cache.
static napi_value copy_crc32c(napi_env env, napi_callback_info info) {
  napi_value argv[6];
  args_of(env, info, 6, argv);
  void *src = NULL, *dst = NULL;
  size_t src_len = 0, dst_len = 0;
  if (napi_get_buffer_info(env, argv[0], &src, &src_len) != napi_ok || napi_get_buffer_info(env, argv[3], &dst, &dst_len) != napi_ok) {
    napi_throw_type_error(env, NULL, "gcsmount_fuse: copyCrc32c(source, from, to, target, at, crc) wants two Buffers");
    return NULL;
  }
  double from = num(env, argv[1]), to = num(env, argv[2]), at = num(env, argv[4]);
  if (!(from >= 0 && from <= to && to <= (double)src_len && at >= 0 && at + (to - from) <= (double)dst_len)) {
    napi_throw_range_error(env, NULL, "gcsmount_fuse: copyCrc32c: a range outside its buffer");
    return NULL;
  }
  const char *from_p = (const char *)src + (size_t)from;
  size_t n = (size_t)(to - from);
  memcpy((char *)dst + (size_t)at, from_p, n);
  napi_value out;
  napi_create_uint32(env, crc32c((uint32_t)num(env, argv[5]), from_p, n), &out);
  return out;
}

// The whole `align`-aligned span [*from, *to) inside argument 0, an ArrayBuffer or a Uint8Array (N-API
// has no SharedArrayBuffer: shared memory comes as a view of all of it), for madvise; false (a
// TypeError thrown, naming `fn`) when the argument is neither.
static int aligned_span(napi_env env, napi_callback_info info, uintptr_t align, const char *fn, uintptr_t *from, uintptr_t *to) {
  napi_value argv[1];
  args_of(env, info, 1, argv);
  void *data = NULL;
  size_t len = 0;
  bool typed = false;
  napi_typedarray_type type;
  if (napi_get_arraybuffer_info(env, argv[0], &data, &len) != napi_ok &&
      !(napi_is_typedarray(env, argv[0], &typed) == napi_ok && typed && napi_get_typedarray_info(env, argv[0], &type, &len, &data, NULL, NULL) == napi_ok && type == napi_uint8_array)) {
    char msg[96];
    snprintf(msg, sizeof msg, "gcsmount_fuse: %s wants an ArrayBuffer or a Uint8Array", fn);
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
// page (the native path's own memory does the same, block_slots.c).
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

static int process_exports(napi_env env, napi_value exports) {
  EXPORT("crc32c", crc32c_js);
  EXPORT("copyCrc32c", copy_crc32c);
  EXPORT("raiseFileLimit", raise_file_limit);
  EXPORT("adviseHugePages", advise_huge_pages);
  EXPORT("discardMemory", discard_memory);
  EXPORT("trimMalloc", trim_malloc);
  return 1;
}

static napi_value init(napi_env env, napi_value exports) {
  if (!session_exports(env, exports) || !replies_exports(env, exports) || !reply_later_exports(env, exports) || !block_write_exports(env, exports) || !native_path_exports(env, exports) || !log_socket_exports(env, exports) || !process_exports(env, exports)) return NULL;
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
