/* Remote frees: a block freed by a thread that does not own its segment goes
 * onto the owner heap's atomic list; the owner collects the list on its slow
 * path.  A block that reaches a heap which no longer owns its segment (the
 * segment moved while the free was in flight) is passed on to the new owner. */
#include "internal.h"

void hak_remote_push(hak_heap_t* heap, hak_block_t* b) {
  hak_block_t* head = atomic_load_explicit(&heap->remote, memory_order_relaxed);
  do {
    /* Pushed twice in a row, it would link to itself and its owner would
     * collect it forever. */
    if (unlikely(b == head)) hak_double_free(hak_page_of(hak_segment_of(b), b), b);
    hak_block_set_next(b, head);
  } while (!atomic_compare_exchange_weak_explicit(&heap->remote, &head, b, memory_order_release,
                                                  memory_order_relaxed));
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
  hak_remote_collect_list(heap, atomic_exchange_explicit(&heap->remote, NULL, memory_order_acquire));
  hak_heap_check(heap);
}
