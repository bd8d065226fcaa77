/* Invariant checks of a heap, run by the debug build after each slow-path
 * step (hak_heap_check); the other builds compile the calls away.  A broken
 * invariant is reported like a failed assertion, then the program aborts. */
#include "internal.h"

#if HAK_DEBUG

#define CHECK(cond, what)                           \
  do {                                              \
    if (!(cond)) hak_assert_fail(what, __FILE__, __LINE__); \
  } while (0)

/* A page in a queue of heap: a formatted head descriptor of one of its
 * segments, its counts in order, its free list as long as its free count
 * (for pages of at most 4096 blocks: the walk is the expensive part). */
static void check_page(hak_heap_t* heap, const hak_page_t* page) {
  hak_segment_t* seg = hak_segment_of(page);
  CHECK(hak_segment_heap(seg) == heap, "page in a queue of a heap that does not own its segment");
  CHECK(page->units > 0 && page->head_off == 0, "queued descriptor is not a page head");
  CHECK(&seg->pages[page->index] == page, "page index");
  uintptr_t tid = atomic_load_explicit(&page->owner_tid, memory_order_relaxed);
  CHECK(tid == 0 || tid == heap->tid, "a page carries another thread's id");
  CHECK((tid != 0) == (seg->stamped_units >> page->index & 1), "stamped_units");
  /* Its other units' descriptors lead back to it (hak_page_of) and hold nothing else. */
  for (unsigned j = 1; j < page->units; j++) {
    const hak_page_t* tail = &seg->pages[page->index + j];
    CHECK(tail->head_off == j * sizeof(hak_page_t), "a unit of a page does not lead back to it");
    CHECK(tail->units == 0 && tail->div_magic == 0 && atomic_load_explicit(&tail->owner_tid, memory_order_relaxed) == 0,
          "a page's tail descriptor is not blank");
  }
  CHECK((seg->free_units & hak_unit_mask(page->index, page->units)) == 0, "page on free units");
  CHECK(hak_page_used(page) <= page->capacity && page->capacity <= page->reserved, "page counts");
  if (page->cls != HAK_CLASS_LARGE) {
    CHECK(!page->in_full, "full page in a queue");
    CHECK(page->div_magic == hak_div_magic(page->block_size), "div_magic");
    if (page->capacity <= 4096) {
      uint32_t n = 0;
      for (const hak_block_t* b = page->free; b != hak_list_end(page) && n <= page->capacity; b = hak_block_next(b)) {
        hak_free_entry_check(page, b);
        CHECK((const uint8_t*)b >= hak_page_start(page) &&
                  (const uint8_t*)b < hak_page_start(page) + (size_t)page->capacity * page->block_size,
              "free block outside its page");
        n++;
      }
      CHECK(n == page->capacity - hak_page_used(page), "free list length");
    }
  }
}

static void check_segments(hak_heap_t* heap, hak_segment_t* list, bool full, size_t* dirty, size_t* count) {
  for (hak_segment_t* seg = list; seg != NULL; seg = seg->next) {
    ++*count;
    CHECK(hak_segment_heap(seg) == heap && seg->kind == HAK_SEG_NORMAL, "segment list");
    CHECK(seg->next == NULL || seg->next->prev == seg, "segment links");
    CHECK(full ? seg->free_units == 0 : seg->free_units != 0, "segment on the wrong list");
    CHECK((seg->dirty_units & ~seg->free_units) == 0, "dirty unit not free");
    CHECK((seg->zero_units & ~seg->free_units) == 0, "zero unit not free");
    CHECK((seg->zero_units & seg->dirty_units) == 0, "zero unit dirty");
    CHECK(seg->free_count == (unsigned)hak_popcount(seg->free_units), "segment's free unit count");
    CHECK(seg->free_count <= heap->segments_room, "segments' room");
    *dirty += (size_t)hak_popcount(seg->dirty_units);
  }
}

void hak_heap_check(hak_heap_t* heap) {
  if (heap->kind != HAK_HEAP_THREAD && heap->kind != HAK_HEAP_GLOBAL) return;
  for (unsigned c = 0; c < HAK_CLASSES; c++) {
    const hak_page_queue_t* q = &heap->queue[c];
    CHECK(heap->current[c] == (q->first ? q->first : &hak_page_empty),
          "current page is not the first of its queue");
    const hak_page_t* prev = NULL;
    for (const hak_page_t* page = q->first; page != NULL; prev = page, page = page->next) {
      CHECK(page->prev == prev && page->cls == c, "class queue");
      CHECK((page->used >= HAK_USED_PINNED) == (page == q->first), "pinned page is not the current one");
      check_page(heap, page);
    }
    CHECK(q->last == prev, "class queue's last");
    if (c < HAK_DIRECT_CLASSES)
      for (unsigned k = 0; k < hak_class_direct_slots[c]; k++)
        CHECK(heap->direct[hak_class_direct_first[c] + k] == heap->current[c], "direct table");
    const hak_page_t* spare = heap->spare[c];
    if (spare != NULL) {
      CHECK(spare->cls == c && spare->used == 0 && spare->reserved <= HAK_SPARE_BLOCKS_MAX, "spare page");
      CHECK(spare->next == NULL && spare->prev == NULL && spare != q->first, "spare page in a queue");
      check_page(heap, spare);
    }
  }
  size_t units = 0, large_units = 0;
  const hak_page_t* prev = NULL;
  for (const hak_page_t* page = heap->empty.first; page != NULL; prev = page, page = page->next) {
    CHECK(page->prev == prev && page->used == 0, "empty pages");
    units += page->units;
    if (page->cls == HAK_CLASS_LARGE) large_units += page->units;
  }
  CHECK(heap->empty.last == prev && units == heap->empty_units, "empty pages' units");
  CHECK(large_units == heap->empty_large_units && large_units <= HAK_EMPTY_LARGE_UNITS_KEEP,
        "empty large pages' units");
  size_t dirty = 0, count = 0;
  check_segments(heap, heap->segments, false, &dirty, &count);
  check_segments(heap, heap->full_segments, true, &dirty, &count);
  CHECK(dirty == heap->dirty_units, "dirty unit count");
  CHECK(count == heap->segment_count, "segment count");
  for (unsigned i = 0; i < HAK_LARGE_RUNS; i++)
    CHECK(heap->large_runs[i] == 0 || hak_segment_heap(hak_segment_of((void*)heap->large_runs[i])) == heap,
          "a large run of a segment the heap does not hold");
}

#endif
