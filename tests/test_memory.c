/* test_memory: hakmem gives memory back, and only what is free.
 *
 * Each mechanism of the memory layer, watched through its counters, RSS and
 * mallinfo2: free units purged once the purge delay has passed (and not
 * before), at once with HAKMEM_PURGE_DELAY_MS=0 and never with -1; live
 * blocks intact through all of it; empty pages kept for reuse given back
 * after the delay too; empty pages of one class reused by
 * another before anything new is mapped; free segments reused; huge blocks
 * reusing the arena's granules (no mmap, no page fault per cycle), freed
 * neighbours coalescing, the backed ones taken first, granules purged after the delay and never while in
 * use, the kernel's mappings not multiplied, a move of pages the kernel
 * refuses; malloc_trim(0)
 * giving everything back at once; mallinfo2 within 5% of the live bytes;
 * HAKMEM_THP marking segments; bad HAKMEM_* variables warned about.
 *
 * Linked with build/libhakmem.a (malloc is hakmem's, and the counters in
 * src/internal.h are reachable).  ctest runs it with several
 * HAKMEM_PURGE_DELAY_MS values; it reads the one in effect from the policy. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "internal.h"
#include "test_util.h"

#define C(f) atomic_load_explicit(&hak_counters.f, memory_order_relaxed)
#define MIB ((size_t)1 << 20)

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Live blocks of every kind (small, mid, large, huge), each with a pattern. */
enum { LIVE = 64 };
static void* live[LIVE];
static size_t live_size[LIVE];

static void live_make(void) {
  hak_rng r;
  hak_rng_seed(&r, 7);
  for (int i = 0; i < LIVE; i++) {
    size_t n = i % 4 == 0 ? hak_rng_range(&r, 16, 1024)
             : i % 4 == 1 ? hak_rng_range(&r, 1025, 128 * 1024)
             : i % 4 == 2 ? hak_rng_range(&r, 128 * 1024 + 1, MIB)
                          : hak_rng_range(&r, MIB + 1, 3 * MIB);
    live[i] = malloc(n);
    REQUIRE(live[i] != NULL);
    live_size[i] = n;
    hak_pattern_fill(live[i], n, (uintptr_t)live[i]);
  }
}

static int live_intact(void) {
  for (int i = 0; i < LIVE; i++)
    if (hak_pattern_check(live[i], live_size[i], (uintptr_t)live[i]) != live_size[i]) return 0;
  return 1;
}

/* Fills `bytes` with blocks of `size` (written, so resident), into out. */
static size_t fill(void** out, size_t max, size_t size, size_t bytes) {
  size_t n = bytes / size;
  REQUIRE(n <= max);
  for (size_t i = 0; i < n; i++) {
    out[i] = malloc(size);
    REQUIRE(out[i] != NULL);
    memset(out[i], 0x5a, size);
  }
  return n;
}

static void free_all(void** blocks, size_t n) {
  for (size_t i = 0; i < n; i++) free(blocks[i]);
}

static size_t minor_faults(void);

enum { MAXB = 1 << 16 };
static void* blocks[MAXB];

/* A page-level event (a page made: a large block, which has a page of its
 * own): the purge delay is checked on these. */
static void page_event(void) {
  void* p = malloc(256 * 1024 - HAK_CANARY_SIZE); /* four units */
  REQUIRE(p != NULL);
  free(p);
}

/* Units held by the heap's kept empty pages of class cls. */
static size_t empty_units_of(hak_heap_t* heap, unsigned cls) {
  size_t n = 0;
  for (hak_page_t* page = heap->empty.first; page != NULL; page = page->next)
    if (page->cls == cls) n += page->units;
  return n;
}

/* 80 MiB of 16 KiB blocks freed, all but one block in each segment (so that
 * the segments stay the heap's): what is purged at once, after the delay, and
 * never, depending on HAKMEM_PURGE_DELAY_MS; live blocks stay intact. */
static void test_purge_delay(void) {
  int delay = HAK_POLICY(purge_delay_ms);
  size_t n = fill(blocks, MAXB, 16 * 1024 - HAK_CANARY_SIZE, 80 * MIB); /* whole 16 KiB blocks */
  enum { PINS = 64 };
  void* pins[PINS];
  size_t npins = 0;
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    for (size_t k = 0; k < npins && !seen; k++) seen = hak_segment_of(pins[k]) == hak_segment_of(blocks[i]);
    if (seen) continue;
    REQUIRE(npins < PINS);
    pins[npins++] = blocks[i];
    blocks[i] = NULL;
  }
  /* The bytes of the pages emptied (the pinned blocks' pages are not). */
  size_t freed = n * 16 * 1024;
  for (size_t k = 0; k < npins; k++) {
    const hak_page_t* page = hak_page_of(hak_segment_of(pins[k]), pins[k]);
    freed -= (size_t)page->capacity * page->block_size;
  }
  size_t purged0 = C(purged_bytes);
  uint32_t freed_ms = hak_now_ms();
  free_all(blocks, n);
  size_t at_once = C(purged_bytes) - purged0;
  uint32_t took_ms = hak_now_ms() - freed_ms;
  if (delay == 0) CHECK(at_once >= freed - 4 * MIB);
  if (delay < 0) CHECK(at_once == 0);
  if (delay > 0) {
    /* Beyond the free units a heap may keep (16 MiB, or half its segments'
     * units if more), and its empty pages (4 MiB), purged at once, the
     * oldest first, no more; the rest waits. */
    size_t keep = hak_tls_heap->segment_count * (HAK_UNITS - 1) / 2;
    if (keep < HAK_DIRTY_UNITS_MAX) keep = HAK_DIRTY_UNITS_MAX;
    keep <<= HAK_UNIT_SHIFT;
    /* (So that some are purged at once: with 40 MiB, the segments of the
     * other tests' live blocks made the heap keep all but 4 MiB, which its
     * empty pages held.) */
    CHECK(keep + ((size_t)HAK_EMPTY_UNITS_KEEP << HAK_UNIT_SHIFT) + 8 * MIB < freed);
    CHECK(at_once >= 8 * MIB);
    CHECK(at_once + keep + 5 * MIB >= freed);
    /* No more, unless the frees took the delay (this machine stalled): the
     * units freed first then came due and a later event purged them by age. */
    if (took_ms < (uint32_t)delay) CHECK(at_once + keep <= freed);
    page_event();
    if (hak_now_ms() - freed_ms < (uint32_t)delay / 2) /* (unless this machine stalled) */
      CHECK(C(purged_bytes) - purged0 - at_once < 2 * MIB); /* not yet due */
    sleep_ms(delay + 30);
    page_event();
    CHECK(C(purged_bytes) - purged0 + 4 * MIB >= freed);
  }
  free_all(pins, npins);
  CHECK(live_intact());
}

/* n blocks of 1 MiB (sixteen units: one to a segment), written. */
static void one_per_segment(void** p, int n) {
  for (int i = 0; i < n; i++) {
    REQUIRE((p[i] = malloc(MIB - HAK_CANARY_SIZE)) != NULL);
    memset(p[i], i, MIB - HAK_CANARY_SIZE);
  }
}

/* Free segments stay backed within the most ever in use, until the delay:
 * blocks of 1 MiB freed and allocated again fault nothing in. */
static void test_segments_kept(void) {
  int delay = HAK_POLICY(purge_delay_ms);
  enum { N = 12 };
  void* p[N];
  /* Nothing kept backed from the tests before: what they left would come due
   * while these blocks are freed, and be purged then (1 run in 25). */
  malloc_trim(0);
  one_per_segment(p, N);
  size_t purged0 = C(purged_bytes);
  uint32_t freed_ms = hak_now_ms();
  free_all(p, N);
  size_t at_once = C(purged_bytes) - purged0;
  uint32_t took_ms = hak_now_ms() - freed_ms;
  if (delay < 0) CHECK(at_once == 0);
  if (delay == 0) CHECK(at_once >= (N - 2) * MIB);
  if (delay > 0) {
    if (took_ms < (uint32_t)delay) CHECK(at_once == 0); /* (unless this machine stalled past the delay) */
    size_t faults = minor_faults();
    one_per_segment(p, N);
    /* Reused backed, not faulted in again (unless this machine stalled past
     * the delay meanwhile: ctest -j 8 on two CPUs did, 3 runs in 8). */
    if (hak_now_ms() - freed_ms < (uint32_t)delay / 2) CHECK(minor_faults() - faults < N * MIB / 4096 / 8);
    free_all(p, N);
    sleep_ms(delay + 30);
    page_event();
    CHECK(C(purged_bytes) - purged0 >= (N - 2) * MIB);
  }
  CHECK(live_intact());
}

