/* Pages: runs of 64 KiB units in a segment holding blocks of one class.
 * The hot box meets the cold box here: hak_page_new (refill) and
 * hak_page_retire (an empty page gives its units back). */
#include <string.h>

#include "internal.h"

/* ---- segment lists of a heap -------------------------------------------- */

static void seg_push(hak_segment_t** list, hak_segment_t* seg) {
  seg->prev = NULL;
  seg->next = *list;
  if (*list) (*list)->prev = seg;
  *list = seg;
}

static void seg_remove(hak_segment_t** list, hak_segment_t* seg) {
  if (seg->prev) seg->prev->next = seg->next; else *list = seg->next;
  if (seg->next) seg->next->prev = seg->prev;
  seg->next = seg->prev = NULL;
}

/* ---- carving -------------------------------------------------------------- */

/* Carves the next blocks onto the free list: those that start on the next OS
 * page not yet touched (at least one block).  Writing a block's link touches
 * its page, so a page is committed only when it is about to be used, and a
 * class never holds more than part of a page carved and unused. */
void hak_page_extend(hak_page_t* page) {
  uint32_t bs = page->block_size;
  uint8_t* first = hak_page_start(page) + (size_t)page->capacity * bs;
  uintptr_t boundary = ((uintptr_t)first & ~(uintptr_t)(HAK_OS_PAGE - 1)) + HAK_OS_PAGE;
  uint32_t n = (uint32_t)((boundary - (uintptr_t)first + bs - 1) / bs);
#if HAK_SECURE
  /* Enough blocks that their order is hard to guess. */
  uint32_t least = HAK_SECURE_CARVE_BYTES / bs;
  if (least > HAK_SECURE_CARVE_MIN) least = HAK_SECURE_CARVE_MIN;
  if (least < HAK_SECURE_CARVE_FEW) least = HAK_SECURE_CARVE_FEW;
  if (n < least) n = least;
  if (n > HAK_SECURE_CARVE_MAX) n = HAK_SECURE_CARVE_MAX;
#endif
  uint32_t left = (uint32_t)(page->reserved - page->capacity);
  if (n > left) n = left;
#if HAK_SECURE
  page->free = hak_secure_carve(first, bs, n, page->free);
#else
  uint8_t* b = first;
  for (uint32_t i = 1; i < n; i++, b += bs) hak_block_set_next((hak_block_t*)b, (hak_block_t*)(b + bs));
  hak_block_set_next((hak_block_t*)b, page->free);
  page->free = (hak_block_t*)first;
#endif
  page->capacity += n;
}

/* Points the descriptors of units idx+from .. idx+to-1 back at the page's head. */
static void link_units(hak_segment_t* seg, unsigned idx, unsigned from, unsigned to) {
  for (unsigned j = from; j < to; j++) seg->pages[idx + j].head_off = (uint16_t)(j * sizeof(hak_page_t));
}

/* Formats the n units at seg->pages[idx] as a page of class cls (or one
 * large block). */
static void page_format(hak_page_t* page, unsigned cls) {
  hak_segment_t* seg = hak_segment_of(page);
  unsigned idx = page->index, n = page->units;
  link_units(seg, idx, 1, n);
  uint8_t* start = (uint8_t*)seg + ((size_t)idx << HAK_UNIT_SHIFT);
  uint8_t* end = start + ((size_t)n << HAK_UNIT_SHIFT);
  page->head_off = 0;
  page->in_full = 0;
  page->has_aligned = 0;
  page->home = 0;
  page->used = 0;
  page->cls = (uint8_t)cls;
  /* (Adjacent pages of a class apart by 5 lines, segments by 1.) */
  if (cls != HAK_CLASS_LARGE)
    start += (size_t)((idx * 5 + ((uintptr_t)seg >> HAK_SEG_SHIFT)) % hak_class_start_lines[cls]) * 64 +
             hak_class_start_off[cls];
  hak_page_set_start(page, start);
  page->next = page->prev = NULL;
  if (cls == HAK_CLASS_LARGE) {
    page->block_size = (uint32_t)(end - start);
    page->reserved = page->capacity = 1;
    page->free = (hak_block_t*)start;
    hak_block_set_next(page->free, hak_list_end(page));
  } else {
    page->block_size = hak_class_size[cls];
    page->reserved = (uint32_t)((size_t)(end - start) / page->block_size);
    page->capacity = 0;
    page->free = hak_list_end(page);
    hak_page_extend(page);
  }
  page->div_magic = hak_div_magic(page->block_size);
}

