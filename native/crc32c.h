// CRC32C (Castagnoli), as GCS and the block index store it: hardware (SSE4.2) when the CPU has it.
#pragma once
#include <stddef.h>
#include <stdint.h>

// The CRC32C of `len` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(uint32_t crc, const void *data, size_t len);
