/* hakmem: a general-purpose memory allocator.
 *
 * Loaded with LD_PRELOAD (or linked before libc) it replaces malloc, free and
 * the rest of the glibc family and C++ operator new/delete.  Programs that want
 * to call it explicitly, next to another allocator, use the hak_ prefix below.
 */
#ifndef HAKMEM_H
#define HAKMEM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HAKMEM_VERSION_MAJOR 0
#define HAKMEM_VERSION_MINOR 1

void*  hak_malloc(size_t size);
void   hak_free(void* ptr);
void*  hak_calloc(size_t count, size_t size);
void*  hak_realloc(void* ptr, size_t size);
void*  hak_aligned_alloc(size_t alignment, size_t size);
size_t hak_usable_size(const void* ptr);

/* Options (docs/CONFIG.md), by name with or without the HAKMEM_ prefix, e.g.
 * "PURGE_DELAY_MS".  A named value is set by its number (off = 0, on = 1, ...).
 * Both return 0, EINVAL for an unknown name, or (set) ERANGE for a value out
 * of the option's range, which changes nothing.  A set takes effect at once,
 * for every thread. */
int hak_option_get(const char* name, long* value);
int hak_option_set(const char* name, long value);

#ifdef __cplusplus
}
#endif

#endif