/* Purges the units of seg in mask, one madvise per run of them; returns
 * those that read as zero now. */
static uint32_t purge_unit_runs(hak_segment_t* seg, uint32_t mask) {
  uint32_t zeroed = 0;
  while (mask != 0) {
    unsigned lo = (unsigned)__builtin_ctz(mask);
    unsigned len = (unsigned)__builtin_ctzll(~(uint64_t)(mask >> lo)); /* <= 32 */
    if (hak_os_purge((uint8_t*)seg + ((size_t)lo << HAK_UNIT_SHIFT), (size_t)len << HAK_UNIT_SHIFT))
      zeroed |= hak_unit_mask(lo, len);
    mask &= ~hak_unit_mask(lo, len);
  }
  return zeroed;
}

/* A block larger than an OS page may span one that its first and last
 * bytes miss: a program that writes only the start and the end of its
 * buffers has only the OS pages it wrote resident.  Memory still backed
 * from another page holds the OS pages that page's blocks touched, and a
 * page of such blocks laid over it would keep those resident beside its own:
 * where pages change class over the same units, RSS would creep towards all
 * of them (random 1-64 KiB blocks: peak RSS 11.4 MB after 1 s, 15.6 after
 * 4 s; docs/BENCHMARKS.md).  So such a page first purges the backed units it
 * takes (mask), unless nothing may be purged (a delay of -1) or huge pages
 * are asked for (the purge would split them, and the program chose RSS in
 * 2 MiB steps).  Blocks of an OS page or less touch every OS page of their
 * units.  Large blocks' pages (one block each, from the start of its run)
 * are left as they are: no benchmark of the suite showed them creep. */
static void purge_for_layout(hak_segment_t* seg, uint32_t mask, unsigned cls) {
  if (cls == HAK_CLASS_LARGE || hak_class_size[cls] <= HAK_OS_PAGE || HAK_POLICY(purge_delay_ms) < 0 ||
      HAK_POLICY(thp) == HAK_THP_ON)
    return;
  (void)purge_unit_runs(seg, mask); /* (taken now: whether they read as zero does not matter) */
}

/* A page from the heap's empty pages: of the same class if there is one (it
 * is ready as it is), else of the same size (formatted anew).  Recently
 * emptied memory is still in the cache; reusing it first keeps the working
 * set small. */
static hak_page_t* page_from_empty(hak_heap_t* heap, unsigned cls, unsigned n) {
  hak_page_t* same_size = NULL;
  for (hak_page_t* page = heap->empty.first; page != NULL; page = page->next) {
    if (page->units != n) continue;
    if (page->cls == cls) {
      same_size = page;
      break;
    }
    if (same_size == NULL) same_size = page;
  }
  if (same_size == NULL) return NULL;
  hak_heap_empty_remove(heap, same_size);
  if (same_size->cls != cls)
    purge_for_layout(hak_segment_of(same_size), hak_unit_mask(same_size->index, n), cls);
  if (same_size->cls != cls || cls == HAK_CLASS_LARGE) page_format(same_size, cls);
  return same_size;
}

/* Takes n free units of one of the heap's segments at idx. */
static void heap_take_units(hak_heap_t* heap, hak_segment_t* seg, unsigned idx, unsigned n) {
  hak_segment_take_units(seg, idx, n);
  seg->zero_units &= ~hak_unit_mask(idx, n); /* the page writes them */
  uint32_t reused = seg->dirty_units & hak_unit_mask(idx, n);
  if (reused != hak_unit_mask(idx, n)) hak_learn_note_reuse(seg, hak_unit_mask(idx, n) & ~reused);
  seg->dirty_units &= ~reused;
  heap->dirty_units -= (size_t)hak_popcount(reused);
  hak_committed_add((size_t)(n - (unsigned)hak_popcount(reused)) << HAK_UNIT_SHIFT);
  if (seg->free_units == 0) {
    seg_remove(&heap->segments, seg);
    seg_push(&heap->full_segments, seg);
  }
}

