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

#ifdef __cplusplus
}
#endif

#endif