/* A freed phase waiting for the delay (64 MiB or more, here 80 MiB of free
 * segments) makes each refill check the delay, not every 64th: a program
 * that goes on working lightly makes no page event and few refills
 * (bench/rss_phase).  Once it has gone, the refills go back to every 64th. */
static void test_purge_watch(void) {
  if (HAK_POLICY(purge_delay_ms) <= 0) return;
  enum { N = 40 };
  void* p[N];
  hak_heap_t* heap = hak_tls_heap;
  malloc_trim(0);
  page_event();
  CHECK(!heap->purge_watch);
  one_per_segment(p, N);
  free_all(p, N);
  page_event();
  CHECK(heap->purge_watch);
  void* a = malloc(64);
  REQUIRE(a != NULL);
  unsigned cls = hak_page_of(hak_segment_of(a), a)->cls;
  uint32_t stale = hak_now_ms() - 1000;
  heap->purge_looked_ms = stale;
  heap->refills = 0; /* (the 64th is far) */
  void* b = hak_alloc_refill(heap, heap->current[cls], 64);
  CHECK(heap->purge_looked_ms != stale); /* checked at this refill */
  free(a);
  free(b);
  malloc_trim(0);
  page_event();
  CHECK(!heap->purge_watch);
  CHECK(live_intact());
}

/* A heap of many segments holding large blocks (a thread of its own: a new
 * heap): the runs it gives back are taken again by new blocks of their size,
 * newest first (the same places, no new segment), and the heap's ring of
 * them never names a segment it has let go. */
static void* large_runs_thread(void* arg) {
  (void)arg;
  enum { N = 2 * (HAK_LARGE_RUNS + 1) }; /* half of them freed: the ring's worth, one kept empty */
  const size_t size = 800 * 1024 - HAK_CANARY_SIZE; /* 13 units: two per segment */
  void* p[N];
  for (int i = 0; i < N; i++) {
    REQUIRE((p[i] = malloc(size)) != NULL);
    memset(p[i], i, 4096);
  }
  hak_heap_t* heap = hak_tls_heap; /* (made by the first malloc) */
  size_t segments = heap->segment_count;
  void* freed[N / 2];
  for (int i = 0; i < N / 2; i++) {
    freed[i] = p[2 * i];
    free(p[2 * i]);
  }
  /* One kept as an empty page (but with a purge delay of 0), the others
   * given back to their segments (with a delay of 0 purged at once: those
   * go the usual way). */
  unsigned recorded = 0;
  for (unsigned i = 0; i < HAK_LARGE_RUNS; i++) recorded += (heap->large_runs[i] & 31) == 13;
  unsigned given_back = N / 2 - (unsigned)(heap->empty_large_units / 13);
  CHECK(recorded == (given_back < HAK_LARGE_RUNS ? given_back : HAK_LARGE_RUNS));
  for (int i = 0; i < N / 2; i++) {
    REQUIRE((p[2 * i] = malloc(size)) != NULL);
    int known = 0;
    for (int j = 0; j < N / 2; j++) known |= p[2 * i] == freed[j];
    if (HAK_POLICY(purge_delay_ms) != 0) CHECK(known);
  }
  CHECK(heap->segment_count == segments);
  free_all(p, N);
  for (unsigned i = 0; i < HAK_LARGE_RUNS; i++)
    CHECK(heap->large_runs[i] == 0 || hak_segment_heap(hak_segment_of((void*)heap->large_runs[i])) == heap);
  return NULL;
}

/* Empty pages a heap keeps for reuse are given back once they have not been
 * reused for the purge delay (never with -1, at the next page event with 0). */
static void test_empty_pages_age(void) {
  int delay = HAK_POLICY(purge_delay_ms);
  hak_heap_t* heap = hak_tls_heap;
  unsigned cls = hak_class_of(4000);
  void* p[48];
  for (int i = 0; i < 48; i++) REQUIRE((p[i] = malloc(4000)) != NULL); /* 3 pages */
  for (int i = 0; i < 48; i++) free(p[i]);
  CHECK(empty_units_of(heap, cls) >= 1 || delay == 0); /* all but the class's current page */
  size_t purged0 = C(purged_bytes);
  if (delay > 0) sleep_ms(delay + 30);
  page_event();
  if (delay < 0) {
    CHECK(empty_units_of(heap, cls) >= 1);
  } else {
    CHECK(empty_units_of(heap, cls) == 0);
    CHECK(C(purged_bytes) - purged0 >= HAK_UNIT_SIZE);
  }
  CHECK(live_intact());
}

/* OS pages of [p, p + size) that are resident. */
static size_t resident_pages(const void* p, size_t size) {
  unsigned char vec[HAK_SEG_SIZE / HAK_OS_PAGE];
  REQUIRE(size <= sizeof vec * HAK_OS_PAGE);
  REQUIRE(mincore((void*)p, size, vec) == 0);
  size_t n = 0;
  for (size_t i = 0; i < size / HAK_OS_PAGE; i++) n += vec[i] & 1;
  return n;
}

/* A page of blocks larger than an OS page, laid over memory still backed
 * from another class's page, purges it first: the OS pages the old blocks
 * touched are not kept resident beside those the new blocks touch.  The old
 * page: one of 48 blocks of old_size, each written whole, all freed; its
 * units go back to the segment if flush (the new page takes them there),
 * else it stays a kept empty page (the new page is formatted from it).  The
 * new page: of 10 KiB blocks, 3 units. */
static void layout_purge_case(size_t old_size, bool flush) {
  hak_heap_t* heap = hak_tls_heap;
  int32_t delay = HAK_POLICY(purge_delay_ms);
  malloc_trim(0); /* no free unit of the heap is backed but those below */
  enum { N = 48 }; /* 3 pages of 16 blocks */
  void* x[N];
  for (int i = 0; i < N; i++) {
    REQUIRE((x[i] = malloc(old_size - HAK_CANARY_SIZE)) != NULL);
    memset(x[i], 7, old_size - HAK_CANARY_SIZE); /* every OS page touched */
  }
  /* The units of the pages emptied below (all but the class's current one), by segment. */
  hak_segment_t* old_seg[N];
  uint32_t old_units[N];
  int nold = 0;
  for (int i = 0; i < N; i++) {
    const hak_page_t* page = hak_page_of(hak_segment_of(x[i]), x[i]);
    if (page == heap->current[page->cls]) continue;
    int k = 0;
    while (k < nold && old_seg[k] != hak_segment_of(x[i])) k++;
    if (k == nold) {
      old_seg[nold] = hak_segment_of(x[i]);
      old_units[nold++] = 0;
    }
    old_units[k] |= hak_unit_mask(page->index, page->units);
  }
  for (int i = 0; i < N; i++) free(x[i]);
  if (flush) hak_heap_flush_empty(heap); /* units back to their segments, backed (or purged, with a delay of 0) */
  REQUIRE(nold != 0);
  if (flush && delay > 0)
    for (int k = 0; k < nold; k++) CHECK((old_seg[k]->dirty_units & old_units[k]) == old_units[k]);
  /* The class's pages made before (live_make's) serve first, then a new
   * page, on the old memory (placement prefers backed units; with a delay
   * of 0 kept empty pages are retired at once, and it may land elsewhere). */
  size_t purged0 = C(purged_bytes);
  enum { M = 64 };
  void* y[M];
  const hak_page_t* page = NULL;
  bool on_old = false;
  int ny = 0;
  while (ny < M && !on_old) {
    REQUIRE((y[ny] = malloc(10000)) != NULL);
    page = hak_page_of(hak_segment_of(y[ny]), y[ny]);
    ny++;
    uint32_t units = hak_unit_mask(page->index, page->units);
    for (int k = 0; k < nold; k++) on_old |= old_seg[k] == hak_segment_of(page) && (units & old_units[k]) == units;
  }
  REQUIRE(hak_class_units[page->cls] == 3);
  if (flush || delay > 0) CHECK(on_old);
  if (delay > 0 && HAK_POLICY(thp) != HAK_THP_ON) CHECK(C(purged_bytes) - purged0 >= (size_t)page->units * HAK_UNIT_SIZE);
  /* Resident now: the OS pages the new page's free list and its first
   * block have touched, a few of its 48; without the purge, all of them.
   * (MADV_FREE leaves pages resident until the kernel needs them; nothing
   * is purged with -1, nor with huge pages asked for.) */
  if (delay >= 0 && HAK_POLICY(purge_mode) == HAK_PURGE_DONTNEED && HAK_POLICY(thp) != HAK_THP_ON) {
    size_t size = (size_t)page->units * HAK_UNIT_SIZE;
    CHECK(resident_pages((uint8_t*)hak_segment_of(page) + ((size_t)page->index << HAK_UNIT_SHIFT), size) * 2 <
          size / HAK_OS_PAGE);
  }
  for (int i = 0; i < ny; i++) free(y[i]);
  hak_heap_flush_empty(heap); /* (their units free again, in runs as before) */
  CHECK(live_intact());
}

