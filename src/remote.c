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
 * use, as any free in flight.  (Blocks up to HAK_SMALL_MAX: 32 KiB at most.) */
#include "internal.h"

static void double_free(hak_block_t* b) { hak_double_free(hak_page_of(hak_segment_of(b), b), b); }

/* Pushes the chain first .. last (linked by hak_block_set_next) onto heap's list. */
static void push_chain(hak_heap_t* heap, hak_block_t* first, hak_block_t* last) {
  hak_block_t* head = atomic_load_explicit(&heap->remote, memory_order_relaxed);
  do {
    /* A block pushed again while it heads the list would close a loop its
     * owner would collect forever. */
    if (unlikely(first == head || last == head)) double_free(first == head ? first : last);
    hak_block_set_next(last, head);
  } while (!atomic_compare_exchange_weak_explicit(&heap->remote, &head, first, memory_order_release,
                                                  memory_order_relaxed));
}

void hak_remote_push(hak_heap_t* heap, hak_block_t* b) { push_chain(heap, b, b); }

void hak_remote_flush(hak_heap_t* self) {
  if (self->outbox_count == 0) return;
  push_chain(self->outbox_to, self->outbox_first, self->outbox_last);
  self->outbox_to = NULL;
  self->outbox_first = self->outbox_last = NULL;
  self->outbox_count = 0;
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
  hak_remote_collect_list(heap, atomic_exchange_explicit(&heap->remote, NULL, memory_order_acquire));
  hak_heap_check(heap);
}
