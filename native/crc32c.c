// CRC32C for the native read path. With SSE4.2 (x86-64), three interleaved streams of the crc32
// instruction over thirds of the buffer, joined by shifting the first two CRCs over the bytes that follow
// them (multiplication by x^(8n) modulo the polynomial, as zlib's crc32_combine does it): one stream is
// bound by the instruction's 3-cycle latency, three keep the unit busy. Elsewhere, a byte table.
#include "crc32c.h"

#include <string.h>

#define POLY 0x82f63b78u // the Castagnoli polynomial, bit-reflected

static uint32_t table[256];
static uint32_t x2n[32]; // x^(2^n) modulo POLY
static int hw;           // 1: SSE4.2 is there
static int ready;

// a * b modulo POLY, reflected (zlib's multmodp).
static uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
  }
  return p;
}

// x^(8 * len) modulo POLY.
static uint32_t x8nmodp(size_t len) {
  uint32_t p = 1u << 31; // x^0
  unsigned k = 3;
  while (len) {
    if (len & 1) p = multmodp(x2n[k & 31], p);
    len >>= 1;
    k++;
  }
  return p;
}

static void init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int j = 0; j < 8; j++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
    table[i] = c;
  }
  uint32_t p = 1u << 30; // x^1
  x2n[0] = p;
  for (int n = 1; n < 32; n++) x2n[n] = p = multmodp(p, p);
#if defined(__x86_64__)
  __builtin_cpu_init();
  hw = __builtin_cpu_supports("sse4.2");
#endif
  ready = 1; // benign race: every thread computes the same tables
}

static uint32_t sw(uint32_t crc, const unsigned char *p, size_t len) {
  while (len--) crc = (crc >> 8) ^ table[(crc ^ *p++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t hw_one(uint32_t crc, const unsigned char *p, size_t len) {
  uint64_t c = crc;
  while (len && ((uintptr_t)p & 7)) {
    c = _mm_crc32_u8((uint32_t)c, *p++);
    len--;
  }
  for (; len >= 8; len -= 8, p += 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  while (len--) c = _mm_crc32_u8((uint32_t)c, *p++);
  return (uint32_t)c;
}

// Below this, one stream: joining three costs two shifts.
#define LANES_MIN 4096

__attribute__((target("sse4.2"))) static uint32_t hw_three(uint32_t crc, const unsigned char *p, size_t len) {
  if (len < LANES_MIN) return hw_one(crc, p, len);
  size_t lane = (len / 3) & ~(size_t)7;
  const unsigned char *a = p, *b = p + lane, *c = p + 2 * lane;
  uint64_t ca = crc, cb = 0, cc = 0;
  for (size_t i = 0; i < lane; i += 8) {
    uint64_t wa, wb, wc;
    memcpy(&wa, a + i, 8);
    memcpy(&wb, b + i, 8);
    memcpy(&wc, c + i, 8);
    ca = _mm_crc32_u64(ca, wa);
    cb = _mm_crc32_u64(cb, wb);
    cc = _mm_crc32_u64(cc, wc);
  }
  // The raw register state is linear: shifting a lane's state over `lane` bytes is a multiplication.
  uint32_t shift = x8nmodp(lane);
  uint32_t joined = multmodp(shift, multmodp(shift, (uint32_t)ca) ^ (uint32_t)cb) ^ (uint32_t)cc;
  return hw_one(joined, p + 3 * lane, len - 3 * lane);
}
#endif

uint32_t crc32c(uint32_t crc, const void *data, size_t len) {
  if (!ready) init();
  crc = ~crc;
#if defined(__x86_64__)
  if (hw) return ~hw_three(crc, data, len);
#endif
  return ~sw(crc, data, len);
}