static void test_layout_purge(void) {
  layout_purge_case(16 * 1024, true);  /* 4-unit pages: page_place over free units */
  layout_purge_case(12 * 1024, false); /* 3-unit pages: page_from_empty formats one */
}

/* Empty pages of one class serve another, and free segments are reused:
 * the second and third rounds map nothing. */
static void test_reuse(void) {
  size_t n = fill(blocks, MAXB, 3000, 16 * MIB);
  free_all(blocks, n);
  size_t mmaps = C(mmap_calls);
  n = fill(blocks, MAXB, 5000, 16 * MIB); /* another class, same bytes */
  free_all(blocks, n);
  n = fill(blocks, MAXB, 700, 16 * MIB);
  free_all(blocks, n);
  CHECK(C(mmap_calls) == mmaps);
  CHECK(live_intact());
}

static size_t minor_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (size_t)ru.ru_minflt;
}

static size_t arena_dirty_bytes(void) {
  size_t reserved, dirty, free_bytes;
  hak_huge_arena_info(&reserved, &dirty, &free_bytes);
  return dirty;
}

/* Lines of /proc/self/maps: the kernel's mappings of the process. */
static size_t kernel_mappings(void) {
  FILE* f = fopen("/proc/self/maps", "r");
  REQUIRE(f != NULL);
  size_t n = 0;
  int c;
  while ((c = fgetc(f)) != EOF) n += c == '\n';
  fclose(f);
  return n;
}

/* An 8 MiB buffer allocated, filled and freed in a loop takes the same
 * granules of the huge-block arena each time: nothing is mapped, and its
 * pages stay backed between cycles (unless purged at once). */
static void test_huge_reuse(void) {
  int32_t delay = HAK_POLICY(purge_delay_ms);
  char* first = NULL;
  size_t mmaps = C(mmap_calls), madvises = C(madvise_calls), faults = 0;
  for (int i = 0; i < 100; i++) {
    char* p = malloc(8 * MIB);
    REQUIRE(p != NULL);
    if (i == 1) {
      first = p;
      faults = minor_faults();
    }
    if (i > 1) CHECK(p == first);
    memset(p, i, 8 * MIB);
    hak_escape(p);
    free(p);
  }
  CHECK(C(mmap_calls) - mmaps <= 1); /* (a chunk reserved, at most) */
  if (delay != 0)
    CHECK(minor_faults() - faults < 8 * MIB / 4096 / 4); /* 99 cycles, a quarter of one's pages */
  else
    CHECK(C(madvise_calls) - madvises >= 100); /* each one purged as it was freed */
  CHECK(live_intact());
}

/* Two freed neighbours serve one block of both their sizes, without a page
 * fault; nothing is mapped for it. */
static void test_huge_coalesce(void) {
  int32_t delay = HAK_POLICY(purge_delay_ms);
  const size_t half = 8 * MIB - 64 * 1024, whole = 16 * MIB - 64 * 1024; /* 4 and 8 granules */
  malloc_trim(0);
  char* x = malloc(whole); /* (its granules will be the only dirty ones) */
  REQUIRE(x != NULL);
  memset(x, 1, whole);
  free(x);
  size_t mmaps = C(mmap_calls), faults = minor_faults();
  char* a = malloc(half);
  char* b = malloc(half);
  REQUIRE(a != NULL && b != NULL);
  if (delay != 0) CHECK(a == x && b == a + 8 * MIB);
  memset(a, 2, half);
  memset(b, 3, half);
  bool neighbours = b == a + 8 * MIB;
  free(a);
  free(b);
  char* c = malloc(whole);
  REQUIRE(c != NULL);
  if (neighbours) CHECK(c == a);
  memset(c, 4, whole);
  CHECK(C(mmap_calls) == mmaps);
  if (delay != 0) CHECK(minor_faults() - faults < 256); /* of 8192 pages written */
  free(c);
  CHECK(live_intact());
}

/* A block goes where the most freed granules are still backed, even deep in
 * a free run: of a run whose first granules were purged and whose last ones
 * were freed since, it takes the last ones. */
static void test_huge_dirty_window(void) {
  int32_t delay = HAK_POLICY(purge_delay_ms);
  const size_t two = 4 * MIB - 64 * 1024; /* 2 granules */
  malloc_trim(0);
  char* a = malloc(two);
  char* b = malloc(two);
  char* keep = malloc(two);
  REQUIRE(a != NULL && b != NULL && keep != NULL);
  memset(a, 1, two);
  memset(b, 2, two);
  memset(keep, 3, two);
  bool neighbours = b == a + 4 * MIB;
  free(a);
  malloc_trim(0); /* a's granules purged */
  free(b);        /* b's still backed */
  char* c = malloc(two);
  REQUIRE(c != NULL);
  if (delay != 0 && neighbours) CHECK(c == b);
  memset(c, 4, two);
  free(c);
  CHECK((unsigned char)keep[two - 1] == 3);
  free(keep);
  CHECK(live_intact());
}

/* Whether the kernel moves private anonymous pages with MREMAP_DONTUNMAP
 * (Linux 5.7). */