/* A segment of the heap with n free units in a row, preferring backed ones. */
static hak_segment_t* segment_with_units(hak_heap_t* heap, unsigned n, int* idx) {
  if (n > heap->segments_room) return NULL;
  hak_segment_t* found = NULL;
  uint32_t room = 0;
  for (hak_segment_t* seg = heap->segments; seg != NULL; seg = seg->next) {
    bool backed;
    int at = hak_segment_find_units(seg, n, &backed);
    if (seg->free_count > room) room = seg->free_count;
    if (at < 0 || (found != NULL && !backed)) continue;
    found = seg;
    *idx = at;
    if (backed) break;
  }
  if (found == NULL) heap->segments_room = room; /* (it saw them all) */
  return found;
}

/* The smallest run a large block takes (one above the largest class): the
 * ring keeps no smaller one (the one-unit pages of realloc's homes). */
#define HAK_LARGE_MIN_UNITS ((HAK_CLASS_MAX_SIZE + HAK_UNIT_SIZE) >> HAK_UNIT_SHIFT)
#define LARGE_RUN_UNITS 31u /* of a ring entry: units; above them, << 5, the first */

/* The newest run of n units the heap gave back from a large block's page
 * that is still free and backed, taken out of the ring; NULL if none. */
static hak_segment_t* large_run_again(hak_heap_t* heap, unsigned n, int* idx) {
  for (unsigned i = 1; i <= HAK_LARGE_RUNS; i++) {
    uintptr_t* run = &heap->large_runs[(heap->large_run_next - i) % HAK_LARGE_RUNS];
    if ((*run & LARGE_RUN_UNITS) != n) continue;
    hak_segment_t* seg = hak_segment_of((void*)*run);
    unsigned at = (unsigned)(*run >> 5) & 31;
    *run = 0;
    uint32_t mask = hak_unit_mask(at, n);
    if ((seg->dirty_units & mask) == mask) { /* (dirty units are free) */
      *idx = (int)at;
      return seg;
    }
  }
  return NULL;
}

/* Notes a run a large block's page gave back. */
static void large_run_note(hak_heap_t* heap, hak_segment_t* seg, unsigned idx, unsigned n) {
  if (n < HAK_LARGE_MIN_UNITS || n > LARGE_RUN_UNITS || heap->segment_count <= HAK_LARGE_RUNS_SEGMENTS) return;
  heap->large_runs[heap->large_run_next++ % HAK_LARGE_RUNS] = (uintptr_t)seg | idx << 5 | n;
}

/* Forgets the runs of a segment leaving the heap. */
static void large_runs_forget(hak_heap_t* heap, const hak_segment_t* seg) {
  for (unsigned i = 0; i < HAK_LARGE_RUNS; i++)
    if (hak_segment_of((void*)heap->large_runs[i]) == seg) heap->large_runs[i] = 0;
}

/* Units given back to one of the heap's segments (or a segment joining it). */
static void heap_note_room(hak_heap_t* heap, const hak_segment_t* seg) {
  if (seg->free_count > heap->segments_room) heap->segments_room = seg->free_count;
}

/* A page of class cls (or one large block) on the n free units at idx of seg,
 * one of the heap's segments; *zero (if zero is not NULL): whether they all
 * read as zero. */
static hak_page_t* page_place(hak_heap_t* heap, hak_segment_t* seg, unsigned idx, unsigned n, unsigned cls,
                              bool* zero) {
  if (zero != NULL) *zero = (seg->zero_units & hak_unit_mask(idx, n)) == hak_unit_mask(idx, n);
  purge_for_layout(seg, seg->dirty_units & hak_unit_mask(idx, n), cls);
  heap_take_units(heap, seg, idx, n);
  hak_page_t* page = &seg->pages[idx];
  page->units = (uint8_t)n;
  page->index = (uint8_t)idx;
  hak_page_claim(heap, page);
  page_format(page, cls);
  hak_count(pages, 1);
  return page;
}

