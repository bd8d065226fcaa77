/* hakmem: a general-purpose memory allocator.
 *
 * Loaded with LD_PRELOAD (or linked before libc) it replaces malloc, free and
 * the rest of the glibc family and C++ operator new/delete.  Programs that want
 * to call it explicitly, next to another allocator, use the hak_ prefix below.
 */
#ifndef HAKMEM_H
#define HAKMEM_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HAKMEM_VERSION_MAJOR 0
#define HAKMEM_VERSION_MINOR 2

void*  hak_malloc(size_t size);
void   hak_free(void* ptr);
void*  hak_calloc(size_t count, size_t size);
void*  hak_realloc(void* ptr, size_t size);
void*  hak_aligned_alloc(size_t alignment, size_t size);
size_t hak_usable_size(const void* ptr);

/* Options (docs/CONFIG.md), by name with or without the HAKMEM_ prefix, e.g.
 * "PURGE_DELAY_MS".  A named value is set by its number (off = 0, on = 1, ...).
 * Both return 0, EINVAL for an unknown name, or (set) ERANGE for a value out
 * of the option's range or ENOTSUP for HAKMEM_PROF on outside the profiling
 * library, either of which changes nothing.  A set takes effect at once, for
 * every thread. */
int hak_option_get(const char* name, long* value);
int hak_option_set(const char* name, long value);

/* Statistics (docs/CONFIG.md: HAKMEM_STATS, and how to read them).
 * Counters run from start or from the last hak_stats_reset; the other
 * figures are as they are now.  A snapshot: other threads may be allocating
 * while it is taken. */
#define HAK_STATS_CLASSES 60 /* 59 size classes, then the large blocks (128 KiB - 1 MiB) */
typedef struct hak_class_stats_s {
  size_t block_size;   /* 0 for the large blocks */
  size_t live_blocks;  /* handed out now */
  size_t pages;        /* pages holding the class now */
  size_t refills;      /* pages made or reused for it (counter) */
  size_t retires;      /* pages of it given back to their segment (counter) */
  /* Counted only by the observing build (make observe; hak_stats_t.observed): */
  size_t remote_frees; /* blocks freed by another thread than the owner's */
  size_t alloc_current, alloc_partial, alloc_refill; /* mallocs from the current page, another page, a new one */
  size_t free_current, free_partial, free_empty, free_remote; /* frees to the current page, another
                            page, that emptied a page, to another thread's heap */
} hak_class_stats_t;

typedef struct hak_stats_s {
  int observed;                /* per-operation counters were kept */
  size_t mmap_calls, munmap_calls, madvise_calls, mremap_calls; /* counters */
  size_t purged_bytes;         /* given back with madvise (counter) */
  size_t reserved_bytes;       /* address space mapped now */
  size_t committed_bytes;      /* of it, in use or kept backed now (an upper bound of hakmem's RSS) */
  size_t peak_committed_bytes; /* the most committed at once */
  size_t live_bytes;           /* in blocks handed out (their block sizes) and huge mappings */
  size_t huge_allocs;          /* huge blocks made: arena runs taken and mappings of their own (counter) */
  size_t huge_live, huge_live_bytes;
  size_t segments, cached_segments, heaps;
  size_t remote_frees;         /* blocks freed by another thread than the owner's, collected (counter) */
  size_t lookup_failures;      /* pointers passed to free or malloc_usable_size that hakmem
                                  does not own (counter) */
  size_t rss_bytes, peak_rss_bytes;   /* the whole process's */
  size_t minor_faults, major_faults;  /* the whole process's (counters) */
  /* The purge delay in force now (HAKMEM_PURGE_DELAY_MS, or as the learner
   * moved it), what it gave back after units stayed free that long, and how
   * much of that was taken again within twice the delay (counters). */
  long purge_delay_ms;
  size_t idle_purged_bytes, refaulted_bytes;
  size_t learner_changes;             /* delays the learner (HAKMEM_LEARN) published (counter) */
  hak_class_stats_t classes[HAK_STATS_CLASSES];
} hak_stats_t;

void hak_stats_get(hak_stats_t* stats);
void hak_stats_reset(void);
/* The readable report (the one HAKMEM_STATS=on prints at exit) on out. */
void hak_stats_print(FILE* out);
/* The same as JSON into a file; 0 on success, -1 with errno set. */
int hak_stats_write_json(const char* path);

/* The sampling heap profiler (HAKMEM_PROF=on): writes the live heap's
 * profile now, into path (NULL: where HAKMEM_PROF says).  0, or an errno. */
int hak_prof_write(const char* path);

#ifdef __cplusplus
}
#endif

#endif