static bool kernel_moves_pages(void) {
  struct utsname u;
  int major = 0, minor = 0;
  if (uname(&u) != 0 || sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 5 || (major == 5 && minor >= 7);
}

/* Granules over the dirty budget give their pages to a new
 * block's granules that have none (moved, not purged, not faulted in): the
 * block holds what it is written, the blocks beside it are untouched, and
 * a granule the pages left reads as zero (a calloc over it must not see
 * what was there). */
static void test_huge_moved_pages(void) {
  int32_t delay = HAK_POLICY(purge_delay_ms);
  const size_t two = 4 * MIB - 64 * 1024; /* 2 granules with the header */
  malloc_trim(0);
  char* a = malloc(two);
  char* b = malloc(two);
  char* c = malloc(two);
  REQUIRE(a != NULL && b != NULL && c != NULL);
  bool laid = b == a + 4 * MIB && c == b + 4 * MIB;
  memset(a, 0x5a, two);
  memset(b, 2, two);
  memset(c, 3, two);
  free(a); /* 4 dirty granules beside b's 2: within the peak of 6 */
  free(c);
  size_t moves = C(mremap_calls), purged = C(purged_bytes);
  /* 6 granules from c's place: 2 of them dirty, 8 in use now, so the 2
   * dirty granules a left are over the budget: moved into d. */
  char* d = malloc(12 * MIB - 64 * 1024);
  REQUIRE(d != NULL);
  if (laid && d == c && delay > 0 && (!HAK_SECURE || hak_os_guard_marks()) && kernel_moves_pages()) {
    CHECK(C(mremap_calls) - moves == 2);
    CHECK(C(purged_bytes) == purged);
  }
  hak_pattern_fill(d, 12 * MIB - 64 * 1024, 31);
  char* e = calloc(1, two); /* a's granules, most likely: the shortest free run */
  REQUIRE(e != NULL);
  size_t nonzero = 0;
  for (size_t i = 0; i < two; i += 512) nonzero += e[i] != 0;
  CHECK(nonzero == 0);
  if (laid && delay > 0) CHECK(e == a);
  CHECK(hak_pattern_check(d, 12 * MIB - 64 * 1024, 31) == 12 * MIB - 64 * 1024);
  CHECK((unsigned char)b[0] == 2 && (unsigned char)b[two - 1] == 2);
  free(d);
  free(e);
  free(b);
  CHECK(live_intact());
}

/* Freed granules are purged once they have waited the purge delay (at once
 * with 0, never with -1), by malloc_trim(0) in any case, and never while in
 * use: the block kept beside them keeps its contents. */
static void test_huge_purge(void) {
  int32_t delay = HAK_POLICY(purge_delay_ms);
  malloc_trim(0);
  CHECK(arena_dirty_bytes() == 0);
  char* keep = malloc(3 * MIB);
  REQUIRE(keep != NULL);
  hak_pattern_fill(keep, 3 * MIB, 5);
  char* p = malloc(8 * MIB);
  REQUIRE(p != NULL);
  memset(p, 1, 8 * MIB);
  size_t purged = C(purged_bytes);
  free(p);
  if (delay == 0) {
    CHECK(arena_dirty_bytes() == 0);
    CHECK(C(purged_bytes) - purged >= 8 * MIB);
  } else {
    CHECK(arena_dirty_bytes() >= 8 * MIB); /* nothing purged before the delay */
    CHECK(C(purged_bytes) == purged);
    sleep_ms(delay > 0 ? delay + 60 : 300);
    hak_huge_purge_if_due(hak_now_ms());
    if (delay > 0) {
      CHECK(arena_dirty_bytes() == 0);
      CHECK(C(purged_bytes) - purged >= 8 * MIB);
    } else {
      CHECK(arena_dirty_bytes() >= 8 * MIB);
      CHECK(C(purged_bytes) == purged);
    }
  }
  CHECK(hak_pattern_check(keep, 3 * MIB, 5) == 3 * MIB);
  p = malloc(10 * MIB);
  REQUIRE(p != NULL);
  memset(p, 1, 10 * MIB);
  free(p);
  purged = C(purged_bytes);
  int trimmed = malloc_trim(0);
  if (delay != 0) CHECK(trimmed == 1); /* (with 0, nothing was left to give back) */
  CHECK(arena_dirty_bytes() == 0);
  if (delay != 0) CHECK(C(purged_bytes) - purged >= 10 * MIB);
  CHECK(hak_pattern_check(keep, 3 * MIB, 5) == 3 * MIB);
  free(keep);
  CHECK(live_intact());
}

/* calloc of a huge block reads zero where the arena's granules were purged
 * with MADV_FREE (which may leave the old bytes), also after the purge mode
 * changed back (the fuzzer found it). */
static void test_huge_calloc_after_madv_free(void) {
  long mode = 0, delay = 0;
  REQUIRE(hak_option_get("PURGE", &mode) == 0 && hak_option_get("PURGE_DELAY_MS", &delay) == 0);
  char* keep = malloc(3 * MIB); /* the chunk stays mapped */
  REQUIRE(keep != NULL);
  memset(keep, 1, 3 * MIB);
  REQUIRE(hak_option_set("PURGE", 1) == 0 && hak_option_set("PURGE_DELAY_MS", 0) == 0);
  for (int round = 0; round < 4; round++) {
    char* p = malloc(6 * MIB);
    REQUIRE(p != NULL);
    memset(p, 0x5a, 6 * MIB);
    free(p); /* purged at once, with MADV_FREE */
    REQUIRE(hak_option_set("PURGE", round % 2 == 0 ? 0 : 1) == 0);
    char* q = calloc(1, 6 * MIB);
    REQUIRE(q != NULL);
    size_t nonzero = 0;
    for (size_t i = 0; i < 6 * MIB; i += 512) nonzero += q[i] != 0;
    CHECK(nonzero == 0);
    free(q);
    REQUIRE(hak_option_set("PURGE", 1) == 0);
  }
  REQUIRE(hak_option_set("PURGE", mode) == 0 && hak_option_set("PURGE_DELAY_MS", delay) == 0);
  free(keep);
}

/* Whether segments may be backed by transparent huge pages, which fault in
 * 2 MiB at a touch: asked for (HAKMEM_THP=on), or the system's setting
 * "always" (with "system"). */
static bool huge_pages_possible(void) {
  if (HAK_POLICY(thp) != HAK_THP_SYSTEM) return HAK_POLICY(thp) == HAK_THP_ON;
  char line[128] = "";
  FILE* f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f == NULL) return false;
  bool always = fgets(line, sizeof line, f) != NULL && strstr(line, "[always]") != NULL;
  fclose(f);
  return always;
}

/* calloc of a large block (above the classes, up to 1 MiB) clears nothing
 * on units it knows read as zero: after malloc_trim(0) has given every free
 * unit back with MADV_DONTNEED, 24 blocks of 600 KiB leave their pages
 * unfaulted but the first (where no huge page backs them).  And it reads
 * zero wherever the units were written: kept backed (no purge), purged with
 * MADV_FREE (which may leave the old bytes) in the heap or in the segment
 * cache, also after the mode changed back before the calloc. */
static void test_large_calloc_zero(void) {
  const size_t size = 600 * 1024, pages = size / HAK_OS_PAGE;
  long mode = 0, delay = 0;
  REQUIRE(hak_option_get("PURGE", &mode) == 0 && hak_option_get("PURGE_DELAY_MS", &delay) == 0);
  if (mode == 0 && !huge_pages_possible()) {
    enum { N = 24 };
    char* p[N];
    malloc_trim(0);
    size_t resident = 0;
    for (int i = 0; i < N; i++) {
      p[i] = calloc(1, size);
      REQUIRE(p[i] != NULL);
      resident += resident_pages(p[i], size);
    }
    CHECK(resident <= 2 * N);
    size_t nonzero = 0;
    for (int i = 0; i < N; i++)
      for (size_t k = 0; k < pages; k++) nonzero += p[i][k * HAK_OS_PAGE + 64 * (k % 64)] != 0;
    CHECK(nonzero == 0);
    for (int i = 0; i < N; i++) free(p[i]);
  }
  for (int round = 0; round < 8; round++) {
    /* 0, 1: purged at once with MADV_FREE, calloc'd under each mode; 2, 3:
     * with MADV_DONTNEED; 4, 5: never purged.  Of 6 blocks (two segments of
     * three), the third of each segment stays, so that the segments stay
     * with the heap and their free units are purged where they are.  6, 7:
     * all freed, whole segments purged in the segment cache with MADV_FREE. */
    bool anchors = round < 6;
    REQUIRE(hak_option_set("PURGE", round < 2 || !anchors) == 0);
    REQUIRE(hak_option_set("PURGE_DELAY_MS", round < 4 || !anchors ? 0 : -1) == 0);
    char* q[6];
    for (int i = 0; i < 6; i++) {
      q[i] = malloc(size);
      REQUIRE(q[i] != NULL);
      memset(q[i], 0x5a, size);
    }
    for (int i = 0; i < 6; i++)
      if (!anchors || i % 3 != 2) free(q[i]);
    malloc_trim(0); /* (also the kept empty pages, under the mode of the round) */
    REQUIRE(hak_option_set("PURGE", round % 2) == 0);
    for (int i = 0; i < 6; i++) {
      if (anchors && i % 3 == 2) continue;
      q[i] = calloc(1, size);
      REQUIRE(q[i] != NULL);
      size_t nonzero = 0;
      for (size_t k = 0; k < size; k++) nonzero += q[i][k] != 0;
      CHECK(nonzero == 0);
    }
    for (int i = 0; i < 6; i++) free(q[i]);
  }
  /* Written sparsely (a page in 16; the program gave the rest back itself)
   * and freed unpurged: the blocks' pages mostly not resident, calloc gives
   * them back rather than clearing them, and the pages written read zero
   * all the same. */
  REQUIRE(hak_option_set("PURGE_DELAY_MS", -1) == 0);
  for (int round = 0; round < 2; round++) {
    char* q[6];
    for (int i = 0; i < 6; i++) {
      q[i] = malloc(size);
      REQUIRE(q[i] != NULL);
      uint8_t* whole = (uint8_t*)(((uintptr_t)q[i] + HAK_OS_PAGE - 1) & ~(uintptr_t)(HAK_OS_PAGE - 1));
      REQUIRE(madvise(whole, (size_t)((uint8_t*)q[i] + size - whole) & ~(size_t)(HAK_OS_PAGE - 1),
                      MADV_DONTNEED) == 0);
      for (size_t k = 0; k < size; k += 16 * HAK_OS_PAGE) q[i][k] = 0x5a;
      CHECK(resident_pages(whole, size - HAK_OS_PAGE) < size / HAK_OS_PAGE / 8);
    }
    for (int i = 0; i < 6; i++) free(q[i]);
    for (int i = 0; i < 6; i++) {
      q[i] = calloc(1, size);
      REQUIRE(q[i] != NULL);
      size_t nonzero = 0;
      for (size_t k = 0; k < size; k += 16 * HAK_OS_PAGE) nonzero += q[i][k] != 0;
      CHECK(nonzero == 0);
    }
    for (int i = 0; i < 6; i++) free(q[i]);
  }
  REQUIRE(hak_option_set("PURGE", mode) == 0 && hak_option_set("PURGE_DELAY_MS", delay) == 0);
}