/* A new page for class cls (or, with cls == HAK_CLASS_LARGE, one block of
 * large_size bytes): an empty page of the heap, else free units of its
 * segments, else an abandoned heap's segments, else a new segment. */
hak_page_t* hak_page_new(hak_heap_t* heap, unsigned cls, size_t large_size, bool* zero) {
  unsigned n = cls == HAK_CLASS_LARGE
                   ? (unsigned)((large_size + HAK_UNIT_SIZE - 1) >> HAK_UNIT_SHIFT)
                   : hak_class_units[cls];
  hak_heap_purge_if_due(heap, hak_now_ms());
  if (zero != NULL) *zero = false;
  hak_page_t* page = page_from_empty(heap, cls, n);
  if (page != NULL) return page;
  int idx = -1;
  hak_segment_t* seg = cls == HAK_CLASS_LARGE && heap->segment_count > HAK_LARGE_RUNS_SEGMENTS
                           ? large_run_again(heap, n, &idx)
                           : NULL;
  if (seg == NULL) seg = segment_with_units(heap, n, &idx);
  if (seg == NULL && heap->empty.first != NULL) {
    /* Empty pages of other sizes may free a long enough run. */
    hak_heap_flush_empty(heap);
    seg = segment_with_units(heap, n, &idx);
  }
  if (seg == NULL && hak_heap_absorb_abandoned(heap)) {
    /* An exited thread's memory is here now: look again before mapping. */
    seg = segment_with_units(heap, n, &idx);
  }
  if (seg == NULL) {
    hak_heaps_collect_spare(heap);
    if ((seg = hak_segment_acquire(heap)) == NULL) return NULL;
    seg_push(&heap->segments, seg);
    heap->segment_count++;
    if (seg->dirty_units != 0) { /* a cached segment still backed: purged in the heap's turn */
      hak_heap_purge_by(heap, hak_now_ms()); /* the next pass works out when */
      heap->dirty_units += (size_t)hak_popcount(seg->dirty_units);
    }
    idx = 1;
  }
  page = page_place(heap, seg, (unsigned)idx, n, cls, zero);
  heap_note_room(heap, seg); /* (a new segment: what the page leaves) */
  return page;
}

/* The longest run of set bits in m: its length, and its first bit in *at. */
static unsigned longest_run(uint32_t m, unsigned* at) {
  unsigned best = 0;
  while (m != 0) {
    unsigned start = (unsigned)__builtin_ctz(m);
    uint64_t rest = ~((uint64_t)m >> start);
    unsigned len = (unsigned)__builtin_ctzll(rest);
    if (len > best) {
      best = len;
      *at = start;
    }
    m &= ~hak_unit_mask(start, len);
  }
  return best;
}

/* A realloc home (alloc.c): a large block at the start of the longest run of
 * free units of the heap's segments, so that it can grow over the run in
 * place.  The heap's kept empty large pages give their units back first:
 * the last growing buffer's home is usually among them, still backed. */
hak_page_t* hak_page_new_home(hak_heap_t* heap, size_t size) {
  unsigned n = (unsigned)((size + HAK_UNIT_SIZE - 1) >> HAK_UNIT_SHIFT);
  uint32_t now = hak_now_ms();
  for (hak_page_t* page = heap->empty.first, *next; page != NULL; page = next) {
    next = page->next;
    if (page->cls != HAK_CLASS_LARGE) continue;
    hak_heap_empty_remove(heap, page);
    hak_page_retire(heap, page, now);
  }
  hak_heap_purge_if_due(heap, now);
  hak_segment_t* best = NULL;
  unsigned best_len = 0, best_at = 0;
  for (hak_segment_t* seg = heap->segments; seg != NULL; seg = seg->next) {
    unsigned at = 0, len = longest_run(seg->free_units, &at);
    if (len > best_len) {
      best = seg;
      best_len = len;
      best_at = at;
    }
  }
  if (best == NULL || best_len < n) return hak_page_new(heap, HAK_CLASS_LARGE, size, NULL);
  return page_place(heap, best, best_at, n, HAK_CLASS_LARGE, NULL);
}

