/* Remote frees: a block freed by a thread that does not own its segment goes
 * onto the owner heap's atomic list; the owner collects the list on its slow
 * path.  A block that reaches a heap which no longer owns its segment (the
 * segment moved while the free was in flight) is passed on to the new owner.
 *
 * A thread's remote frees first wait in its heap's outbox, chained, while
 * they go to one owner (a consumer frees its producer's blocks one after
 * another): the chain joins the owner's list with one atomic push when it
 * holds HAK_OUTBOX_MAX blocks, when a block of another owner comes, and on
 * the thread's refills, trims and exit.  Until then its blocks count as in
 * use, as any free in flight: 31 blocks at most a thread, of HAK_SMALL_MAX
 * bytes at most. */
#include <string.h>

#include "internal.h"

static void double_free(hak_block_t* b) { hak_double_free(hak_page_of(hak_segment_of(b), b), b); }

/* Pushes the chain first .. last (linked by hak_block_set_next) onto heap's list. */
void hak_remote_push_chain(hak_heap_t* heap, hak_block_t* first, hak_block_t* last) {
  hak_block_t* head = atomic_load_explicit(&heap->remote, memory_order_relaxed);
  do {
    /* A block pushed again while it heads the list would close a loop its
     * owner would collect forever. */
    if (unlikely(first == head || last == head)) double_free(first == head ? first : last);
    hak_block_set_next(last, head);
  } while (!atomic_compare_exchange_weak_explicit(&heap->remote, &head, first, memory_order_release,
                                                  memory_order_relaxed));
}

void hak_remote_push(hak_heap_t* heap, hak_block_t* b) { hak_remote_push_chain(heap, b, b); }

hak_block_t* hak_remote_tail(hak_block_t* list) {
  for (hak_block_t* next; (next = hak_block_next_remote(list)) != NULL;) list = next;
  return list;
}

void hak_remote_flush(hak_heap_t* self) {
  if (self->outbox_count == 0) return;
  /* The blocks' heap may have been abandoned and absorbed (its segments,
   * all at once, into another heap; itself to the spare pool, which nobody
   * collects) while they waited: they go to the segments' owner now. */
  if (likely(hak_segment_heap(hak_segment_of(self->outbox_first)) == self->outbox_to))
    hak_remote_push_chain(self->outbox_to, self->outbox_first, self->outbox_last);
  else
    hak_remote_collect_list(self, self->outbox_first); /* (NULL-ended: its first link) */
  self->outbox_to = NULL;
  self->outbox_first = self->outbox_last = NULL;
  self->outbox_count = 0;
  /* A thread that frees others' blocks by the thousand, and makes no page
   * events of its own, looks at the dormant heaps too. */
  if (++self->outbox_flushes % HAK_SWEEP_FLUSHES == 0) hak_heaps_sweep(self, hak_now_ms(), false);
}

/* b, a block of owner's page, freed by the thread of self (a thread's heap,
 * not owner; the shared dead heap has no outbox).  Only small blocks wait: a
 * thread that frees a few and then sleeps holds little of their owner's. */
void hak_remote_free(hak_heap_t* self, hak_heap_t* owner, const hak_page_t* page, hak_block_t* b) {
  if (unlikely(self->kind != HAK_HEAP_THREAD || page->block_size > HAK_SMALL_MAX)) {
    hak_remote_push(owner, b);
    return;
  }
  if (self->outbox_to != owner) {
    hak_remote_flush(self);
    self->outbox_to = owner;
    self->outbox_last = b;
    hak_block_set_next(b, NULL);
  } else {
    if (unlikely(b == self->outbox_first)) double_free(b); /* freed twice in a row */
    hak_block_set_next(b, self->outbox_first);
  }
  self->outbox_first = b;
  if (++self->outbox_count == HAK_OUTBOX_MAX) hak_remote_flush(self);
}

void hak_remote_collect_list(hak_heap_t* heap, hak_block_t* list) {
  size_t collected = 0;
  while (list != NULL) {
    hak_block_t* b = list;
    list = hak_block_next_remote(b);
    hak_segment_t* seg = hak_segment_of(b); /* blocks of normal segments only */
    hak_heap_t* owner = hak_segment_heap(seg);
    if (owner == heap) {
      hak_page_t* page = hak_page_of(seg, b);
      HAK_OBSERVE_ADD(heap->stats.remote_in[hak_stat_class(page)]);
      hak_block_collected(page, b);
      hak_heap_free_local(heap, page, b);
      collected++;
    } else
      hak_remote_push(owner, b);
  }
  hak_stat_add(heap->stats.remote_frees, collected);
}

