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
 * bytes at most.
 *
 * A heap's list is thus a stack of chains, one a push, and the first block
 * of each names in its second word (every block has two) the first of the
 * chain pushed before it, the one below.  Walked link by link, the list is a
 * run of dependent loads, each waiting for a line the freeing CPU wrote last;
 * the owner (and the sweeper) reads the chains' first blocks, then walks
 * HAK_COLLECT_WAYS chains side by side, as many lines crossing at once
 * (xthread 1.9x faster on a near pair of CPUs, about 2.5x on a far one).
 * The secure build keeps a block's last word for its canary, in the 16-byte
 * class its second: its lists are walked one block after another. */
#include <string.h>

#include "internal.h"

static void double_free(hak_block_t* b) { hak_double_free(hak_page_of(hak_segment_of(b), b), b); }

#if !HAK_SECURE
/* The chain below the one first begins (its first block), NULL at the bottom. */
static inline hak_block_t* chain_below(hak_block_t* first) {
  HAK_VG_LINK_OPEN(&first[1]);
  hak_block_t* below = (hak_block_t*)first[1].link;
  HAK_VG_LINK_CLOSE(&first[1]);
  return below;
}
#endif

static inline void chain_set_below(hak_block_t* first, hak_block_t* below) {
#if HAK_SECURE
  (void)first, (void)below;
#else
  HAK_VG_LINK_OPEN(&first[1]);
  first[1].link = (uintptr_t)below;
  HAK_VG_LINK_CLOSE(&first[1]);
#endif
}

/* Pushes the chain first .. last (linked by hak_block_set_next) onto heap's list. */
void hak_remote_push_chain(hak_heap_t* heap, hak_block_t* first, hak_block_t* last) {
  hak_block_t* head = atomic_load_explicit(&heap->remote, memory_order_relaxed);
  do {
    /* A block pushed again while it heads the list would close a loop its
     * owner would collect forever. */
    if (unlikely(first == head || last == head)) double_free(first == head ? first : last);
    hak_block_set_next(last, head);
    chain_set_below(first, head);
  } while (!atomic_compare_exchange_weak_explicit(&heap->remote, &head, first, memory_order_release,
                                                  memory_order_relaxed));
}

void hak_remote_push(hak_heap_t* heap, hak_block_t* b) { hak_remote_push_chain(heap, b, b); }

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
   * events of its own, looks at the dormant heaps too, its own among them:
   * it is dormant itself if it never allocates (given its list back here,
   * it would not collect it, and the next look would read it all again). */
  if (++self->outbox_flushes % HAK_SWEEP_FLUSHES == 0) hak_heaps_sweep(NULL, hak_now_ms(), false);
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

/* Frees b into heap if it owns b's segment, else passes b on; returns 1 if
 * freed. */
static inline size_t collect_block(hak_heap_t* heap, hak_block_t* b) {
  hak_segment_t* seg = hak_segment_of(b); /* blocks of normal segments only */
  hak_heap_t* owner = hak_segment_heap(seg);
  if (owner != heap) {
    hak_remote_push(owner, b);
    return 0;
  }
  hak_page_t* page = hak_page_of(seg, b);
  HAK_OBSERVE_ADD(heap->stats.remote_in[hak_stat_class(page)]);
  hak_block_collected(page, b);
  hak_heap_free_local(heap, page, b);
  return 1;
}

/* Collects a list of blocks linked one to the next (NULL-ended). */
void hak_remote_collect_list(hak_heap_t* heap, hak_block_t* list) {
  size_t collected = 0;
  while (list != NULL) {
    hak_block_t* b = list;
    list = hak_block_next_remote(b);
    collected += collect_block(heap, b);
  }
  hak_stat_add(heap->stats.remote_frees, collected);
}

#if !HAK_SECURE
/* Visits the blocks of *stack, a stack of chains, at most budget of them if
 * bounded: HAK_COLLECT_WAYS chains side by side, a block of each in turn,
 * each chain ending where the chain below begins.  A bounded walk (the
 * sweeper's) may stop within chains, and what it leaves in *stack must be a
 * stack again, so there the chains' first blocks are visited last, once all
 * the chains of the round are; where the walk stops, each first block not
 * visited is linked to where its chain stands.  Returns the sum of what
 * visit(heap, arg, block) returned.  (Inlined into the owner's collection
 * and the sweeper's look, each with its own visit.) */