/* Of a heap no thread uses any more (its own thread has ended): the page's
 * free blocks go back on its list in address order, so that the next owner
 * fills the lowest first, and the carved memory above its highest block in use
 * is given back (the blocks there are carved again when needed).  Blocks in
 * use thus gather at the start of their pages as threads come and go, instead
 * of each page keeping the most it ever held. */
void hak_page_trim(hak_page_t* page) {
  if (page->cls == HAK_CLASS_LARGE || page->free == hak_list_end(page) || page->used == 0) return;
  uint64_t is_free[HAK_UNIT_SIZE / 16 / 64] = {0}; /* the most blocks a page holds */
  uint32_t cap = page->capacity, bs = page->block_size;
  if (cap > sizeof is_free * 8) return;
  for (hak_block_t* b = page->free; b != hak_list_end(page); b = hak_block_next(b)) {
    hak_free_entry_check(page, b);
    uint32_t i = (uint32_t)((size_t)((uint8_t*)b - hak_page_start(page)) / bs);
#if HAK_SECURE
    if (i >= cap) hak_bad_link(b); /* of the segment, not of this page */
#endif
    is_free[i / 64] |= (uint64_t)1 << (i % 64);
  }
  uint32_t top = cap; /* one past the highest block in use */
  while (top > 0 && (is_free[(top - 1) / 64] >> ((top - 1) % 64) & 1)) top--;
  uintptr_t from = ((uintptr_t)hak_page_start(page) + (size_t)top * bs + HAK_OS_PAGE - 1) & ~(uintptr_t)(HAK_OS_PAGE - 1);
  uintptr_t to = ((uintptr_t)hak_page_start(page) + (size_t)cap * bs + HAK_OS_PAGE - 1) & ~(uintptr_t)(HAK_OS_PAGE - 1);
  if (from < to && HAK_POLICY(purge_delay_ms) >= 0) { /* -1: nothing is purged but by malloc_trim */
    cap = top;
    hak_os_purge((void*)from, to - from); /* committed stays counted by whole units */
  }
  hak_block_t* list = hak_list_end(page);
  for (uint32_t i = cap; i-- > 0;) {
    if (is_free[i / 64] >> (i % 64) & 1) {
      hak_block_t* b = (hak_block_t*)(hak_page_start(page) + (size_t)i * bs);
      hak_block_set_next(b, list);
      list = b;
    }
  }
  page->free = list;
  page->capacity = cap;
}

/* Grows the single-block page of a large block in place to hold size bytes,
 * if the units after it are free (realloc then copies nothing). */
bool hak_page_grow(hak_heap_t* heap, hak_page_t* page, size_t size) {
  hak_segment_t* seg = hak_segment_of(page);
  unsigned idx = page->index, n = page->units;
  unsigned want = (unsigned)((size + HAK_UNIT_SIZE - 1) >> HAK_UNIT_SHIFT);
  if (want <= n || idx + want > HAK_UNITS) return false;
  uint32_t more = hak_unit_mask(idx + n, want - n);
  if ((seg->free_units & more) != more) return false;
  /* Ahead, to twice its units (at most a large block's) where those are free
   * too: a block realloc grew once is most often grown again, and each unit
   * boundary it crosses is a call here (growth by half to 1 MiB crossed 7 a
   * buffer, 4 so). */
  unsigned ahead = 2 * n < HAK_LARGE_MAX >> HAK_UNIT_SHIFT ? 2 * n : HAK_LARGE_MAX >> HAK_UNIT_SHIFT;
  if (ahead > HAK_UNITS - idx) ahead = HAK_UNITS - idx;
  while (want < ahead && (seg->free_units >> (idx + want) & 1)) want++;
  heap_take_units(heap, seg, idx + n, want - n);
  link_units(seg, idx, n, want);
  page->units = (uint8_t)want;
  page->block_size = (uint32_t)want << HAK_UNIT_SHIFT;
  if (!hak_page_is_sampled(page)) /* (a sampled block's page keeps its mark) */
    __atomic_store_n(&page->div_magic, hak_div_magic(page->block_size), __ATOMIC_RELAXED);
  return true;
}

