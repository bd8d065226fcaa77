/* The OS layer: every mmap, munmap, madvise and mremap hakmem makes, counted. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include "internal.h"

/* Whether the process has a limit of address space (RLIMIT_AS, `ulimit -v`;
 * a program may lower it as it runs): there, what is reserved ahead of need
 * (the huge-block arena's 256 MiB chunks, segments 64 MiB at a time) counts
 * against it as if in use, and a refused move of pages may unmap its
 * destination (hak_os_move_pages).  Asked where such a reservation or move
 * would be made: rarely. */
bool hak_os_space_limited(void) {
  struct rlimit as;
  return getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur != RLIM_INFINITY;
}

void* hak_os_map(size_t size) {
  void* p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  hak_count(mmap_calls, 1);
  if (p == MAP_FAILED) return NULL;
  hak_count(mapped_bytes, size);
  return p;
}

void hak_os_unmap(void* p, size_t size) {
  if (size == 0) return;
  int saved = errno;
  munmap(p, size);
  errno = saved;
  hak_count(munmap_calls, 1);
  atomic_fetch_sub_explicit(&hak_counters.mapped_bytes, size, memory_order_relaxed);
}

/* Maps size bytes at an address p such that (p + skew) is a multiple of
 * align (a power of two >= 4 KiB), by over-mapping and trimming both ends. */
void* hak_os_map_aligned(size_t size, size_t align, size_t skew) {
  size_t total = size + align;
  if (total < size) return NULL;
  uint8_t* raw = hak_os_map(total);
  if (raw == NULL) return NULL;
  uintptr_t want = (((uintptr_t)raw + skew + align - 1) & ~(uintptr_t)(align - 1)) - skew;
  if (want < (uintptr_t)raw) want += align;
  uint8_t* p = (uint8_t*)want;
  hak_os_unmap(raw, (size_t)(p - raw));
  hak_os_unmap(p + size, (size_t)(raw + total - (p + size)));
  return p;
}

/* Gives the physical pages back; the range stays mapped.  After
 * MADV_DONTNEED it reads as zero at once (true); after MADV_FREE
 * (HAKMEM_PURGE=free) the kernel takes the pages only when it needs memory,
 * and until then they may keep their contents. */
bool hak_os_purge(void* p, size_t size) {
  if (size == 0) return true;
  int saved = errno;
  bool zeroed = false, purged;
  if (HAK_POLICY(purge_mode) == HAK_PURGE_FREE && madvise(p, size, MADV_FREE) == 0)
    purged = true; /* the kernel may leave the pages as they were */
  else /* also where the kernel lacks MADV_FREE.  Both are refused on locked
          memory (mlock, mlockall), whose bytes stay as they were. */
    purged = zeroed = madvise(p, size, MADV_DONTNEED) == 0;
  errno = saved;
  hak_count(madvise_calls, 1);
  if (purged) hak_count(purged_bytes, size);
  return zeroed;
}

/* Makes [p, p + size) read as zero, for calloc of a large or huge block on
 * memory written before.  A memset faults in every page, also those the program
 * leaves untouched; giving the pages back (MADV_DONTNEED, whatever the purge
 * mode) makes the program fault in again those it does touch, 5-6x the cost
 * of the memset where it touches them all (blocks of 4 MiB).  So each 2 MiB of it is cleared
 * where most of its pages are resident, and given back where most are not
 * (a page only read counts as resident: the system's zero page is mapped
 * there); the parts of pages at the ends are cleared. */
void hak_os_zero(void* p, size_t size) {
  enum { STEP = 512 }; /* pages looked at a time */
  uint8_t *lo = p, *hi = lo + size;
  uint8_t* from = (uint8_t*)(((uintptr_t)lo + HAK_OS_PAGE - 1) & ~(uintptr_t)(HAK_OS_PAGE - 1));
  uint8_t* to = (uint8_t*)((uintptr_t)hi & ~(uintptr_t)(HAK_OS_PAGE - 1));
  if (from >= to) {
    memset(lo, 0, size);
    return;
  }
  memset(lo, 0, (size_t)(from - lo));
  memset(to, 0, (size_t)(hi - to));
  int saved = errno;
  for (uint8_t* at = from; at < to;) {
    size_t pages = (size_t)(to - at) / HAK_OS_PAGE, resident = 0;
    if (pages > STEP) pages = STEP;
    size_t bytes = pages * HAK_OS_PAGE;
    unsigned char vec[STEP];
    if (mincore(at, bytes, vec) == 0)
      for (size_t i = 0; i < pages; i++) resident += vec[i] & 1;
    else
      resident = pages;
    if (resident * 2 < pages && madvise(at, bytes, MADV_DONTNEED) == 0)
      hak_count(madvise_calls, 1);
    else
      memset(at, 0, bytes);
    at += bytes;
  }
  errno = saved;
}

/* Makes a range inaccessible (a guard page of the secure build). */
bool hak_os_guard(void* p, size_t size) {
  int saved = errno;
  bool ok = mprotect(p, size, PROT_NONE) == 0;
  errno = saved;
  return ok;
}