/* realloc of an arena block grows it in place over the free granules after
 * it; with a neighbour in the way it moves, contents intact (its old place
 * purged as it is copied, but for the header's granule); shrinking gives the
 * granules it no longer needs back. */
static void test_huge_realloc(void) {
  malloc_trim(0);
  char* p = malloc(3 * MIB);
  REQUIRE(p != NULL);
  hak_pattern_fill(p, 3 * MIB, 21);
  char* q = realloc(p, 9 * MIB);
  REQUIRE(q != NULL);
  CHECK(q == p); /* (after a trim, the run after it is free) */
  CHECK(hak_pattern_check(q, 3 * MIB, 21) == 3 * MIB);
  hak_pattern_fill(q, 9 * MIB, 22);
  char* wall = malloc(2 * MIB); /* right after q, most likely */
  REQUIRE(wall != NULL);
  size_t purged = C(purged_bytes);
  char* r = realloc(q, 20 * MIB);
  REQUIRE(r != NULL);
  CHECK(hak_pattern_check(r, 9 * MIB, 22) == 9 * MIB);
  if (r != q && wall == q + 10 * MIB) CHECK(C(purged_bytes) - purged >= 8 * MIB);
  memset(r + 9 * MIB, 1, 11 * MIB);
  char* s = realloc(r, 3 * MIB);
  REQUIRE(s != NULL);
  CHECK(hak_pattern_check(s, 3 * MIB, 22) == 3 * MIB);
  CHECK(malloc_usable_size(s) < 4 * MIB);
  CHECK(s == r);
  free(s);
  free(wall);
  CHECK(live_intact());
}

/* Thousands of huge blocks of every size coming and going leave the kernel's
 * mappings bounded: a chunk more at most, pages moved between granules
 * (arena_fill: a moved granule becomes a mapping of its own) at most one per
 * granule of that chunk (128), and in the secure build the guard pages its
 * free run keeps, two mappings each. */
static void test_huge_mappings(void) {
  enum { SLOTS = 8 };
  char* slot[SLOTS] = {0};
  size_t before = kernel_mappings();
  hak_rng r;
  hak_rng_seed(&r, 3);
  for (int i = 0; i < 3000; i++) {
    unsigned k = (unsigned)(hak_rng_next(&r) % SLOTS);
    if (slot[k] != NULL) {
      free(slot[k]);
      slot[k] = NULL;
      continue;
    }
    size_t size = hak_rng_range(&r, MIB + 1, 16 * MIB);
    slot[k] = malloc(size);
    REQUIRE(slot[k] != NULL);
    slot[k][0] = slot[k][size - 1] = 1;
  }
  for (unsigned k = 0; k < SLOTS; k++) free(slot[k]);
  size_t after = kernel_mappings(), allowed = 2 + (256 * MIB) / (2 * MIB) + (HAK_SECURE ? 2 * (HAK_ARENA_GUARDS_KEPT + 2) : 0);
  if (after > before + allowed) fprintf(stderr, "kernel mappings: %zu before, %zu after\n", before, after);
  CHECK(after <= before + allowed);
  CHECK(live_intact());
}

/* realloc grows a large block over the free units after it (no copy), and
 * moves it when a neighbour is in the way; contents survive both.  In a
 * thread of its own: a new heap, whose layout the earlier tests did not
 * fragment. */
static void* realloc_in_place_thread(void* arg) {
  int in_place = 0, moved = 0;
  for (int i = 0; i < 16; i++) {
    char* p = malloc(200 * 1024);
    REQUIRE(p != NULL);
    hak_pattern_fill(p, 200 * 1024, 99);
    char* q = realloc(p, 700 * 1024);
    REQUIRE(q != NULL);
    CHECK(hak_pattern_check(q, 200 * 1024, 99) == 200 * 1024);
    CHECK(malloc_usable_size(q) >= 700 * 1024);
    memset(q + 200 * 1024, 1, 500 * 1024);
    in_place += q == p;
    free(q);
    /* Two large blocks side by side: the first cannot grow over the second.
     * (After a trim no empty page is cached: both come from free units.) */
    malloc_trim(0);
    char* a = malloc(200 * 1024);
    char* b = malloc(200 * 1024);
    REQUIRE(a != NULL && b != NULL);
    if (b == a + malloc_usable_size(a) + HAK_CANARY_SIZE) {
      hak_pattern_fill(a, 200 * 1024, 98);
      char* r = realloc(a, 900 * 1024);
      REQUIRE(r != NULL);
      CHECK(r != a);
      moved++;
      CHECK(hak_pattern_check(r, 200 * 1024, 98) == 200 * 1024);
      a = r;
    }
    free(a);
    free(b);
  }
  CHECK(in_place > 0);
  CHECK(moved > 0);
  return arg;
}

/* Runs fn in a thread of its own (a fresh heap); the live blocks stay intact. */
static void in_new_thread(void* (*fn)(void*)) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, fn, NULL) == 0);
  pthread_join(t, NULL);
  CHECK(live_intact());
}

/* A buffer grown by realloc step after step, as a string or a vector grows,
 * moves at most twice (its first growth, and its second into a home where it
 * grows in place, to 1 MiB), its contents intact at every step; buffers that
 * stop growing small hold at most HAK_REALLOC_HOMES whole units, and their
 * homes count no more once freed. */
static char* grown_buffer(void) {
  char* p = malloc(16);
  for (size_t size = 24; p != NULL && size <= 54; size += size / 2) p = realloc(p, size);
  REQUIRE(p != NULL);
  return p;
}

/* Grows a buffer of start bytes by realloc, 1.5x a step, to 1 MiB, its
 * contents checked at each step (first byte 42, the rest 7); returns how
 * many steps moved it. */
static int realloc_chain_moves(size_t start) {
  size_t size = start;
  char* p = malloc(size);
  REQUIRE(p != NULL);
  p[0] = 42;
  memset(p + 1, 7, size - 1);
  int moves = 0;
  while (size < MIB) {
    size_t next = size + size / 2 > MIB ? MIB : size + size / 2;
    char* q = realloc(p, next);
    REQUIRE(q != NULL);
    moves += q != p;
    CHECK(q[0] == 42 && q[size - 1] == 7);
    memset(q + 1, 7, next - 1);
    p = q;
    size = next;
  }
  free(p);
  return moves;
}