HAK_INLINE size_t stack_walk(hak_heap_t* heap, hak_block_t** stack_at, bool bounded, size_t budget,
                             size_t (*visit)(hak_heap_t*, void*, hak_block_t*), void* arg) {
  hak_block_t *head[HAK_COLLECT_WAYS], *at[HAK_COLLECT_WAYS], *end[HAK_COLLECT_WAYS];
  hak_block_t* stack = *stack_at;
  size_t n = 0, sum = 0;
  while (stack != NULL && !(bounded && n >= budget)) {
    size_t ways = 0, walking = 0;
    for (; ways < HAK_COLLECT_WAYS && stack != NULL; ways++) {
      head[ways] = stack;
      at[ways] = bounded ? hak_block_next_remote(stack) : stack;
      end[ways] = stack = chain_below(stack);
      walking += bounded ? at[ways] != end[ways] : 1;
    }
    while (walking != 0 && !(bounded && n >= budget))
      for (size_t i = 0; i < ways && !(bounded && n >= budget); i++) {
        hak_block_t* b = at[i];
        if (b == end[i]) continue;
        at[i] = hak_block_next_remote(b);
        if (bounded) __builtin_prefetch(at[i]); /* (the sweeper's visits are long: read a round later) */
        walking -= at[i] == end[i];
        n++;
        sum += visit(heap, arg, b);
      }
    if (!bounded) continue;
    size_t done = 0;
    for (; done < ways && n < budget; done++, n++) sum += visit(heap, arg, head[done]);
    if (done < ways) {
      for (size_t i = done; i < ways; i++) hak_block_set_next(head[i], at[i]);
      stack = head[done];
      break;
    }
  }
  *stack_at = stack;
  return sum;
}

static size_t collect_visit(hak_heap_t* heap, void* arg, hak_block_t* b) {
  (void)arg;
  return collect_block(heap, b);
}
#endif

/* Collects a stack of chains taken from a heap's list. */
void hak_remote_collect_stack(hak_heap_t* heap, hak_block_t* stack) {
#if HAK_SECURE
  hak_remote_collect_list(heap, stack);
#else
  hak_stat_add(heap->stats.remote_frees, stack_walk(heap, &stack, false, 0, collect_visit, NULL));
#endif
}

/* Collects into heap from's list and what the sweeper gave back of it. */
void hak_remote_collect_from(hak_heap_t* heap, hak_heap_t* from) {
  hak_remote_collect_stack(heap, atomic_exchange_explicit(&from->remote, NULL, memory_order_acquire));
  if (atomic_load_explicit(&from->remote_back, memory_order_relaxed) != NULL)
    hak_remote_collect_list(heap, atomic_exchange_explicit(&from->remote_back, NULL, memory_order_acquire));
}

void hak_remote_collect(hak_heap_t* heap) {
  hak_heap_note_slow(heap);
  hak_remote_collect_from(heap, heap);
  if (atomic_load_explicit(&heap->reclaimed, memory_order_relaxed) != NULL) hak_remote_take_reclaimed(heap, heap);
  hak_heap_check(heap);
}

/* ---- dormant heaps ----------------------------------------------------------
 *
 * A thread that hands its blocks to others and then stops allocating (a
 * program's main thread once its workers run, a producer that waits) never
 * collects the frees that reach its heap, and its pages would hold their
 * memory for good.  The sweeper (hak_heaps_sweep, from other threads' page
 * events and refills) takes over such a heap's remote list once its thread
 * has neither collected nor refilled for HAK_DORMANT_MS, and gives the memory
 * of each full page all of whose blocks it has taken back to the system.  It
 * touches only full pages (in_full: in no queue, so the owner's fast paths
 * never reach them) all of whose blocks it holds (so no free can reach them
 * either): their memory is purged and the page goes on the heap's reclaimed
 * list, for the owner to retire when it collects again.
 *
 * The sweeper keeps what it takes for as long as the heap stays dormant, each
 * block chained to the others of its page in a table, and reads each block
 * once: at every look the blocks come since, HAK_SWEEP_WALK_MAX at most
 * (the list's blocks lie scattered: ~100 ns each, the chains read side by
 * side; ~300 ns one after another).  A page is freed as soon as its last
 * block is read.  The rest goes back when the heap's thread
 * refills from its queues, makes another slow call (seen at the next look)
 * or ends: meanwhile those blocks count as in use, as frees in flight do. */