/* Makes a guard accessible again (a reused huge mapping's old tail guard). */
bool hak_os_unguard(void* p, size_t size) {
  int saved = errno;
  bool ok = mprotect(p, size, PROT_READ | PROT_WRITE) == 0;
  errno = saved;
  return ok;
}

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102 /* Linux 6.13 */
#define MADV_GUARD_REMOVE 103
#endif

/* Whether the kernel has guard markers (probed once, on a page of its own:
 * madvise on the range itself could fail for other reasons). */
static _Atomic int guard_marks = -1;
bool hak_os_guard_marks(void) {
  int known = atomic_load_explicit(&guard_marks, memory_order_relaxed);
  if (known >= 0) return known;
  int saved = errno;
  void* probe = mmap(NULL, HAK_OS_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  bool have = probe != MAP_FAILED && madvise(probe, HAK_OS_PAGE, MADV_GUARD_INSTALL) == 0;
  if (probe != MAP_FAILED) munmap(probe, HAK_OS_PAGE);
  errno = saved;
  atomic_store_explicit(&guard_marks, have, memory_order_relaxed);
  return have;
}

/* Guard pages marked in the page table (MADV_GUARD_INSTALL): a few times
 * cheaper than mprotect, and the kernel's mapping stays whole (no split, no
 * mapping limit); they survive purges and fork.  For segment headers and
 * the huge-block arena (a huge mapping of its own is resized by code built
 * around mprotect's split mappings).  Where the kernel lacks them,
 * mprotect (hak_os_guard_marks says which). */
static bool guard_marker(void* p, size_t size, int advice) {
  int saved = errno;
  bool ok = madvise(p, size, advice) == 0;
  errno = saved;
  return ok;
}

bool hak_os_guard_mark(void* p, size_t size) {
  return hak_os_guard_marks() ? guard_marker(p, size, MADV_GUARD_INSTALL) : hak_os_guard(p, size);
}

bool hak_os_guard_unmark(void* p, size_t size) {
  return hak_os_guard_marks() ? guard_marker(p, size, MADV_GUARD_REMOVE) : hak_os_unguard(p, size);
}

/* Applies HAKMEM_THP to a fresh mapping of segments or a huge block. */
void hak_os_thp(void* p, size_t size) {
  int32_t thp = HAK_POLICY(thp);
  int advice = thp == HAK_THP_ON ? MADV_HUGEPAGE : thp == HAK_THP_OFF ? MADV_NOHUGEPAGE : 0;
  if (advice == 0) return;
  int saved = errno;
  madvise(p, size, advice);
  errno = saved;
  hak_count(madvise_calls, 1);
}

/* Resizes a mapping: in place if fixed is NULL, else moved onto fixed (which
 * the caller reserved).  Returns NULL on failure with the old mapping intact. */
void* hak_os_remap(void* old, size_t old_size, size_t new_size, void* fixed) {
  int saved = errno;
  void* p = fixed ? mremap(old, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, fixed)
                  : mremap(old, old_size, new_size, 0);
  errno = saved;
  hak_count(mremap_calls, 1);
  if (p == MAP_FAILED) return NULL;
  if (fixed) /* the caller's reservation there is replaced: old_size bytes fewer in all */
    atomic_fetch_sub_explicit(&hak_counters.mapped_bytes, old_size, memory_order_relaxed);
  else if (new_size >= old_size)
    hak_count(mapped_bytes, new_size - old_size);
  else
    atomic_fetch_sub_explicit(&hak_counters.mapped_bytes, old_size - new_size, memory_order_relaxed);
  return p;
}

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4 /* Linux 5.7 (private anonymous memory; others from 5.13) */
#endif

/* Moves the pages of [from, from + size) onto to, whose own pages they
 * replace, and leaves from mapped and empty (reading as zero): the kernel
 * moves page-table entries; nothing is copied or faulted in.  Returns 1 if
 * moved.  Else (a kernel without MREMAP_DONTUNMAP for this memory,
 * remembered; the process's limit of mappings, of address space, of
 * committed memory) the kernel may have unmapped the destination before it
 * refused, so it is mapped again, fresh (the caller moves pages only onto
 * memory that holds none): 0, or -1 if that failed too and the destination
 * is no longer mapped. */
int hak_os_move_pages(void* from, void* to, size_t size) {
  static _Atomic bool unsupported;
  if (atomic_load_explicit(&unsupported, memory_order_relaxed)) return 0;
  int saved = errno;
  void* p = mremap(from, size, size, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to);
  hak_count(mremap_calls, 1);
  if (p != MAP_FAILED) {
    errno = saved;
    return 1;
  }
  if (errno == EINVAL) atomic_store_explicit(&unsupported, true, memory_order_relaxed);
  p = mmap(to, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  hak_count(mmap_calls, 1);
  errno = saved;
  if (p != to) return -1;
  hak_os_thp(to, size); /* (a mapping of its own now) */
  return 0;
}

/* A coarse monotonic clock in milliseconds (vDSO: no system call); it wraps
 * after 49 days, so compare with a signed difference. */
uint32_t hak_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint32_t)((uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u);
}