/* An empty page gives its units back to its segment: as free units backed
 * since freed_ms, or (not backed) as units whose memory went back to the
 * system already; an empty segment goes back to the segment cache. */
static void page_retire(hak_heap_t* heap, hak_page_t* page, uint32_t freed_ms, bool backed) {
  hak_assert(page->used == 0);
  hak_segment_t* seg = hak_segment_of(page);
  unsigned idx = page->index, n = page->units;
  bool was_full = seg->free_units == 0, large = page->cls == HAK_CLASS_LARGE;
  hak_stat_add(heap->stats.retires[hak_stat_class(page)], 1);
  memset(&seg->pages[idx], 0, n * sizeof(hak_page_t));
  seg->stamped_units &= ~(1u << idx);
  hak_segment_give_units(seg, idx, n);
  if (backed) {
    seg->dirty_units |= hak_unit_mask(idx, n);
    for (unsigned j = idx; j < idx + n; j++) seg->unit_freed_ms[j] = freed_ms;
    hak_heap_purge_by(heap, freed_ms + (uint32_t)HAK_POLICY(purge_delay_ms));
    heap->dirty_units += n;
  } else {
    for (unsigned j = idx; j < idx + n; j++) seg->unit_purged_ms[j] = 0; /* (not for the delay: learn.c) */
  }
  if (was_full) {
    seg_remove(&heap->full_segments, seg);
    seg_push(&heap->segments, seg);
  }
  if (seg->free_units == HAK_SEG_ALL_FREE) {
    /* Leaving the heap: the cache purges it in its turn. */
    heap->dirty_units -= (size_t)hak_popcount(seg->dirty_units); /* kept with it */
    seg_remove(&heap->segments, seg);
    heap->segment_count--;
    large_runs_forget(heap, seg);
    hak_segment_release(seg);
    heap->purge_looked_ms = 0; /* the cache may be over its budget: look at the next event */
  } else {
    heap_note_room(heap, seg);
    if (large) large_run_note(heap, seg, idx, n);
  }
}

void hak_page_retire(hak_heap_t* heap, hak_page_t* page, uint32_t freed_ms) {
  page_retire(heap, page, freed_ms, true);
}

void hak_page_retire_purged(hak_heap_t* heap, hak_page_t* page) { page_retire(heap, page, 0, false); }

/* When a kept empty page became empty (hak_heap_page_empty notes it in the
 * segment's unit_freed_ms of its first unit, which is not a free unit). */
HAK_INLINE uint32_t page_emptied_ms(hak_page_t* page) {
  hak_segment_t* seg = hak_segment_of(page);
  return seg->unit_freed_ms[page->index];
}

void hak_page_mark_emptied(hak_page_t* page, uint32_t now_ms) {
  hak_segment_t* seg = hak_segment_of(page);
  seg->unit_freed_ms[page->index] = now_ms;
}

/* Something of the heap becomes purgeable at due_ms (call it before the heap
 * counts it): its next purge pass is due no later than that. */
void hak_heap_purge_by(hak_heap_t* heap, uint32_t due_ms) {
  bool pending = heap->dirty_units != 0 || heap->empty.first != NULL;
  if (!pending || (int32_t)(due_ms - heap->purge_due_ms) < 0) heap->purge_due_ms = due_ms;
}

static HAK_NOINLINE void heap_purge_oldest(hak_heap_t* heap, uint32_t now_ms, size_t count);

/* The process-wide caches' purges, and the learner's step (out of line: the
 * page events' check stays a leaf). */