typedef struct {
  hak_page_t* page;
  uint32_t count;     /* its blocks held; UINT32_MAX: the page was freed */
  hak_block_t* first; /* ... chained */
  hak_block_t* last;
} sweep_slot_t;

struct hak_sweep_s {
  size_t bytes;                          /* mapped, the table with it */
  size_t held;                           /* blocks held */
  hak_block_t* unread;                   /* taken from the list, not read yet */
  bool unread_stacked;                   /* ... a stack of chains (from heap->remote) */
  hak_block_t *other_first, *other_last; /* blocks held of no page of the table's */
  size_t mask;
  sweep_slot_t slots[]; /* open-addressed, with room for every page the
                           heap's segments held when it began */
};

/* page's slot, or the free one where it goes; NULL if the table is full (a
 * page beyond the bound: a segment the heap took meanwhile). */
static sweep_slot_t* sweep_find(hak_sweep_t* sw, hak_page_t* page) {
  size_t h = (size_t)(((uintptr_t)page >> 6) * 0x9E3779B97F4A7C15ull >> 40) & sw->mask;
  for (size_t probes = 0; probes <= sw->mask; probes++, h = (h + 1) & sw->mask)
    if (sw->slots[h].page == page || sw->slots[h].page == NULL) return &sw->slots[h];
  return NULL;
}

/* Adds b to the chain first .. last (at its front). */
static void sweep_chain(hak_block_t** first, hak_block_t** last, hak_block_t* b) {
  hak_block_set_next(b, *first);
  if (*first == NULL) *last = b;
  *first = b;
}

/* Full since its last block went out (in_full is set only then, and a free
 * of the page clears it), and all its blocks held: no one else can reach it. */
static void sweep_free_page(hak_heap_t* heap, sweep_slot_t* slot) {
  hak_page_t* page = slot->page;
  hak_segment_t* seg = hak_segment_of(page);
  size_t bytes = (size_t)page->units << HAK_UNIT_SHIFT;
  hak_os_purge((uint8_t*)seg + ((size_t)page->index << HAK_UNIT_SHIFT), bytes);
  hak_committed_sub(bytes);
  hak_count(reclaimed_pages, 1);
  heap->sweep->held -= slot->count;
  slot->count = UINT32_MAX;
  slot->first = slot->last = NULL;
  __atomic_store_n(&page->used, 0, __ATOMIC_RELAXED); /* (the statistics read it) */
  hak_page_t* head = atomic_load_explicit(&heap->reclaimed, memory_order_relaxed);
  do page->prev = head; /* (free while in_full: full_magic shares next's place) */
  while (!atomic_compare_exchange_weak_explicit(&heap->reclaimed, &head, page, memory_order_release,
                                                memory_order_relaxed));
}

/* Holds b, a block of heap's list, and frees its page if b was its last;
 * returns 1, the blocks read. */
static size_t sweep_read(hak_heap_t* heap, void* arg, hak_block_t* b) {
  hak_sweep_t* sw = arg;
  sw->held++;
  hak_segment_t* seg = hak_segment_of(b);
  hak_page_t* page = hak_page_of(seg, b);
  sweep_slot_t* slot = NULL;
  if (hak_segment_heap(seg) == heap && page->cls != HAK_CLASS_LARGE) /* (else passed on by the owner) */
    slot = sweep_find(sw, page);
  /* (A freed page's block: the page was retired and used again while
   * its thread was awake, before this look saw it.) */
  if (slot == NULL || slot->count == UINT32_MAX) {
    sweep_chain(&sw->other_first, &sw->other_last, b);
    return 1;
  }
  slot->page = page;
  sweep_chain(&slot->first, &slot->last, b);
  if (++slot->count == page->reserved && __atomic_load_n(&page->in_full, __ATOMIC_ACQUIRE))
    sweep_free_page(heap, slot);
  return 1;
}

