/* Huge blocks: above HAK_LARGE_MAX a block gets a mapping of its own, laid
 * out as a segment (header at a 2 MiB boundary, so free finds it by the same
 * mask), and realloc grows or moves it with mremap instead of copying.  Freed
 * mappings are kept briefly (bounded in bytes and age) so that a program that
 * allocates and frees a big buffer in a loop maps nothing per cycle. */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define HUGE_CACHE_SLOTS 8
#define HUGE_CACHE_BYTES ((size_t)64 << 20)
#define HUGE_CACHE_MAX_AGE_NS 1000000000LL /* 1 s */
/* A cached mapping reused for a smaller block keeps its backed tail (no page
 * faults when the next block is bigger again) while the tails of all live
 * huge blocks stay within this; beyond it the tail is unmapped. */
#define HUGE_SPARE_MAX ((size_t)32 << 20)

typedef struct huge_cached_s {
  hak_segment_t* seg; /* NULL: slot free */
  long long freed_ns;
} huge_cached_t;

static pthread_mutex_t huge_lock = PTHREAD_MUTEX_INITIALIZER;
static huge_cached_t huge_cache[HUGE_CACHE_SLOTS];
static size_t huge_cache_bytes;
static _Atomic size_t huge_spare_bytes; /* the kept tails of live huge blocks */

/* Drops the block's kept tail from the count (it is freed, or resized exactly). */
static void huge_spare_forget(hak_segment_t* seg) {
  if (seg->huge_spare_pages == 0) return;
  atomic_fetch_sub_explicit(&huge_spare_bytes, (size_t)seg->huge_spare_pages * HAK_OS_PAGE,
                            memory_order_relaxed);
  seg->huge_spare_pages = 0;
}

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts); /* vDSO: no system call */
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void hak_huge_lock(void) { pthread_mutex_lock(&huge_lock); }
void hak_huge_unlock(void) { pthread_mutex_unlock(&huge_lock); }

/* Takes the smallest cached mapping of at least total bytes, else the largest
 * smaller one (the caller resizes it: its pages are already backed, which
 * saves the page faults of a fresh mapping); unmaps the ones that have aged
 * out.  Called without the lock. */
static hak_segment_t* huge_cache_take(size_t total) {
  hak_segment_t* expired[HUGE_CACHE_SLOTS];
  int nexpired = 0;
  hak_segment_t* best = NULL;
  long long now = now_ns();
  pthread_mutex_lock(&huge_lock);
  int best_slot = -1;
  for (int i = 0; i < HUGE_CACHE_SLOTS; i++) {
    hak_segment_t* seg = huge_cache[i].seg;
    if (seg == NULL) continue;
    if (now - huge_cache[i].freed_ns > HUGE_CACHE_MAX_AGE_NS) {
      expired[nexpired++] = seg;
      huge_cache_bytes -= seg->map_size;
      huge_cache[i].seg = NULL;
      continue;
    }
    if (best_slot < 0) {
      best_slot = i;
      continue;
    }
    size_t have = huge_cache[best_slot].seg->map_size, size = seg->map_size;
    bool better = have >= total ? (size >= total && size < have) : size > have;
    if (better) best_slot = i;
  }
  if (best_slot >= 0) {
    best = huge_cache[best_slot].seg;
    huge_cache[best_slot].seg = NULL;
    huge_cache_bytes -= best->map_size;
  }
  pthread_mutex_unlock(&huge_lock);
  for (int i = 0; i < nexpired; i++) hak_os_unmap(expired[i], expired[i]->map_size);
  return best;
}

static bool huge_cache_full(void) {
  for (int i = 0; i < HUGE_CACHE_SLOTS; i++)
    if (huge_cache[i].seg == NULL) return false;
  return true;
}

static int huge_cache_oldest(void) {
  int oldest = -1;
  for (int i = 0; i < HUGE_CACHE_SLOTS; i++)
    if (huge_cache[i].seg != NULL && (oldest < 0 || huge_cache[i].freed_ns < huge_cache[oldest].freed_ns))
      oldest = i;
  return oldest;
}

/* Bytes of the mappings cached (statistics). */
size_t hak_huge_cached_bytes(void) {
  pthread_mutex_lock(&huge_lock);
  size_t bytes = huge_cache_bytes;
  pthread_mutex_unlock(&huge_lock);
  return bytes;
}

/* Unmaps every cached mapping (malloc_trim, and a mapping that failed:
 * under an address-space limit the cache holds what the next one needs).
 * Returns whether it unmapped any. */