static HAK_NOINLINE void heap_look_at_caches(hak_heap_t* heap, uint32_t now_ms) {
  heap->purge_looked_ms = now_ms;
  hak_caches_purge_if_due(now_ms);
  hak_heaps_sweep(heap, now_ms, false);
  if (HAK_POLICY(learn)) hak_learn_step(now_ms);
}

/* The purge check of the page-level events (a page retired, made or
 * emptied): the empty pages and free units that have waited the delay, and
 * the oldest free units beyond the bound (HAK_DIRTY_UNITS_MAX, or half the
 * units of the heap's segments for a big heap: the delay is only checked on
 * these events, so this bounds what a thread that stops making pages keeps
 * backed;
 * purging only the excess spares a program whose free units hover about the
 * bound a fault on each of them every time they cross it). */
void hak_heap_purge_if_due(hak_heap_t* heap, uint32_t now_ms) {
  int32_t delay = HAK_POLICY(purge_delay_ms);
  if ((heap->dirty_units != 0 || heap->empty.first != NULL) && delay >= 0) {
    /* A due time set under a longer delay (hak_option_set shortened it). */
    if ((int32_t)(heap->purge_due_ms - (now_ms + (uint32_t)delay)) > 0) heap->purge_due_ms = now_ms;
    size_t bound = heap->segment_count * (HAK_UNITS - 1) / 2;
    if (bound < HAK_DIRTY_UNITS_MAX) bound = HAK_DIRTY_UNITS_MAX;
    if (heap->dirty_units > bound) heap_purge_oldest(heap, now_ms, heap->dirty_units - bound);
    else if ((int32_t)(now_ms - heap->purge_due_ms) >= 0)
      hak_heap_purge(heap, now_ms, false);
  }
  /* The process-wide caches once a clock tick at most per heap (the coarse
   * clock ticks every few milliseconds), but at once after the heap gave a
   * segment back: a program making and freeing large blocks makes millions
   * of page events a second. */
  if (now_ms != heap->purge_looked_ms) heap_look_at_caches(heap, now_ms);
  /* Much waiting (a phase freed): until it has gone, each refill checks the
   * delay, not every 64th, for a program that goes on working lightly makes
   * no page event and few refills (bench/rss_phase: a freed 1 GiB stayed). */
  heap->purge_watch = heap->dirty_units + hak_segment_cache_dirty() * (HAK_UNITS - 1) >= HAK_PURGE_WATCH_UNITS;
}

/* Purges the free units of the heap's segments freed before freed_by, and of
 * those freed at freed_by as many as `edge` (all of them if all), one madvise
 * per run of units; lowers *due to when the first of those left is due. */
static void heap_purge_units(hak_heap_t* heap, uint32_t now_ms, bool all, uint32_t freed_by, size_t edge,
                             uint32_t* due) {
  int32_t delay = HAK_POLICY(purge_delay_ms);
  size_t left = 0, idle = 0;
  for (hak_segment_t* seg = heap->segments; seg != NULL; seg = seg->next) {
    uint32_t old = 0;
    for (uint32_t dirty = seg->dirty_units; dirty != 0; dirty &= dirty - 1) {
      unsigned u = (unsigned)__builtin_ctz(dirty);
      uint32_t freed = seg->unit_freed_ms[u];
      bool waited = delay > 0 && hak_purge_is_due(freed, now_ms, delay);
      /* Stamped if it waited the delay: taken again soon, it is a refault (learn.c). */
      seg->unit_purged_ms[u] = waited ? now_ms | 1 : 0;
      idle += waited;
      int32_t before = (int32_t)(freed_by - freed);
      if (all || before > 0 || (before == 0 && edge != 0)) {
        edge -= before == 0 && !all;
        old |= 1u << u;
      } else {
        left++;
        uint32_t unit_due = freed + (uint32_t)delay;
        if ((int32_t)(unit_due - *due) < 0) *due = unit_due;
      }
    }
    seg->dirty_units &= ~old;
    seg->zero_units |= purge_unit_runs(seg, old);
    hak_committed_sub((size_t)hak_popcount(old) << HAK_UNIT_SHIFT);
  }
  heap->dirty_units = left;
  if (idle != 0) hak_count(idle_purged_units, idle);
}