static void* realloc_chain_thread(void* arg) {
  for (int round = 0; round < 3; round++) {
    int moves = realloc_chain_moves(16);
    CHECK(moves <= 2);
    if (moves > 2) fprintf(stderr, "realloc chain to 1 MiB: %d moves\n", moves);
  }
  /* A buffer that starts big moves once, at its first growth, then grows
   * in place. */
  for (int round = 0; round < 3; round++) {
    int moves = realloc_chain_moves(64 << 10);
    if (moves != 1) fprintf(stderr, "realloc chain from 64 KiB to 1 MiB: %d moves\n", moves);
    CHECK(moves == 1);
  }
  /* Forty buffers grown three times and kept: few whole units. */
  enum { N = 40 };
  char* kept[N];
  int units = 0;
  for (int i = 0; i < N; i++) {
    char* p = grown_buffer();
    memset(p, i, 54);
    kept[i] = p;
    units += malloc_usable_size(p) >= HAK_UNIT_SIZE / 2;
  }
  CHECK(units > 0 && units <= HAK_REALLOC_HOMES);
  /* A home shrunk stays, its contents intact. */
  char* small = realloc(kept[0], 20);
  CHECK(small == kept[0] && small[19] == 0);
  kept[0] = small;
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < 20; j++) CHECK(kept[i][j] == (char)i);
    free(kept[i]);
  }
  /* Their homes freed, a new chain gets one again. */
  char* p = grown_buffer();
  CHECK(malloc_usable_size(p) >= HAK_UNIT_SIZE / 2);
  free(p);
  return arg;
}



/* malloc_trim(0) gives back everything free at once (whatever the delay).
 * RSS shows it with MADV_DONTNEED on small pages; MADV_FREE leaves the pages
 * counted until the kernel needs them, and a huge page partly given back
 * stays whole until the kernel splits it. */
static void test_trim(void) {
  bool rss_exact = HAK_POLICY(purge_mode) == HAK_PURGE_DONTNEED && HAK_POLICY(thp) != HAK_THP_ON;
  malloc_trim(0);
  size_t base = hak_rss_bytes();
  size_t purged0 = C(purged_bytes);
  size_t n = fill(blocks, MAXB, 1000, 48 * MIB);
  size_t peak = hak_rss_bytes();
  if (rss_exact) CHECK(peak >= base + 40 * MIB);
  free_all(blocks, n);
  CHECK(malloc_trim(0) == 1);
  CHECK(C(purged_bytes) - purged0 >= 46 * MIB);
  size_t after = hak_rss_bytes();
  if (rss_exact) CHECK(after < base + 2 * MIB);
  if (rss_exact && after >= base + 2 * MIB)
    fprintf(stderr, "rss: base %zu KiB, peak %zu KiB, after trim %zu KiB\n", base >> 10, peak >> 10,
            after >> 10);
  CHECK(live_intact());
}

/* Huge blocks of the arena freed, then, the delay past, only blocks above
 * 64 MiB (mappings of their own): the arena's backed granules are purged as
 * such a block is made, not kept for as long as no arena block comes (a
 * review found 400 MB kept). */
static void test_huge_own_mappings_purge(void) {
  if (HAK_POLICY(purge_delay_ms) <= 0 || HAK_POLICY(purge_delay_ms) > 1000) return;
  enum { N = 8 };
  char* blocks[N];
  for (int i = 0; i < N; i++) {
    blocks[i] = malloc(4 * MIB);
    REQUIRE(blocks[i] != NULL);
    memset(blocks[i], 1, 4 * MIB);
  }
  for (int i = 0; i < N; i++) free(blocks[i]);
  size_t reserved, dirty, free_bytes;
  hak_huge_arena_info(&reserved, &dirty, &free_bytes);
  CHECK(dirty >= 16 * MIB); /* (kept for the delay) */
  sleep_ms(2 * HAK_POLICY(purge_delay_ms) + 20);
  char* big = malloc(100 * MIB);
  REQUIRE(big != NULL);
  big[0] = 1;
  free(big);
  hak_huge_arena_info(&reserved, &dirty, &free_bytes);
  CHECK(dirty == 0);
}

/* Blocks that threads made and ended, then freed by this one (remote frees
 * into the abandoned heaps): malloc_trim(0) gives them back at once, not
 * when some other thread next ends (a review found 80 MB held). */
enum { EXITED_THREADS = 4, EXITED_BLOCKS = 20000 };
static void* exited_blocks[EXITED_THREADS][EXITED_BLOCKS];

static void* exited_fill(void* arg) {
  void** mine = arg;
  for (int i = 0; i < EXITED_BLOCKS; i++) {
    mine[i] = malloc(1000);
    REQUIRE(mine[i] != NULL);
    memset(mine[i], 1, 1000);
  }
  return NULL;
}

static void test_trim_exited(void) {
  malloc_trim(0);
  size_t base = C(committed_bytes);
  pthread_t t[EXITED_THREADS];
  for (int w = 0; w < EXITED_THREADS; w++) REQUIRE(pthread_create(&t[w], NULL, exited_fill, exited_blocks[w]) == 0);
  for (int w = 0; w < EXITED_THREADS; w++) pthread_join(t[w], NULL);
  for (int w = 0; w < EXITED_THREADS; w++)
    for (int i = 0; i < EXITED_BLOCKS; i++) free(exited_blocks[w][i]);
  malloc_trim(0);
  size_t after = C(committed_bytes);
  if (after > base + 4 * MIB) fprintf(stderr, "committed %zu KiB -> %zu KiB after trim\n", base >> 10, after >> 10);
  CHECK(after <= base + 4 * MIB);
}

/* A thread's pthread_key destructor that runs after hakmem's (its key made
 * later) is served by the global heap; what it freed there is given back by
 * malloc_trim(0) too (the global heap kept an empty page of every class). */
static pthread_key_t late_key;

static void late_destructor(void* arg) {
  (void)arg;
  for (size_t size = 16; size <= 128 * 1024; size += size / 8 + 16) {
    unsigned char* p = malloc(hak_opaque(size));
    REQUIRE(p != NULL);
    memset(p, 1, size);
    free(p);
  }
}

static void* late_thread(void* arg) {
  free(malloc(hak_opaque(10)));
  pthread_setspecific(late_key, (void*)1);
  return arg;
}

static void test_trim_global(void) {
  REQUIRE(pthread_key_create(&late_key, late_destructor) == 0);
  malloc_trim(0);
  size_t base = C(committed_bytes);
  in_new_thread(late_thread);
  malloc_trim(0);
  size_t after = C(committed_bytes);
  if (after > base + MIB) fprintf(stderr, "committed %zu KiB -> %zu KiB after trim\n", base >> 10, after >> 10);
  CHECK(after <= base + MIB);
  pthread_key_delete(late_key);
}

/* mallinfo2's bytes in use follow the live bytes, within 5%. */
static void test_mallinfo(void) {
  struct mallinfo2 before = mallinfo2();
  size_t live0 = before.uordblks + before.hblkhd;
  hak_rng r;
  hak_rng_seed(&r, 11);
  size_t bytes = 0, n = 0;
  while (bytes < 64 * MIB && n < MAXB) {
    unsigned kind = (unsigned)(hak_rng_next(&r) % 100);
    size_t size = kind < 60 ? hak_rng_range(&r, 1, 1024)
                : kind < 95 ? hak_rng_range(&r, 1025, 64 * 1024)
                            : hak_rng_range(&r, 64 * 1024 + 1, 4 * MIB);
    blocks[n] = malloc(size);
    REQUIRE(blocks[n] != NULL);
    bytes += size;
    n++;
  }
  struct mallinfo2 mi = mallinfo2();
  size_t reported = mi.uordblks + mi.hblkhd - live0;
  double ratio = (double)reported / (double)bytes;
  if (ratio < 1.0 || ratio > 1.05) fprintf(stderr, "mallinfo2: %zu bytes live, %zu reported\n", bytes, reported);
  CHECK(ratio >= 1.0 && ratio <= 1.05);
  CHECK(mi.arena >= mi.uordblks);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  struct mallinfo old = mallinfo(); /* the old interface, still used */
#pragma GCC diagnostic pop
  CHECK(old.uordblks > 0 && (size_t)old.uordblks <= mi.uordblks);
  free_all(blocks, n);
  mi = mallinfo2();
  CHECK(mi.uordblks + mi.hblkhd <= live0 + 64 * 1024);
}