bool hak_huge_cache_flush(void) {
  hak_segment_t* cached[HUGE_CACHE_SLOTS];
  int n = 0;
  pthread_mutex_lock(&huge_lock);
  for (int i = 0; i < HUGE_CACHE_SLOTS; i++) {
    if (huge_cache[i].seg == NULL) continue;
    cached[n++] = huge_cache[i].seg;
    huge_cache[i].seg = NULL;
  }
  huge_cache_bytes = 0;
  pthread_mutex_unlock(&huge_lock);
  for (int i = 0; i < n; i++) hak_os_unmap(cached[i], cached[i]->map_size);
  return n != 0;
}

/* Keeps a freed mapping, evicting the oldest if the cache is full. */
static void huge_cache_put(hak_segment_t* seg) {
  if (seg->map_size > HUGE_CACHE_BYTES / 2) {
    hak_os_unmap(seg, seg->map_size);
    return;
  }
  hak_segment_t* evicted[HUGE_CACHE_SLOTS + 1];
  int nevicted = 0;
  pthread_mutex_lock(&huge_lock);
  while (huge_cache_bytes + seg->map_size > HUGE_CACHE_BYTES || huge_cache_full()) {
    int oldest = huge_cache_oldest();
    evicted[nevicted++] = huge_cache[oldest].seg;
    huge_cache_bytes -= huge_cache[oldest].seg->map_size;
    huge_cache[oldest].seg = NULL;
  }
  for (int i = 0; i < HUGE_CACHE_SLOTS; i++) {
    if (huge_cache[i].seg == NULL) {
      huge_cache[i].seg = seg;
      huge_cache[i].freed_ns = now_ns();
      huge_cache_bytes += seg->map_size;
      break;
    }
  }
  pthread_mutex_unlock(&huge_lock);
  for (int i = 0; i < nevicted; i++) hak_os_unmap(evicted[i], evicted[i]->map_size);
}

#define PAGE_UP(x) (((x) + HAK_OS_PAGE - 1) & ~(size_t)(HAK_OS_PAGE - 1))

/* The secure build puts a guard page before the block (after the header)
 * and one after it, at the end of the mapping. */
#define HUGE_GUARD (HAK_SECURE ? (size_t)HAK_OS_PAGE : 0)
/* The offset of a block without alignment, the only kind cached. */
#define HUGE_PLAIN_OFFSET (HAK_SEG_HDR_SIZE + HUGE_GUARD)

/* Distance from the header to the block: the header page, or the alignment.
 * An alignment of 2 MiB or more puts the block exactly one segment above the
 * header, and the segment map marks the block's unit HAK_MAP_HUGE_ABOVE. */
static size_t huge_offset(size_t align) {
  if (align <= HUGE_PLAIN_OFFSET) return HUGE_PLAIN_OFFSET;
  if (align < HAK_SEG_SIZE) return align;
  return HAK_SEG_SIZE;
}

/* Lays the guard pages of the secure build around a block at off in a
 * mapping of total bytes. */
static bool huge_guard(hak_segment_t* seg, size_t off, size_t total) {
  if (!HAK_SECURE) return true;
  seg->huge_guard_page = (uint32_t)(total / HAK_OS_PAGE) - 1;
  return hak_os_guard((uint8_t*)seg + off - HUGE_GUARD, HUGE_GUARD) &&
         hak_os_guard((uint8_t*)seg + total - HUGE_GUARD, HUGE_GUARD);
}

/* Moves the guard after the block of a reused mapping to end the block at
 * total bytes, the pages beyond kept backed as the release build keeps them. */
static bool huge_guard_tail(hak_segment_t* seg, size_t total) {
  size_t at = total - HUGE_GUARD, old = (size_t)seg->huge_guard_page * HAK_OS_PAGE;
  if (at == old) return true;
  if (old + HUGE_GUARD <= seg->map_size && !hak_os_unguard((uint8_t*)seg + old, HUGE_GUARD)) return false;
  seg->huge_guard_page = (uint32_t)(at / HAK_OS_PAGE);
  return hak_os_guard((uint8_t*)seg + at, HUGE_GUARD);
}

/* Enters a huge block in the segment map (and the live counts), or takes it out. */
static void huge_map(hak_segment_t* seg, bool on) {
  hak_segmap_set(seg, on ? HAK_MAP_SEGMENT : HAK_MAP_NONE);
  if (seg->huge_off == HAK_SEG_SIZE)
    hak_segmap_set((uint8_t*)seg + HAK_SEG_SIZE, on ? HAK_MAP_HUGE_ABOVE : HAK_MAP_NONE);
  if (on) {
    hak_count(huge_live, 1);
    hak_count(huge_live_bytes, seg->map_size);
    hak_committed_add(0); /* a new peak, perhaps */
  } else {
    hak_uncount(huge_live, 1);
    hak_uncount(huge_live_bytes, seg->map_size);
  }
}