/* Gives back the memory of the empty pages and of the free units of the
 * heap's segments that have stayed so for the purge delay (all of them if
 * all), and notes when the next is due.  An empty page kept for reuse but
 * not reused within the delay is retired first, its units counted free since
 * it emptied, so they go in the same pass. */
void hak_heap_purge(hak_heap_t* heap, uint32_t now_ms, bool all) {
  int32_t delay = HAK_POLICY(purge_delay_ms);
  if (delay < 0 && !all) return; /* (-1: only malloc_trim purges) */
  all = all || delay == 0;
  uint32_t due = now_ms + (uint32_t)delay;
  while (heap->empty.last != NULL) { /* oldest last */
    hak_page_t* page = heap->empty.last;
    uint32_t emptied = page_emptied_ms(page);
    if (!all && !hak_purge_is_due(emptied, now_ms, delay)) {
      if (delay >= 0) due = emptied + (uint32_t)delay;
      break;
    }
    hak_heap_empty_remove(heap, page);
    hak_page_retire(heap, page, emptied);
  }
  heap_purge_units(heap, now_ms, all, now_ms - (uint32_t)delay, SIZE_MAX, &due);
  heap->purge_due_ms = due;
}

/* Purges the heap's count oldest free units.  The ages are found one at a
 * time, oldest first: pages retired together share their stamps, so there
 * are few; past HAK_PURGE_AGES_MAX of them (a heap just absorbed, say) it
 * gives back all it can, as hak_heap_purge(all) does, rather than scan on. */
#define HAK_PURGE_AGES_MAX 16
static HAK_NOINLINE void heap_purge_oldest(hak_heap_t* heap, uint32_t now_ms, size_t count) {
  uint32_t age = UINT32_MAX; /* the units older than this number `older` */
  size_t older = 0;
  for (unsigned pass = 0;; pass++) {
    if (pass == HAK_PURGE_AGES_MAX) {
      hak_heap_purge(heap, now_ms, true);
      return;
    }
    uint32_t next = 0;
    size_t at_next = 0;
    for (hak_segment_t* seg = heap->segments; seg != NULL; seg = seg->next)
      for (uint32_t dirty = seg->dirty_units; dirty != 0; dirty &= dirty - 1) {
        uint32_t a = now_ms - seg->unit_freed_ms[__builtin_ctz(dirty)];
        if (a >= age) continue;
        if (at_next == 0 || a > next) {
          next = a;
          at_next = 1;
        } else if (a == next) {
          at_next++;
        }
      }
    if (at_next == 0) return;
    age = next;
    if (older + at_next >= count) break;
    older += at_next;
  }
  uint32_t due = heap->purge_due_ms;
  heap_purge_units(heap, now_ms, false, now_ms - age, count - older, &due);
  heap->purge_due_ms = due;
}

/* Moves every segment of from into heap (used when a heap absorbs an
 * abandoned one); the caller has already re-owned them. */
void hak_segments_move(hak_heap_t* heap, hak_heap_t* from) {
  hak_segment_t** lists[2] = {&from->segments, &from->full_segments};
  hak_segment_t** to[2] = {&heap->segments, &heap->full_segments};
  memset(from->large_runs, 0, sizeof from->large_runs);
  for (int l = 0; l < 2; l++) {
    while (*lists[l] != NULL) {
      hak_segment_t* seg = *lists[l];
      seg_remove(lists[l], seg);
      atomic_store_explicit(&seg->heap, heap, memory_order_release);
      seg_push(to[l], seg);
      heap_note_room(heap, seg);
      heap->segment_count++;
      from->segment_count--;
    }
  }
}

/* Clears the ending thread's id from its heap's pages. */
void hak_segments_clear_owner(hak_heap_t* heap) {
  hak_segment_t* lists[2] = {heap->segments, heap->full_segments};
  for (int l = 0; l < 2; l++)
    for (hak_segment_t* seg = lists[l]; seg != NULL; seg = seg->next) hak_segment_clear_owner(seg);
}