void hak_remote_collect(hak_heap_t* heap) {
  hak_heap_note_slow(heap);
  hak_remote_collect_list(heap, atomic_exchange_explicit(&heap->remote, NULL, memory_order_acquire));
  if (atomic_load_explicit(&heap->reclaimed, memory_order_relaxed) != NULL) hak_remote_take_reclaimed(heap, heap);
  hak_heap_check(heap);
}

/* ---- dormant heaps ----------------------------------------------------------
 *
 * A thread that hands its blocks to others and then stops allocating (a
 * program's main thread once its workers run, a producer that waits) never
 * collects the frees that reach its heap, and its pages would hold their
 * memory for good.  The sweeper (hak_heaps_sweep, from other threads' page
 * events, every purge delay) takes such a heap's remote list when its thread
 * has neither collected nor refilled for HAK_DORMANT_MS, and gives the memory
 * of each full page whose every block is on it back to the system.  It
 * touches only full pages (in_full: in no queue, so the owner's fast paths
 * never reach them) all of whose blocks it holds (so no free can reach them
 * either): their memory is purged and the page goes on the heap's reclaimed
 * list, for the owner to retire when it collects again.  The other blocks go
 * back on the list. */

/* The pages of the list's blocks and their counts: an open-addressed table
 * with room for every page the heap's segments can hold (under the heaps
 * lock: a static one for up to HAK_SWEEP_STATIC_PAGES, else mapped for the
 * sweep). */
typedef struct {
  hak_page_t* page;
  uint32_t count; /* its blocks on the list; UINT32_MAX: all of them */
} sweep_slot_t;
#define HAK_SWEEP_STATIC_PAGES 512
static sweep_slot_t sweep_static[2 * HAK_SWEEP_STATIC_PAGES];

/* page's slot, or the free one where it goes; NULL if the table is full (a
 * page beyond the bound: a segment the heap took meanwhile). */
static sweep_slot_t* sweep_find(sweep_slot_t* slots, size_t mask, hak_page_t* page) {
  size_t h = (size_t)(((uintptr_t)page >> 6) * 0x9E3779B97F4A7C15ull >> 40) & mask;
  for (size_t probes = 0; probes <= mask; probes++, h = (h + 1) & mask)
    if (slots[h].page == page || slots[h].page == NULL) return &slots[h];
  return NULL;
}

/* Puts back on heap's list a chain the sweeper took from it.  Its last block
 * is known if the walk reached it; if not (a walk cut short), the chain takes
 * the list's place, and what others pushed meanwhile (a few blocks, walked
 * to their end) goes back on top: bounded work however busy the list. */
static void sweep_put_back(hak_heap_t* heap, hak_block_t* first, hak_block_t* last) {
  if (last != NULL) {
    hak_remote_push_chain(heap, first, last);
    return;
  }
  hak_block_t* newer = atomic_exchange_explicit(&heap->remote, first, memory_order_acq_rel);
  if (newer != NULL) hak_remote_push_chain(heap, newer, hak_remote_tail(newer));
}

/* Sweeps heap, a live thread's but not the caller's (under the heaps lock),
 * and tells whether that was worth it: whether at least an eighth of the
 * blocks it read were of pages it freed.  Walking the list is most of a
 * sweep's time (its blocks lie scattered), so it reads at most
 * HAK_SWEEP_WALK_MAX blocks from the list's head, the newest frees, where
 * the pages freed whole lately are (all of them for malloc_trim: whole). */