/* The mapping holding p has the THP flag HAKMEM_THP asks for. */
static void test_thp(void) {
  char* p = malloc(100);
  FILE* f = fopen("/proc/self/smaps", "r");
  REQUIRE(f != NULL);
  char line[512];
  int in_mapping = 0, hg = -1, nh = -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      in_mapping = (uintptr_t)p >= lo && (uintptr_t)p < hi;
    } else if (in_mapping && strncmp(line, "VmFlags:", 8) == 0) {
      hg = strstr(line, " hg") != NULL;
      nh = strstr(line, " nh") != NULL;
    }
  }
  fclose(f);
  free(p);
  CHECK(hg >= 0);
  if (HAK_POLICY(thp) == HAK_THP_ON) CHECK(hg == 1 && nh == 0);
  if (HAK_POLICY(thp) == HAK_THP_OFF) CHECK(nh == 1 && hg == 0);
  if (HAK_POLICY(thp) == HAK_THP_SYSTEM) CHECK(hg == 0 && nh == 0);
}

/* Runs this program with two more environment entries (test_option_warnings). */
static void run_self(const char* env1, const char* env2, char* out, size_t cap) {
  const char* env[] = {env1, env2, NULL};
  CHECK(hak_run_self("--print-policy", env, out, cap) == 0);
}

/* In a process of its own (--fill-under-limit): an address-space limit
 * lowered below the process's size while it runs, then a huge block that the
 * arena would serve by moving an old granule's pages into its own (a kernel
 * refusing such a move under the limit had unmapped the destination first,
 * and the block was handed out with a hole: a review found it).  The block
 * must be whole, or refused with ENOMEM; the live one next to it intact. */
/* The first huge blocks of a process: three of 3 MiB side by side in the
 * arena, written (the middle one with 2s), the outer two freed, so that
 * their granules are dirty, beyond what the arena keeps once a block larger
 * than either hole is taken.  Returns the middle one (NULL if out of
 * memory) and in *first where the first was. */
static char* arena_two_holes(char** first) {
  char *a = malloc(3 * MIB), *x = malloc(3 * MIB), *c = malloc(3 * MIB);
  if (a == NULL || x == NULL || c == NULL) return NULL;
  memset(a, 1, 3 * MIB);
  memset(x, 2, 3 * MIB);
  memset(c, 3, 3 * MIB);
  free(a);
  free(c);
  *first = a;
  return x;
}

static int fill_under_limit(void) {
  char* a;
  char* x = arena_two_holes(&a);
  if (x == NULL) return 2;
  long kib = 0;
  char line[256];
  FILE* f = fopen("/proc/self/status", "r");
  if (f == NULL) return 2;
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "VmSize: %ld kB", &kib) == 1) break;
  fclose(f);
  struct rlimit as = {(rlim_t)(kib - 16 * 1024) * 1024, RLIM_INFINITY};
  if (kib <= 16 * 1024 || setrlimit(RLIMIT_AS, &as) != 0) return 2;
  errno = 0;
  char* b = malloc(5 * MIB);
  if (b == NULL && errno != ENOMEM) return 3;
  if (b != NULL) memset(b, 4, 5 * MIB);
  for (size_t i = 0; i < 3 * MIB; i += 512)
    if (x[i] != 2) return 4;
  free(b);
  free(x);
  return 0;
}

/* The kernel refusing a move of pages and then the mapping made in its place
 * (--refused-move): the process's own mremap and mmap, which hakmem's calls
 * reach (it is linked in statically), refuse them while `refusing` is set,
 * as a kernel out of mappings or of committed memory does: the move's
 * destination unmapped first, then ENOMEM. */
static volatile bool refusing; /* (volatile: the compiler takes malloc for reading no global) */
static volatile int moves_refused, maps_refused;

void* mremap(void* old, size_t old_size, size_t new_size, int flags, ...) {
  void* to = NULL;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    to = va_arg(ap, void*);
    va_end(ap);
  }
  if (refusing && (flags & MREMAP_DONTUNMAP)) {
    munmap(to, new_size);
    moves_refused++;
    errno = ENOMEM;
    return MAP_FAILED;
  }
  return (void*)syscall(SYS_mremap, old, old_size, new_size, flags, to);
}

void* mmap(void* at, size_t size, int prot, int flags, int fd, off_t offset) {
  if (refusing && (flags & MAP_FIXED)) {
    maps_refused++;
    errno = ENOMEM;
    return MAP_FAILED;
  }
  return (void*)syscall(SYS_mmap, at, size, prot, flags, fd, offset);
}

/* A huge block whose arena run would take an old granule's pages by a move
 * (as in fill_under_limit), with the move and the mapping again refused: the
 * granule is left unmapped, so it must stay out of use for good.  The block
 * is made elsewhere, whole; the live one beside it intact; and huge blocks
 * of every size afterwards, written through, never land on the hole (a
 * granule given back with the others would). */
static int refused_move(void) {
  if ((HAK_SECURE && !hak_os_guard_marks()) || hak_os_space_limited()) return 0; /* no moves made there */
  char* a;
  char* x = arena_two_holes(&a);
  if (x == NULL) return 2;
  refusing = true;
  char* b = malloc(7 * MIB); /* c's two granules and two fresh ones, a move into the first */
  refusing = false;
  if (moves_refused != 1 || maps_refused != 1) return 3; /* the path not reached */
  if (b == NULL) return 4;
  /* Every granule the arena counts backed has pages: of the first eight
   * (a's, x's, c's, the two fresh ones, the first now unmapped), the free
   * ones with a page resident.  (The fresh one after the hole had been
   * given back counted backed.) */
  uint8_t* first = (uint8_t*)((uintptr_t)a & ~(uintptr_t)HAK_SEG_MASK);
  uint8_t* live = (uint8_t*)((uintptr_t)x & ~(uintptr_t)HAK_SEG_MASK);
  size_t reserved, dirty, free_bytes, backed = 0;
  hak_huge_arena_info(&reserved, &dirty, &free_bytes);
  for (int g = 0; g < 8; g++) {
    uint8_t* granule = first + (size_t)g * HAK_SEG_SIZE;
    unsigned char pages[HAK_SEG_SIZE / 4096];
    if (granule == live || granule == live + HAK_SEG_SIZE) continue;
    if (mincore(granule, HAK_SEG_SIZE, pages) != 0) continue; /* (the hole) */
    for (size_t i = 0; i < sizeof pages; i++)
      if (pages[i] & 1) {
        backed += HAK_SEG_SIZE;
        break;
      }
  }
  if (dirty == 0 || dirty > backed) return 7;
  memset(b, 4, 7 * MIB);
  for (size_t i = 0; i < 3 * MIB; i += 512)
    if (x[i] != 2) return 5;
  enum { N = 24 };
  char* blocks[N];
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < N; i++) {
      size_t size = (size_t)(1 + (i + round) % 6) * MIB + 4096 * (size_t)i;
      if ((blocks[i] = malloc(size)) == NULL) return 6;
      memset(blocks[i], i, size);
    }
    for (int i = 0; i < N; i++) free(blocks[i]);
  }
  free(b);
  free(x);
  return 0;
}

/* In a process of its own (--zero-fresh), where the first blocks take a
 * fresh segment's units: (1) a large block grown in place by realloc over
 * free units known to read as zero (hak_page_grow), written, freed, and a
 * calloc on those units reads zero (the mark must go when realloc takes
 * them); (2) locked memory (mlock) that the kernel refuses to purge keeps
 * its bytes, and calloc of large and huge blocks on it reads zero all the
 * same (a review found purges of locked memory taken for zeroed).  The
 * memory stays locked, hence the process of its own. */
static int zero_fresh(void) {
  void* a = malloc(200 * 1024);
  char* p = malloc(200 * 1024);
  char* q = realloc(p, 900 * 1024);
  void* b = malloc(700 * 1024);
  if (a == NULL || q == NULL || b == NULL) return 2;
  memset(q, 0x5a, 900 * 1024);
  __asm__ volatile("" : : "r"(q) : "memory"); /* (the writes before the free stay) */
  free(q);
  void* x = malloc(200 * 1024);
  unsigned char* c = calloc(1, 700 * 1024);
  if (x == NULL || c == NULL) return 2;
  for (size_t i = 0; i < 700 * 1024; i++)
    if (c[i] != 0) return 3;
  free(a);
  free(b);
  free(x);
  free(c);
  static const size_t sizes[] = {512 * 1024, 4 * MIB};
  for (int round = 0; round < 4; round++) {
    size_t size = sizes[round % 2];
    char* blocks[8];
    for (int i = 0; i < 8; i++) {
      if ((blocks[i] = malloc(size)) == NULL) return 2;
      if (mlock(blocks[i], size) != 0) return 0; /* (not allowed here: nothing to test) */
      memset(blocks[i], 0xab, size);
      __asm__ volatile("" : : "r"(blocks[i]) : "memory");
    }
    for (int i = 0; i < 8; i++) free(blocks[i]); /* still locked */
    malloc_trim(0);
    for (int i = 0; i < 8; i++) {
      unsigned char* z = calloc(1, size);
      if (z == NULL) return 2;
      for (size_t k = 0; k < size; k++)
        if (z[k] != 0) return 4;
      free(z);
    }
  }
  return 0;
}