/* Takes over heap's list (a live thread's, dormant; the caller's only if it
 * makes no slow calls; under the heaps lock), or goes on with it: reads at
 * most budget blocks of what was taken and came since.  Returns the blocks
 * read. */
size_t hak_remote_sweep(hak_heap_t* heap, size_t budget) {
  hak_sweep_t* sw = heap->sweep;
  if (sw == NULL) {
    if (atomic_load_explicit(&heap->remote, memory_order_relaxed) == NULL &&
        atomic_load_explicit(&heap->remote_back, memory_order_relaxed) == NULL)
      return 0;
    size_t pages = hak_segments_held(heap) * (HAK_UNITS - 1), size = 64;
    while (size < 2 * pages) size *= 2; /* at most half full */
    size_t bytes = sizeof(hak_sweep_t) + size * sizeof(sweep_slot_t);
    if ((sw = hak_os_map(bytes)) == NULL) return 0; /* (zeroed) */
    sw->bytes = bytes;
    sw->mask = size - 1;
    /* (Only hak_remote_sweep_end sets remote_back, once: for as long as sw
     * lives it stays empty.) */
    sw->unread = atomic_exchange_explicit(&heap->remote_back, NULL, memory_order_acquire);
    sw->unread_stacked = false; /* (a plain list) */
    __atomic_store_n(&heap->sweep, sw, __ATOMIC_RELAXED);
  }
  size_t n = 0;
  while (n < budget) {
    if (sw->unread == NULL) {
      sw->unread = atomic_exchange_explicit(&heap->remote, NULL, memory_order_acquire);
      if (sw->unread == NULL) break;
      sw->unread_stacked = true;
    }
#if !HAK_SECURE
    if (sw->unread_stacked) {
      n += stack_walk(heap, &sw->unread, true, budget - n, sweep_read, sw);
      continue;
    }
#endif
    hak_block_t* b = sw->unread;
    sw->unread = hak_block_next_remote(b);
    n += sweep_read(heap, sw, b);
  }
  hak_count(sweep_walked, n);
  return n;
}

/* Gives heap's thread back what the sweeper holds of its list (it is awake
 * again, or ends), if anything: it goes back on the list. */
void hak_remote_sweep_end(hak_heap_t* heap) {
  hak_sweep_t* sw = heap->sweep;
  if (sw == NULL) return;
  hak_block_t *first = sw->other_first, *last = sw->other_last;
  for (size_t i = 0; i <= sw->mask; i++) {
    sweep_slot_t* slot = &sw->slots[i];
    if (slot->first == NULL) continue;
    hak_block_set_next(slot->last, first);
    if (first == NULL) last = slot->last;
    first = slot->first;
  }
  hak_block_t* unread = sw->unread;
  __atomic_store_n(&heap->sweep, NULL, __ATOMIC_RELAXED);
  heap->sweep_armed = false;
  hak_os_unmap(sw, sw->bytes);
  if (unread == NULL) {
    if (first != NULL) hak_remote_push_chain(heap, first, last);
    return;
  }
  /* The unread part's end unknown, and that of what others pushed since it
   * was taken too: the chains, then it, wait apart from the list (walking
   * either to join them took 300 ms under the heaps lock for a million
   * blocks), and one block pushed onto the list after them tells the owner. */
  if (first != NULL) hak_block_set_next(last, unread);
  else first = unread;
  hak_block_t* old = atomic_exchange_explicit(&heap->remote_back, hak_block_next_remote(first), memory_order_release);
  hak_assert(old == NULL); /* (only here is it set, and a takeover empties it) */
  (void)old;
  hak_remote_push(heap, first);
}

/* The blocks the sweeper holds of heap's list, read or not (under the heaps
 * lock; for the tests: it walks those not read). */
size_t hak_remote_swept_held(hak_heap_t* heap) {
  hak_sweep_t* sw = heap->sweep;
  if (sw == NULL) return 0;
  size_t n = sw->held;
  for (hak_block_t* b = sw->unread; b != NULL; b = hak_block_next_remote(b)) n++;
  return n;
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