/* A mapping of total bytes whose header is 2 MiB aligned and whose block
 * (one segment above it when align exceeds 2 MiB) is aligned to align. */
static uint8_t* huge_map_aligned(size_t total, size_t align) {
  return align <= HAK_SEG_SIZE ? hak_os_map_aligned(total, HAK_SEG_SIZE, 0)
                               : hak_os_map_aligned(total, align, HAK_SEG_SIZE);
}

#if HAK_SECURE
/* Grows a guarded cached mapping to total bytes without faulting its backed
 * pages in anew.  Guarded, it is several kernel mappings (header, head guard,
 * block, tail guard, perhaps a kept tail after it), which one mremap cannot
 * resize: the last of them is grown in place if the addresses after it are
 * free, else the block's pages are moved (and grown) to a new mapping, the
 * header copied there; then the tail guard is laid at the new end.  NULL if
 * it could not (the mapping is then gone). */
static hak_segment_t* huge_grow_guarded(hak_segment_t* seg, size_t total) {
  uint8_t* base = (uint8_t*)seg;
  size_t guard_at = (size_t)seg->huge_guard_page * HAK_OS_PAGE, old_size = seg->map_size;
  size_t last = guard_at + HUGE_GUARD < old_size ? guard_at + HUGE_GUARD : guard_at;
  if (hak_os_remap(base + last, old_size - last, total - last, NULL) != NULL) {
    seg->map_size = total;
    if (!hak_os_unguard(base + guard_at, total - HUGE_GUARD - guard_at)) goto fail;
  } else {
    /* The old tail guard made accessible first joins the block and the
     * kept tail after it into one mapping, all of it moved, and grown to
     * include the new tail guard: the kernel joins the pieces of one
     * mapping again when they have the same protection (as when a later
     * reuse moves the guard), not those of two. */
    size_t off = HUGE_PLAIN_OFFSET;
    if (!hak_os_unguard(base + guard_at, HUGE_GUARD)) goto fail;
    uint8_t* dest = hak_os_map_aligned(total, HAK_SEG_SIZE, 0);
    if (dest == NULL) goto fail;
    if (hak_os_remap(base + off, old_size - off, total - off, dest + off) == NULL) {
      hak_os_unmap(dest, total); /* (the old pages stay where they were) */
      goto fail;
    }
    memcpy(dest, base, sizeof(hak_segment_t));
    hak_os_unmap(base, off); /* what is left of the old one: header and head guard */
    base = dest;
    seg = (hak_segment_t*)dest;
    seg->map_size = total;
    if (!hak_os_guard(base + off - HUGE_GUARD, HUGE_GUARD)) goto fail;
  }
  seg->huge_guard_page = (uint32_t)((total - HUGE_GUARD) / HAK_OS_PAGE);
  if (!hak_os_guard(base + total - HUGE_GUARD, HUGE_GUARD)) goto fail;
  return seg;
fail:
  hak_os_unmap(seg, seg->map_size);
  return NULL;
}
#endif

/* Fits a cached mapping to total bytes: keeps the backed tail of a larger one
 * (within HUGE_SPARE_MAX) or trims it, grows a smaller one in place or moves
 * it with mremap, and moves the secure build's tail guard.  NULL if it could
 * not (the mapping is then gone). */
static hak_segment_t* huge_fit_cached(hak_segment_t* seg, size_t total) {
  if (seg->map_size >= total) {
    size_t tail = seg->map_size - total; /* (0: nothing to keep or trim) */
    if (atomic_fetch_add_explicit(&huge_spare_bytes, tail, memory_order_relaxed) + tail <= HUGE_SPARE_MAX) {
      seg->huge_spare_pages = (uint32_t)(tail / HAK_OS_PAGE);
    } else {
      atomic_fetch_sub_explicit(&huge_spare_bytes, tail, memory_order_relaxed);
      hak_os_unmap((uint8_t*)seg + total, tail);
      seg->map_size = total;
    }
    /* The secure build's guard after the block moves to its new end (also
     * where a kept tail left it elsewhere). */
    if (HAK_SECURE && !huge_guard_tail(seg, total)) {
      huge_spare_forget(seg);
      hak_os_unmap(seg, seg->map_size);
      return NULL;
    }
    return seg;
  }
#if HAK_SECURE
  return huge_grow_guarded(seg, total);
#endif
  if (hak_os_remap(seg, seg->map_size, total, NULL) == NULL) {
    uint8_t* dest = hak_os_map_aligned(total, HAK_SEG_SIZE, 0);
    if (dest == NULL || hak_os_remap(seg, seg->map_size, total, dest) == NULL) {
      if (dest != NULL) hak_os_unmap(dest, total);
      hak_os_unmap(seg, seg->map_size);
      return NULL;
    }
    seg = (hak_segment_t*)dest;
  }
  seg->map_size = total;
  return seg;
}

