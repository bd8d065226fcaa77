/* The allocation family behind the public names: hak_* here, the glibc and
 * C++ names in override.c. */
#include <errno.h>
#include <string.h>

#include "internal.h"

HAK_API void* hak_malloc(size_t size) { return hak_alloc_inline(size); }

HAK_API void hak_free(void* p) { hak_free_inline(p); }

#define HAK_ZERO_RESIDENT_MIN ((size_t)512 << 10)

HAK_API void* hak_calloc(size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  if (total > HAK_LARGE_MAX) { /* fresh mappings are zero */
    void* p = hak_huge_alloc(total, 0, true);
    if (HAK_PROF && p != NULL) hak_prof_huge(p, total);
    HAK_VG_ALLOC(p, 1);
    return p;
  }
  void* p = hak_alloc_inline(total);
  if (p == NULL) return NULL;
  /* A large block made on units no one wrote since the system zeroed them
   * (a new segment, or units purged with MADV_DONTNEED) reads as zero:
   * clearing it would only fault in pages the program may never touch.  On
   * others of 512 KiB or more, the pages mostly not resident are given back
   * rather than cleared (hak_os_zero); below, the look at what is resident
   * costs too much of the memset (blocks of 200 KiB used whole: 13% more
   * time a calloc, of 512 KiB 4%). */
  hak_heap_t* heap = hak_tls_heap;
  /* (A block of a normal segment: a huge one, which the secure build's
   * canary may make of a large size, never went by heap_alloc_large.) */
  if (total > HAK_CLASS_MAX_SIZE && heap->zeroed_last == ~(uintptr_t)p && hak_segmap_get(p) == HAK_MAP_SEGMENT)
    heap->zeroed_last = 0;
  else if (total >= HAK_ZERO_RESIDENT_MIN)
    hak_os_zero(p, total);
  else
    memset(p, 0, total);
  HAK_VG_DEFINED(p, total);
  return p;
}

/* Bytes usable at p, a pointer into page (of a normal segment): to the end of
 * its block (a large page holds one block, from its start). */
static size_t page_usable(const hak_page_t* page, const void* p) {
  if (page->units == 0) return 0;
  const uint8_t* b = page->cls == HAK_CLASS_LARGE ? hak_page_start(page)
                                                 : (const uint8_t*)hak_block_start(page, p);
  return page->block_size - HAK_CANARY_SIZE - (size_t)((const uint8_t*)p - b);
}

size_t hak_usable(const void* p) {
  hak_segment_t* seg = hak_segment_lookup(p);
  if (seg == NULL) {
    if (p != NULL) hak_count(lookup_failures, 1);
    return 0;
  }
  if (seg->kind == HAK_SEG_HUGE) return hak_huge_usable(seg, p);
  return page_usable(hak_page_of(seg, p), p);
}

HAK_API size_t hak_usable_size(const void* p) { return hak_usable(p); }

/* A large block of this thread's heap grows over the free units after it
 * (also one handed out at an inner address: aligned). */
static bool realloc_grow_in_place(hak_segment_t* seg, hak_page_t* page, void* p, size_t size) {
  if (page->cls != HAK_CLASS_LARGE || size > HAK_LARGE_MAX) return false;
  if (atomic_load_explicit(&page->owner_tid, memory_order_relaxed) != hak_thread_id()) {
    if (hak_segment_heap(seg) != hak_tls_heap) return false;
    hak_page_claim(hak_tls_heap, page); /* (an adopted heap's) */
  }
  uint8_t* start = hak_page_start(page);
  if (!hak_page_grow(hak_tls_heap, page, (size_t)((uint8_t*)p - start) + size + HAK_CANARY_SIZE))
    return false;
  if (page->home) hak_heap_home_gone(hak_tls_heap, page); /* a large block like any other now */
  hak_canary_set(page, start); /* at the new end */
  if (hak_page_is_sampled(page)) hak_prof_moved(p, p, size);
  return true;
}

#if HAK_SECURE
/* The secure build: what free checks of p, made by realloc before it keeps,
 * grows or copies the block (a review found a freed block reallocated and
 * then handed out twice, an inner pointer grown in place, and a write past
 * a block's end erased by the canary of its growth): p starts a block of a
 * page, or is an aligned block's inner address, and the block is not free
 * (not linked, not tagged) and its canary intact.  Returns the bytes usable
 * at p.  (Not in the release build: these few instructions cost its realloc
 * growth 3-7%, docs/BENCHMARKS.md.) */
static size_t realloc_usable_checked(const hak_page_t* page, void* p) {
  if (unlikely(page->units == 0 || (uint8_t*)p < hak_page_start(page)))
    hak_fatal("realloc of an invalid pointer (not a block)", p);
  hak_block_t* b = page->cls == HAK_CLASS_LARGE ? (hak_block_t*)hak_page_start(page) : hak_block_start(page, p);
  if (unlikely((void*)b != p && !__atomic_load_n(&page->has_aligned, __ATOMIC_RELAXED)))
    hak_fatal("realloc of an invalid pointer (inside a block)", p);
  hak_block_in(page, b);
  return page->block_size - HAK_CANARY_SIZE - (size_t)((uint8_t*)p - (uint8_t*)b);
}
#endif