bool hak_remote_sweep(hak_heap_t* heap, bool whole) {
  hak_block_t* list = atomic_exchange_explicit(&heap->remote, NULL, memory_order_acquire);
  heap->sweep_left = NULL;
  if (list == NULL) return false;
  size_t pages = hak_segments_held(heap) * (HAK_UNITS - 1), size = 64;
  while (size < 2 * pages) size *= 2; /* at most half full */
  sweep_slot_t* slots = sweep_static;
  if (pages > HAK_SWEEP_STATIC_PAGES) slots = hak_os_map(size * sizeof(sweep_slot_t));
  if (slots == NULL) { /* no room to count in: the list goes back as it was */
    sweep_put_back(heap, list, NULL);
    return false;
  }
  size_t mask = (slots == sweep_static ? 2 * HAK_SWEEP_STATIC_PAGES : size) - 1;
  /* The blocks walked, in order, so that the second pass reads the array,
   * not the blocks. */
  /* The budget grows with the heap's wait, so that the whole list is read in
   * the end at a bounded cost a second (a burst of frees in no order). */
  size_t budget = whole ? SIZE_MAX : HAK_SWEEP_WALK_MAX * (1 + heap->sweep_gap_ms / 1000);
  size_t cap = pages * HAK_SWEEP_BLOCKS_PER_PAGE, n = 0;
  if (cap > HAK_SWEEP_BLOCKS_MAX) cap = HAK_SWEEP_BLOCKS_MAX;
  if (cap > budget) cap = budget;
  hak_block_t** blocks = hak_os_map(cap * sizeof(hak_block_t*));
  hak_block_t* rest = NULL; /* the first block not walked */
  for (hak_block_t* b = list; b != NULL; b = hak_block_next_remote(b)) {
    if (n == budget) {
      rest = b;
      break;
    }
    if (blocks != NULL && n < cap) blocks[n] = b;
    n++;
    hak_segment_t* seg = hak_segment_of(b);
    if (hak_segment_heap(seg) != heap) continue; /* passed on by the owner */
    hak_page_t* page = hak_page_of(seg, b);
    if (page->cls == HAK_CLASS_LARGE) continue;
    sweep_slot_t* slot = sweep_find(slots, mask, page);
    if (slot == NULL) continue;
    slot->page = page;
    slot->count++;
  }
  hak_count(sweep_walked, n);
  bool in_array = blocks != NULL && n <= cap;
  /* Full since its last block went out (in_full is set only then, and a free
   * of the page clears it): all its blocks are here if as many as it holds. */
  bool any = false;
  for (size_t i = 0; i <= mask; i++) {
    hak_page_t* page = slots[i].page;
    if (page != NULL && slots[i].count == page->reserved && __atomic_load_n(&page->in_full, __ATOMIC_ACQUIRE)) {
      slots[i].count = UINT32_MAX;
      any = true;
    }
  }
  /* The others go back as they were linked, around the blocks dropped. */
  hak_block_t *first = NULL, *last = NULL, *b = list;
  size_t kept = 0;
  bool dropped = false;
  for (size_t i = 0; i < n; i++) {
    hak_block_t* next = in_array ? (i + 1 < n ? blocks[i + 1] : rest) : hak_block_next_remote(b);
    hak_segment_t* seg = hak_segment_of(b);
    sweep_slot_t* slot = any && hak_segment_heap(seg) == heap ? sweep_find(slots, mask, hak_page_of(seg, b)) : NULL;
    if (slot != NULL && slot->count == UINT32_MAX) {
      dropped = true;
    } else {
      if (last == NULL) first = b;
      else if (dropped) hak_block_set_next(last, b);
      last = b;
      kept++;
      dropped = false;
    }
    b = next;
  }
  for (size_t i = 0; i <= mask; i++) {
    hak_page_t* page = slots[i].page;
    if (page != NULL && slots[i].count == UINT32_MAX) {
      hak_segment_t* seg = hak_segment_of(page);
      size_t bytes = (size_t)page->units << HAK_UNIT_SHIFT;
      hak_os_purge((uint8_t*)seg + ((size_t)page->index << HAK_UNIT_SHIFT), bytes);
      hak_committed_sub(bytes);
      hak_count(reclaimed_pages, 1);
      __atomic_store_n(&page->used, 0, __ATOMIC_RELAXED); /* (the statistics read it) */
      hak_page_t* head = atomic_load_explicit(&heap->reclaimed, memory_order_relaxed);
      do page->prev = head; /* (free while in_full: full_magic shares next's place) */
      while (!atomic_compare_exchange_weak_explicit(&heap->reclaimed, &head, page, memory_order_release,
                                                    memory_order_relaxed));
    }
  }
  if (slots == sweep_static) memset(sweep_static, 0, sizeof sweep_static);
  else hak_os_unmap(slots, size * sizeof(sweep_slot_t));
  if (blocks != NULL) hak_os_unmap(blocks, cap * sizeof(hak_block_t*));
  if (last != NULL && dropped) hak_block_set_next(last, rest);
  hak_block_t* back = first != NULL ? first : rest;
  bool worth = (n - kept) * 8 >= n;
  if (back != NULL) {
    sweep_put_back(heap, back, rest == NULL ? last : NULL);
    /* A walk cut short that freed pages is made again (its window now
     * reaches deeper) even if no block comes meanwhile. */
    heap->sweep_left = rest != NULL && worth ? NULL : back;
  }
  return worth;
}

/* Retires into heap the pages swept from from's (heap itself, or an
 * abandoned heap whose segments heap has just taken). */
void hak_remote_take_reclaimed(hak_heap_t* heap, hak_heap_t* from) {
  hak_page_t* page = atomic_exchange_explicit(&from->reclaimed, NULL, memory_order_acquire);
  while (page != NULL) {
    hak_page_t* next = page->prev;
    /* Back in a queue: a block of it was freed again, which only a double
     * free can do. */
    if (!page->in_full) hak_fatal("double free in a page freed whole by other threads", hak_page_start(page));
    page->in_full = 0;
    hak_page_retire_purged(heap, page); /* (the sweep counted its memory out of the committed) */
    page = next;
  }
}
