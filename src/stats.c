/* Statistics: counters kept on slow paths and in the OS layer, and the line
 * printed at exit with HAKMEM_STATS=1. */
#include <stdio.h>

#include "internal.h"

hak_counters_t hak_counters;

void hak_stats_print_line(int fd) {
  char buf[512];
#define C(f) atomic_load_explicit(&hak_counters.f, memory_order_relaxed)
  snprintf(buf, sizeof buf,
           "hakmem: stats segments=%zu pages=%zu huge=%zu heaps=%zu adopted=%zu "
           "mmap=%zu munmap=%zu madvise=%zu mremap=%zu mapped=%zu purged=%zu\n",
           C(segments), C(pages), C(huge_allocs), C(heaps), C(heaps_adopted), C(mmap_calls),
           C(munmap_calls), C(madvise_calls), C(mremap_calls), C(mapped_bytes), C(purged_bytes));
#undef C
  hak_write_fd(fd, buf);
}

void hak_usage_get(hak_usage_t* usage) {
  *usage = (hak_usage_t){0};
  hak_segments_usage(usage);
  usage->huge_blocks = atomic_load_explicit(&hak_counters.huge_live, memory_order_relaxed);
  usage->huge_bytes = atomic_load_explicit(&hak_counters.huge_live_bytes, memory_order_relaxed);
}