void* hak_huge_alloc(size_t size, size_t align, bool zero) {
  if (size > HAK_SIZE_LIMIT || align > HAK_SIZE_LIMIT) {
    errno = ENOMEM;
    return NULL;
  }
  size_t off = huge_offset(align);
  size_t total = PAGE_UP(off + size) + HUGE_GUARD;
  if (off == HUGE_PLAIN_OFFSET) {
    hak_segment_t* seg = huge_cache_take(total);
    if (seg != NULL) seg = huge_fit_cached(seg, total);
    if (seg != NULL) {
      seg->huge_off = (uint32_t)off;
      if (zero) {
        HAK_VG_UNDEFINED((uint8_t*)seg + off, size); /* freed: inaccessible to memcheck */
        memset((uint8_t*)seg + off, 0, size);
      }
      huge_map(seg, true);
      return (uint8_t*)seg + off;
    }
  }
  /* The header sits on a 2 MiB boundary; with a larger alignment, that
   * boundary is one segment below an aligned address.  The mapping kept is
   * at most size + alignment (plus a page of rounding). */
  uint8_t* base = huge_map_aligned(total, align);
  if (base == NULL && hak_huge_cache_flush()) base = huge_map_aligned(total, align);
  if (base == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  if (!huge_guard((hak_segment_t*)base, off, total)) {
    hak_os_unmap(base, total);
    errno = ENOMEM;
    return NULL;
  }
  hak_os_thp(base, total);
  hak_segment_t* seg = (hak_segment_t*)base;
  seg->kind = HAK_SEG_HUGE;
  seg->map_size = total;
  seg->huge_off = (uint32_t)off;
  huge_map(seg, true);
  hak_count(huge_allocs, 1);
  return base + off;
}

void hak_huge_free(hak_segment_t* seg) {
  huge_map(seg, false);
  huge_spare_forget(seg);
  if (seg->huge_off == HUGE_PLAIN_OFFSET)
    huge_cache_put(seg);
  else
    hak_os_unmap(seg, seg->map_size);
}

size_t hak_huge_usable(hak_segment_t* seg, const void* p) {
  size_t end = HAK_SECURE ? (size_t)seg->huge_guard_page * HAK_OS_PAGE : seg->map_size; /* (with the kept tail) */
  return (size_t)((uint8_t*)seg + end - (const uint8_t*)p);
}

/* Resizes a huge block without copying when it can: shrink in place, grow in
 * place, or move the pages to a new 2 MiB-aligned place.  NULL means the
 * caller must allocate and copy (or that memory is exhausted). */
void* hak_huge_realloc(hak_segment_t* seg, void* p, size_t size) {
  if ((uint8_t*)p != (uint8_t*)seg + seg->huge_off) hak_fatal("realloc of an invalid pointer (inside a huge block)", p);
  if (HAK_SECURE) return NULL; /* a guarded mapping is not one mapping mremap can move */
  uint8_t* base = (uint8_t*)seg;
  if (size <= HAK_LARGE_MAX || size > HAK_SIZE_LIMIT) return NULL;
  size_t off = (size_t)((uint8_t*)p - base);
  huge_spare_forget(seg); /* the mapping is fitted to the new size below */
  size_t old_total = seg->map_size;
  size_t total = PAGE_UP(off + size);
  if (total == old_total) return p;
  if (total < old_total || hak_os_remap(base, old_total, total, NULL) != NULL) {
    if (total < old_total) hak_os_unmap(base + total, old_total - total);
    seg->map_size = total;
    if (total > old_total) {
      hak_count(huge_live_bytes, total - old_total);
      hak_committed_add(0); /* a new peak, perhaps */
    } else
      hak_uncount(huge_live_bytes, old_total - total);
    return p;
  }
  uint8_t* dest = hak_os_map_aligned(total, HAK_SEG_SIZE, 0);
  if (dest == NULL) return NULL;
  huge_map(seg, false);
  if (hak_os_remap(base, old_total, total, dest) == NULL) {
    huge_map(seg, true);
    hak_os_unmap(dest, total);
    return NULL;
  }
  seg = (hak_segment_t*)dest;
  seg->map_size = total;
  huge_map(seg, true);
  return dest + off;
}