static void test_zero_fresh(void) {
  char out[256];
  const char* env[] = {"HAKMEM_PURGE=dontneed", NULL};
  int rc = hak_run_self("--zero-fresh", env, out, sizeof out);
  if (rc != 0) fprintf(stderr, "--zero-fresh: exit %d\n", rc);
  CHECK(rc == 0);
}

static void test_fill_under_limit(void) {
  char out[256];
  const char* env[] = {"HAKMEM_PURGE_DELAY_MS=100", "HAKMEM_PURGE=dontneed", NULL};
  CHECK(hak_run_self("--fill-under-limit", env, out, sizeof out) == 0);
}

static void test_refused_move(void) {
  char out[256];
  const char* env[] = {"HAKMEM_PURGE_DELAY_MS=100", "HAKMEM_PURGE=dontneed", NULL};
  int rc = hak_run_self("--refused-move", env, out, sizeof out);
  if (rc != 0) fprintf(stderr, "--refused-move: exit %d\n", rc);
  CHECK(rc == 0);
}

static void test_option_warnings(void) {
  char out[4096];
  run_self("HAKMEM_NO_SUCH_OPTION=1", "HAKMEM_PURGE_DELAY_MS=soon", out, sizeof out);
  CHECK(strstr(out, "hakmem: unknown option: HAKMEM_NO_SUCH_OPTION=1") != NULL);
  CHECK(strstr(out, "hakmem: invalid value: HAKMEM_PURGE_DELAY_MS=soon") != NULL);
  CHECK(strstr(out, "purge_delay_ms=100 ") != NULL); /* the default kept */
  run_self("HAKMEM_PURGE=free", "HAKMEM_THP=off", out, sizeof out);
  CHECK(strstr(out, "purge_mode=1 thp=2") != NULL);
  CHECK(strstr(out, "hakmem:") == NULL);
  run_self("HAKMEM_PURGE_DELAY_MS=-2", "HAKMEM_VERBOSE=1", out, sizeof out);
  CHECK(strstr(out, "invalid value: HAKMEM_PURGE_DELAY_MS=-2") != NULL);
  /* VERBOSE's listing (tools/hakmem config reads it): the version, then each
   * option's value, default, values, where it came from and its meaning. */
  CHECK(strstr(out, "hakmem: version=") != NULL);
  CHECK(strstr(out, "hakmem: HAKMEM_PURGE_DELAY_MS=100\tdefault=100\tvalues=-1 to 3600000\tfrom=default\t"
                    "meaning=milliseconds ") != NULL);
  CHECK(strstr(out, "hakmem: HAKMEM_VERBOSE=on\tdefault=off\tvalues=off, on\tfrom=environment\t") != NULL);
  run_self("HAKMEM_STATS=json:/nonexistent/s.json", "HAKMEM_VERBOSE=on", out, sizeof out);
  CHECK(strstr(out, "hakmem: HAKMEM_STATS=json:/nonexistent/s.json\tdefault=off\tvalues=off, on, json:PATH\t"
                    "from=environment\t") != NULL);
}

/* Run alone (--growth), so that the segments' peak is this test's: a huge
 * block written and freed stays backed in the arena (its own peak allows
 * it), then the segments grow past the most they ever held by as much in
 * blocks of 512 KiB.  The new segments are the arena's free granules, taken
 * with their pages (hak_huge_take_granule: nothing faulted in, no mapping
 * split), and the arena purges the rest down to what the peak of committed
 * memory, and an eighth, leaves (hak_huge_purge_for_growth), so that the two
 * are not resident at once.  The blocks hold what they are written. */
static void test_huge_dirty_growth(void) {
  const size_t big = 8 * MIB, part = 512 * 1024;
  enum { PARTS = 16 };
  size_t reserved, dirty, free_bytes;
  if (HAK_POLICY(purge_delay_ms) <= 0) return; /* nothing stays backed, or everything does */
  char* h = malloc(big);
  REQUIRE(h != NULL);
  memset(h, 1, big);
  uintptr_t h_lo = (uintptr_t)h & ~(uintptr_t)HAK_SEG_MASK, h_hi = (uintptr_t)h + big;
  free(h);
  hak_huge_arena_info(&reserved, &dirty, &free_bytes);
  CHECK(dirty >= big);
  size_t maps = kernel_mappings();
  void* parts[PARTS];
  size_t taken = 0;
  for (int i = 0; i < PARTS; i++) {
    size_t f = minor_faults();
    parts[i] = malloc(part);
    REQUIRE(parts[i] != NULL);
    hak_pattern_fill(parts[i], part, (unsigned)i);
    if ((uintptr_t)parts[i] >= h_lo && (uintptr_t)parts[i] < h_hi) { /* in a granule of h's */
      taken++;
      CHECK(minor_faults() - f <= 4);
    }
  }
  struct rlimit as;
  bool unlimited = getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur == RLIM_INFINITY;
  if ((!HAK_SECURE || hak_os_guard_marks()) && unlimited) CHECK(taken >= 6); /* two segments' worth at least */
  if (!unlimited) CHECK(taken == 0); /* (a taken granule would keep its chunk mapped) */
  CHECK(kernel_mappings() <= maps + 2);
  hak_huge_arena_info(&reserved, &dirty, &free_bytes);
  size_t now = C(committed_bytes) + C(huge_live_bytes), peak = C(budget_peak_bytes);
  CHECK(now >= PARTS * part);
  CHECK(dirty + now <= peak + peak / 8 + HAK_SEG_SIZE);
  CHECK(dirty < big);
  for (int i = 0; i < PARTS; i++) CHECK(hak_pattern_check(parts[i], part, (unsigned)i) == part);
  for (int i = 0; i < PARTS; i++) free(parts[i]);
}

int main(int argc, char** argv) {
  free(malloc(1)); /* start-up (reads the options) */
  if (argc > 1 && strcmp(argv[1], "--print-options") == 0) {
    hak_policy_print_table(1);
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--print-policy") == 0) {
    printf("purge_delay_ms=%d purge_mode=%d thp=%d\n", HAK_POLICY(purge_delay_ms), HAK_POLICY(purge_mode),
           HAK_POLICY(thp));
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "--fill-under-limit") == 0) return fill_under_limit();
  if (argc > 1 && strcmp(argv[1], "--zero-fresh") == 0) return zero_fresh();
  if (argc > 1 && strcmp(argv[1], "--refused-move") == 0) return refused_move();
  if (argc > 1 && strcmp(argv[1], "--growth") == 0) {
    test_huge_dirty_growth();
    return hak_test_result("test_memory --growth");
  }
  live_make();
  test_purge_delay();
  test_segments_kept();
  test_purge_watch();
  in_new_thread(large_runs_thread);
  test_reuse();
  test_empty_pages_age();
  test_layout_purge();
  test_huge_reuse();
  test_huge_coalesce();
  test_huge_dirty_window();
  test_huge_moved_pages();
  test_huge_purge();
  test_huge_realloc();
  test_huge_calloc_after_madv_free();
  test_large_calloc_zero();
  test_fill_under_limit();
  test_refused_move();
  test_zero_fresh();
  test_huge_mappings();
  in_new_thread(realloc_in_place_thread);
  in_new_thread(realloc_chain_thread);
  test_trim();
  test_huge_own_mappings_purge();
  test_trim_exited();
  test_trim_global();
  test_mallinfo();
  test_thp();
  if (HAK_POLICY(purge_delay_ms) == 100 && HAK_POLICY(thp) == HAK_THP_SYSTEM) test_option_warnings();
  for (int i = 0; i < LIVE; i++) free(live[i]);
  return hak_test_result("test_memory");
}