/* It starts 32 bytes into a cache line (the 32 bytes before it are never
 * run): on this project's machines (AMD EPYC) realloc growth runs 10%
 * faster so than with the function at the line's start or 16 bytes in,
 * where it fell as the code before it grew (docs/BENCHMARKS.md). */
HAK_ENTRY __attribute__((patchable_function_entry(32, 32))) void* hak_realloc(void* p, size_t size) {
  if (p == NULL) return hak_alloc_inline(size);
  if (size == 0) { /* glibc frees and returns NULL */
    hak_free_block(p, false);
    return NULL;
  }
  hak_segment_t* seg = hak_segment_lookup(p);
  if (seg == NULL) hak_fatal("realloc of a pointer not allocated by hakmem", p);
  hak_page_t* page = NULL;
  size_t usable;
  if (seg->kind == HAK_SEG_HUGE) {
    usable = hak_huge_usable(seg, p);
    if (size > HAK_LARGE_MAX) {
      void* q = hak_huge_realloc(seg, p, size);
      if (q != NULL) {
        if (hak_prof_has_samples()) hak_prof_moved(p, q, size);
        HAK_VG_RESIZED(p, q, usable);
        return q;
      }
    }
  } else {
    page = hak_page_of(seg, p);
#if HAK_SECURE
    usable = realloc_usable_checked(page, p);
#else
    usable = page_usable(page, p);
#endif
  }
  /* Stay if it fits and does not waste more than half, or if it is a home. */
  if (size <= usable && (size >= usable / 2 || (page != NULL && page->home))) return p;
  if (size > usable && page != NULL && realloc_grow_in_place(seg, page, p, size)) {
    HAK_VG_RESIZED(p, p, usable);
    return p;
  }
  /* A buffer that grows a second time in a row, or a first time from
   * HAK_REALLOC_HOME_FROM bytes (where each copy costs more than a home),
   * gets a home where it can go on growing without a copy, as a coalescing
   * heap grows the block at its top: a large block at the start of the
   * longest run of free units, which it fills in place.  At most
   * HAK_REALLOC_HOMES of one unit live per heap, so that many buffers that
   * stop growing small do not each hold a unit. */
  hak_heap_t* heap = hak_tls_heap;
  void* q = NULL;
  if (size > usable && (~(uintptr_t)p == heap->realloc_last || usable >= HAK_REALLOC_HOME_FROM) &&
      heap->homes < HAK_REALLOC_HOMES &&
      heap->kind == HAK_HEAP_THREAD && size <= HAK_LARGE_MAX - HAK_CANARY_SIZE) {
    q = hak_heap_alloc_home(heap, size + HAK_CANARY_SIZE);
    HAK_VG_ALLOC(q, 0);
  }
  if (q == NULL) q = hak_alloc_inline(size);
  if (q == NULL) return NULL; /* errno is ENOMEM; p is untouched */
  memcpy(q, p, size < usable ? size : usable);
  hak_free_block(p, false);
  if (size > usable && heap->kind == HAK_HEAP_THREAD) heap->realloc_last = ~(uintptr_t)q;
  return q;
}

static void* alloc_aligned(size_t align, size_t size) {
  if (size > HAK_SIZE_LIMIT || align > HAK_SIZE_LIMIT) {
    errno = ENOMEM;
    return NULL;
  }
  /* Pages start on 4 KiB boundaries, but those of a class with start lines
   * on 64-byte ones, and those of a small class with one (hak_class_start_off)
   * on a multiple of its size's largest power-of-two factor: a class whose
   * size is a multiple of the alignment hands out aligned blocks as they are. */
  if (align <= HAK_OS_PAGE) {
    size_t rounded = (size + align - 1) & ~(align - 1);
    if (rounded == 0) rounded = align;
    size_t block = rounded + HAK_CANARY_SIZE;
    unsigned cls = block <= HAK_CLASS_MAX_SIZE ? hak_class_of(block) : 0;
    if (block <= HAK_CLASS_MAX_SIZE && hak_class_size[cls] % align == 0 &&
        (align <= 64 || hak_class_start_lines[cls] == 1))
      return hak_alloc_inline(rounded);
  }
  size_t need = size + align - HAK_ALIGN;
  if (need > HAK_LARGE_MAX - HAK_CANARY_SIZE) { /* (a block above would be huge) */
    void* h = hak_huge_alloc(size, align, false);
    HAK_VG_ALLOC(h, 0);
    return h;
  }
  uint8_t* p = hak_alloc_inline(need);
  if (p == NULL) return NULL;
  uint8_t* q = (uint8_t*)(((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1));
  if (q != p) {
    hak_page_mark_inner(q);
    HAK_VG_FREE(p); /* memcheck knows the block by the address handed out */
    HAK_VG_ALLOC(q, 0);
  }
  return q;
}

/* align: a power of two (callers check).  The profiler samples none of these
 * (a sampled block sits at an inner address, prof.c). */
void* hak_alloc_aligned(size_t align, size_t size) {
  if (align <= HAK_ALIGN) return hak_alloc_inline(size);
  bool busy = hak_prof_busy;
  hak_prof_busy = true;
  void* p = alloc_aligned(align, size);
  hak_prof_busy = busy;
  return p;
}

HAK_API void* hak_aligned_alloc(size_t align, size_t size) {
  if (align == 0 || (align & (align - 1)) != 0) {
    errno = EINVAL;
    return NULL;
  }
  return hak_alloc_aligned(align, size);
}
