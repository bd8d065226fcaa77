/* Heaps: one per thread.  The slow path of malloc (refill from the class
 * queue, or a new page), the slow path of a local free, and the life of a heap:
 * made or adopted when a thread first allocates, abandoned with its live pages
 * when the thread exits, adopted whole by a new thread or absorbed by a live
 * one.  Heap structures are never freed, so another thread may always push a
 * remote free onto a heap it saw as a segment's owner. */
#include <errno.h>
#include <sched.h>
#include <pthread.h>
#include <string.h>

#include "internal.h"

hak_page_t hak_page_empty = {.free = hak_list_end(&hak_page_empty)};

hak_heap_t hak_heap_empty = {.direct = {[0 ... HAK_DIRECT_SLOTS - 1] = &hak_page_empty},
                             .current = {[0 ... HAK_CLASSES - 1] = &hak_page_empty},
                             .kind = HAK_HEAP_EMPTY};
/* The dead and global heaps are made from the empty one when first needed
 * (heap_sentinel_init), not initialized data: that would be two more pages
 * of the library written at load in every process. */
HAK_BSS_LAST hak_heap_t hak_heap_dead;
/* Serves threads that allocate after their heap was abandoned (late thread
 * destructors), under global_heap_lock. */
HAK_BSS_LAST hak_heap_t hak_heap_global;
static pthread_mutex_t global_heap_lock = PTHREAD_MUTEX_INITIALIZER;

__thread hak_heap_t* hak_tls_heap = &hak_heap_empty;

static pthread_mutex_t heaps_lock = PTHREAD_MUTEX_INITIALIZER;
static hak_heap_t* abandoned_pool; /* heaps of exited threads still holding segments */
static hak_heap_t* spare_pool;     /* heaps holding nothing */
static hak_heap_t* all_heaps;      /* every heap made, for statistics (never freed) */
static uint8_t* heap_chunk_next;   /* heap structures are carved from OS chunks */
static uint8_t* heap_chunk_end;

/* Lock order: global_heap_lock, then heaps_lock, then the segment lock. */
void hak_heaps_lock(void) {
  pthread_mutex_lock(&global_heap_lock);
  pthread_mutex_lock(&heaps_lock);
}
void hak_heaps_unlock(void) {
  pthread_mutex_unlock(&heaps_lock);
  pthread_mutex_unlock(&global_heap_lock);
}

/* ---- current pages -------------------------------------------------------- */

/* The direct slots of a small class (sizes up to HAK_DIRECT_MAX, by 16
 * bytes): 1, 2, 4 or 8 of them from a table, unrolled (the loop over the
 * class sizes took 46 instructions for the 8 of a 128-byte-wide class, on
 * every refill of random 16-1024 B blocks). */
HAK_NOINLINE void hak_heap_set_direct(hak_heap_t* heap, unsigned cls, hak_page_t* page) {
  hak_page_t** d = heap->direct + hak_class_direct_first[cls];
  switch (hak_class_direct_slots[cls]) {
    case 8:
      d[7] = d[6] = d[5] = d[4] = page;
      __attribute__((fallthrough));
    case 4:
      d[3] = d[2] = page;
      __attribute__((fallthrough));
    case 2:
      d[1] = page;
      __attribute__((fallthrough));
    default:
      d[0] = page;
  }
}

/* A sentinel heap of the given kind: the empty heap's page pointers. */
static void heap_sentinel_init(hak_heap_t* heap, int kind) {
  memcpy(heap->direct, hak_heap_empty.direct, sizeof heap->direct);
  memcpy(heap->current, hak_heap_empty.current, sizeof heap->current);
  __atomic_store_n(&heap->kind, kind, __ATOMIC_RELEASE);
}

static void heap_reset_current(hak_heap_t* heap) {
  for (unsigned c = 0; c < HAK_CLASSES; c++) {
    hak_page_t* first = heap->queue[c].first ? heap->queue[c].first : &hak_page_empty;
    if (heap->current[c] != first)
      hak_heap_use_page(heap, c, first);
    else if (first != &hak_page_empty) /* kept by a dispatcher's thread: used at once */
      hak_page_claim(heap, first);
  }
}

/* ---- allocation slow path ------------------------------------------------- */

/* Yields of a starting thread whose first free is of a live thread's block. */
#define HAK_HEIR_YIELDS 2

/* A heap's kind, read by another thread (a starting thread, an heir). */
static inline int hak_heap_kind(hak_heap_t* heap) { return __atomic_load_n(&heap->kind, __ATOMIC_RELAXED); }

static hak_heap_t* thread_heap_init(hak_heap_t* want, bool dispatcher);
static bool heap_absorb_heir(hak_heap_t* heap);
static void heap_absorb(hak_heap_t* heap, hak_heap_t* from);

/* The first free block of page, the class's current page. */
HAK_INLINE void* heap_pop(hak_heap_t* heap, hak_page_t* page) {
  hak_block_t* b = page->free;
  hak_free_entry_check(page, b);
  page->free = hak_block_next(b);
  page->used++;
  hak_block_out(page, b); /* (its canary stands, as on the fast path) */
  hak_heap_check(heap);
  (void)heap;
  return b;
}

/* The thread is awake (or ends): what the sweeper held of its list comes
 * back now, to be collected (a look would give it back too, but none comes
 * where memory is never purged but by malloc_trim). */
static HAK_NOINLINE HAK_COLD void heap_sweep_back(hak_heap_t* heap) {
  pthread_mutex_lock(&heaps_lock);
  hak_remote_sweep_end(heap);
  pthread_mutex_unlock(&heaps_lock);
}

static void* heap_alloc_class(hak_heap_t* heap, unsigned cls) {
  hak_heap_note_slow(heap);
  if (unlikely(__atomic_load_n(&heap->sweep, __ATOMIC_RELAXED) != NULL)) heap_sweep_back(heap);
  /* (The flush first: a look it makes may give this heap's list back.) */
  if (heap->outbox_count != 0) hak_remote_flush(heap);
  if (hak_remote_pending(heap)) hak_remote_collect(heap);
  hak_page_queue_t* q = &heap->queue[cls];
  hak_page_t* page = q->first;
  if (page != NULL && page->free == hak_list_end(page) && page->capacity == page->reserved && page->next != NULL) {
    /* The current page ran out and others follow: it goes to the back as it
     * is, so that its frees stay on the fast path until the queue comes round
     * to it again; only a page found without a free block then leaves it. */
    hak_queue_rotate(q);
    page = q->first;
  }
  /* A page that can carve more goes to the back while another page of the
   * queue has a free block: carved only when the class has no free block,
   * a class of several pages holds at most part of an OS page more than
   * its peak in use, not up to a whole page (random 16-1024 B blocks on
   * 8192 slots: about 200 KiB less; docs/BENCHMARKS.md).  The page looked
   * at is always the first of the queue. */
  hak_page_t* carve = NULL;
  while (page != NULL && page->free == hak_list_end(page)) {
    if (page->capacity < page->reserved) {
      if (page == carve || page->next == NULL) {
        hak_page_extend(page);
        break;
      }
      if (carve == NULL) carve = page;
      hak_queue_rotate(q);
    } else {
      /* Full: out of every list until a free finds it (through the slow path).
       * Unpinned first: once marked, its fields are the sweeper's to write
       * (remote.c) while all its blocks are out. */
      if (heap->current[cls] == page) hak_heap_use_page(heap, cls, &hak_page_empty);
      hak_queue_remove(q, page);
      page->full_magic = page->div_magic;
      __atomic_store_n(&page->div_magic, 0, __ATOMIC_RELAXED);
      __atomic_store_n(&page->in_full, 1, __ATOMIC_RELEASE); /* read by the sweeper */
    }
    page = q->first;
  }
  if (page == NULL) {
    /* An heir whose old heap was abandoned meanwhile takes it (its pages
     * join the queues behind the one made now). */
    if (unlikely(heap->heir_of != NULL)) heap_absorb_heir(heap);
    hak_heap_set_current(heap, cls); /* its pages are all out of the queue now */
    page = heap->spare[cls];
    if (page != NULL) {
      heap->spare[cls] = NULL; /* ready as it is */
    } else if ((page = hak_page_new(heap, cls, 0, NULL)) == NULL) {
      errno = ENOMEM;
      return NULL;
    }
    hak_queue_push_front(q, page);
    hak_stat_add(heap->stats.refills[cls], 1);
    HAK_OBSERVE_ADD(heap->stats.alloc_refill[cls]);
  } else {
    HAK_OBSERVE_ADD(heap->stats.alloc_partial[cls]);
  }
  if (heap->current[cls] != page) hak_heap_use_page(heap, cls, page); /* page is first */
  return heap_pop(heap, page);
}

/* One large block of size bytes; as a realloc home (see hak_realloc), one
 * placed where it can grow in place, within its unit and then over the free
 * units after it. */
static void* heap_alloc_large(hak_heap_t* heap, size_t size, bool home) {
  if (hak_remote_pending(heap)) hak_remote_collect(heap);
  bool zero = false;
  hak_page_t* page = home ? hak_page_new_home(heap, size) : hak_page_new(heap, HAK_CLASS_LARGE, size, &zero);
  if (page == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  hak_stat_add(heap->stats.refills[HAK_CLASSES], 1);
  HAK_OBSERVE_ADD(heap->stats.alloc_refill[HAK_CLASSES]);
  hak_block_t* b = page->free;
  page->free = hak_list_end(page);
  page->used = 1;
  if (home && page->units == 1) {
    page->home = 1;
    heap->homes++;
  }
  hak_block_out_slow(page, b);
  heap->zeroed_last = zero ? ~(uintptr_t)b : 0; /* (its link, the one word written, is 0 again) */
  hak_heap_check(heap);
  return b;
}

void* hak_heap_alloc_home(hak_heap_t* heap, size_t size) { return heap_alloc_large(heap, size, true); }

void* hak_heap_alloc(hak_heap_t* heap, size_t size) {
  if (size <= HAK_CLASS_MAX_SIZE) return heap_alloc_class(heap, hak_class_of(size));
  if (size <= HAK_LARGE_MAX) return heap_alloc_large(heap, size, false);
  return hak_huge_alloc(size, 0, false);
}

static void* alloc_slow(hak_heap_t* heap, size_t size) {
  if (size > HAK_LARGE_MAX) return hak_huge_alloc(size, 0, false); /* needs no heap */
  if (unlikely(heap->kind < HAK_HEAP_THREAD)) {
    if (heap->kind == HAK_HEAP_DEAD || (heap = hak_thread_heap_init()) == NULL)
      return hak_alloc_on_dead_thread(size);
  }
  return hak_heap_alloc(heap, size);
}

HAK_NOINLINE void* hak_alloc_slow(hak_heap_t* heap, size_t size) {
  void* p;
  if (HAK_SECURE && size <= HAK_SIZE_LIMIT) size += HAK_CANARY_SIZE; /* (else ENOMEM below) */
  if (HAK_PROF && heap->kind >= HAK_HEAP_THREAD && unlikely(hak_prof_due(heap, size)))
    p = hak_prof_alloc(heap, size);
  else
    p = alloc_slow(heap, size);
  HAK_VG_ALLOC(p, 0);
  return p;
}

static HAK_NOINLINE HAK_COLD void heap_check_purge(hak_heap_t* heap) { hak_heap_purge_if_due(heap, hak_now_ms()); }

/* The fast path found its class's current page without a free block: the
 * page names the class, so the refill starts from the class's queue (the
 * sentinel page means the thread has no heap yet; the profiling build's
 * countdown also ends here, with a free block left). */
void* hak_alloc_refill(hak_heap_t* heap, hak_page_t* page, size_t size) {
  if (HAK_PROF || page == &hak_page_empty) return hak_alloc_slow(heap, size);
  /* The purge delay is checked on page events; a thread in a steady state
   * (its pages neither made nor emptied) checks it every 64 refills (every
   * refill while much waits: purge_watch), and so gives back what waited and
   * looks at the dormant heaps. */
  if (unlikely(heap->purge_watch) || unlikely((heap->refills += 4) == 0)) heap_check_purge(heap);
  unsigned cls = page->cls;
  hak_page_t* next = page->next;
  void* p;
  /* Most refills of the mid-size classes (pages of 8-16 blocks run out every
   * few mallocs) find the page run out, the next one in the queue with a free
   * block, and no remote frees: that next page becomes current at once, the
   * old one going to the back (heap_alloc_class's first step; one not fully
   * carved carves only when no page has a free block). */
  if (likely(next != NULL && next->free != hak_list_end(next) && !hak_remote_pending(heap))) {
    /* (What the fast path's table said; the sentinel is in no queue.) */
    if (heap->current[cls] != page || heap->queue[cls].first != page || next == &hak_page_empty)
      __builtin_unreachable();
    hak_queue_rotate(&heap->queue[cls]);
    hak_heap_use_page(heap, cls, next);
    HAK_OBSERVE_ADD(heap->stats.alloc_partial[cls]);
    p = heap_pop(heap, next);
  } else {
    p = heap_alloc_class(heap, cls);
  }
  HAK_VG_ALLOC(p, 0);
  return p;
}

void* hak_alloc_on_dead_thread(size_t size) {
  pthread_mutex_lock(&global_heap_lock);
  if (hak_heap_global.kind != HAK_HEAP_GLOBAL) heap_sentinel_init(&hak_heap_global, HAK_HEAP_GLOBAL);
  void* p = hak_heap_alloc(&hak_heap_global, size);
  pthread_mutex_unlock(&global_heap_lock);
  return p;
}

/* ---- free slow path --------------------------------------------------------- */

/* A block of another thread's heap goes on that heap's remote list. */
static inline void free_remote(hak_heap_t* owner, hak_page_t* page, hak_block_t* b) {
  hak_block_in(page, b);
  hak_heap_t* self = hak_tls_heap;
#if HAK_OBSERVE
  if (self->kind == HAK_HEAP_THREAD) HAK_OBSERVE_ADD(self->stats.free_remote[hak_stat_class(page)]);
#endif
  hak_block_tag(page, b); /* (its link crosses segments: the freed tag marks it) */
  hak_remote_free(self, owner, page, b);
}

/* A free of the thread's own block that took the slow path: perhaps its
 * page's first since the thread adopted the heap (it carries no id yet),
 * after which the page's frees are fast. */
static inline void free_own_slow(hak_heap_t* heap, hak_page_t* page, hak_block_t* b) {
  hak_block_in(page, b);
  HAK_OBSERVE_ADD(heap->stats.free_partial[hak_stat_class(page)]);
  hak_page_claim(heap, page);
  hak_heap_free_local(heap, page, b);
}

/* Heaps follow their blocks where threads hand blocks on to the next thread,
 * as servers do.  A thread whose first act is to free a block of an exited
 * thread's heap takes that heap.  If the block's thread still runs, it is
 * most likely the one that just started this thread and is about to end: the
 * new thread yields the processor (HAK_HEIR_YIELDS times at most) to let it,
 * then takes its heap if it has ended, else starts a heap of its own (not
 * another thread's abandoned one, which that thread's successor will look
 * for) that absorbs the old one on a refill once it is abandoned
 * (heap_absorb_heir).  Either way the frees of the blocks it
 * inherited are local from then on.
 *
 * A thread that has outlived the wait of HAK_DISPATCHER_HEIRS such new
 * threads is not about to end: it hands work to new threads (a server's
 * accepting thread).  Its next ones take the heap of an earlier one of
 * them that has ended, the longest ended first (its blocks the likeliest
 * freed by now: the newest first left the others' memory idle), else a
 * spare or new heap.  (Each taking a heap of its own, a server starting a
 * thread a request held a heap for each response in flight: 941 heaps, and
 * a quarter of the peers' requests a second, docs/BENCHMARKS.md.) */
static HAK_NOINLINE void heap_free_first(hak_segment_t* seg, hak_page_t* page, hak_heap_t* owner, hak_block_t* b) {
  for (int i = 0; i < HAK_HEIR_YIELDS && hak_heap_kind(owner) == HAK_HEAP_THREAD; i++) sched_yield();
  bool dispatcher = hak_heap_kind(owner) == HAK_HEAP_THREAD &&
                    __atomic_fetch_add(&owner->heirs_outlived, 1, __ATOMIC_RELAXED) >= HAK_DISPATCHER_HEIRS;
  hak_heap_t* self = thread_heap_init(owner, dispatcher);
  if (self != NULL && hak_segment_heap(seg) == self) {
    free_own_slow(self, page, b);
  } else {
    free_remote(owner, page, b);
  }
}

/* A page became empty.  The current page of its class stays, so that a class
 * that allocates and frees one block at a time does not fetch and retire a
 * page each time; a class whose pages hold few blocks (HAK_SPARE_BLOCKS_MAX)
 * keeps one more as its spare, out of the queue, for its next refill: such
 * pages fill and empty all the time, and one made anew, or formatted from
 * another class's, touches other OS pages of its units than the blocks of the
 * old one did.  Others join the heap's empty pages (newest first), whose
 * oldest give their units back beyond HAK_EMPTY_UNITS_KEEP (the oldest large
 * blocks' pages beyond HAK_EMPTY_LARGE_UNITS_KEEP of them), and each once it
 * has not been reused for the purge delay. */
static HAK_NOINLINE void heap_keep_empty(hak_heap_t* heap, hak_page_t* page) {
  if (page->home) hak_heap_home_gone(heap, page);
  if (page->cls != HAK_CLASS_LARGE) {
    hak_queue_remove(&heap->queue[page->cls], page);
    if (page->reserved <= HAK_SPARE_BLOCKS_MAX && heap->spare[page->cls] == NULL) {
      heap->spare[page->cls] = page;
      return;
    }
  }
  uint32_t now = hak_now_ms();
  hak_heap_purge_by(heap, now + (uint32_t)HAK_POLICY(purge_delay_ms));
  hak_page_mark_emptied(page, now);
  hak_queue_push_front(&heap->empty, page);
  heap->empty_units += page->units;
  if (page->cls == HAK_CLASS_LARGE) heap->empty_large_units += page->units;
  while (heap->empty_units > HAK_EMPTY_UNITS_KEEP || heap->empty_large_units > HAK_EMPTY_LARGE_UNITS_KEEP) {
    hak_page_t* oldest = heap->empty.last;
    if (heap->empty_units <= HAK_EMPTY_UNITS_KEEP) /* too many large ones: the oldest of those */
      while (oldest->cls != HAK_CLASS_LARGE) oldest = oldest->prev;
    hak_heap_empty_remove(heap, oldest);
    hak_page_retire(heap, oldest, now);
  }
  hak_heap_purge_if_due(heap, now);
  hak_heap_check(heap);
}

/* A block freed twice in a row: found at the head of its page's free list
 * (or of the heap's remote list). */
void hak_double_free(const hak_page_t* page, const void* p) {
  hak_fatal_class("double free of", p, page->cls == HAK_CLASS_LARGE ? -1 : (int)page->cls);
}

/* (Never the current page of its class: that one is pinned.) */
void hak_heap_page_empty(hak_heap_t* heap, hak_page_t* page) {
  HAK_OBSERVE_ADD(heap->stats.free_empty[hak_stat_class(page)]);
  heap_keep_empty(heap, page);
}

/* Gives the units of every kept empty page (spares too) back to their segments. */
void hak_heap_flush_empty(hak_heap_t* heap) {
  uint32_t now = hak_now_ms();
  for (unsigned c = 0; c < HAK_CLASSES; c++) {
    if (heap->spare[c] == NULL) continue;
    hak_page_retire(heap, heap->spare[c], now);
    heap->spare[c] = NULL;
  }
  while (heap->empty.first != NULL) {
    hak_page_t* page = heap->empty.first;
    hak_heap_empty_remove(heap, page);
    hak_page_retire(heap, page, now);
  }
  hak_heap_purge_if_due(heap, now);
}

/* Frees block b (its start) of a page that heap owns. */
void hak_heap_free_local(hak_heap_t* heap, hak_page_t* page, hak_block_t* b) {
  if (unlikely(b == page->free)) hak_double_free(page, b);
  hak_block_set_next(b, page->free);
  page->free = b;
  if (page->in_full) {
    __atomic_store_n(&page->in_full, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&page->div_magic, page->full_magic, __ATOMIC_RELAXED);
    hak_queue_push_back(&heap->queue[page->cls], page);
    /* (Not in a heap of the pool: pinned, the page would never empty.) */
    if (heap->queue[page->cls].first == page && heap->kind != HAK_HEAP_EMPTY) hak_heap_set_current(heap, page->cls);
  }
  if (--page->used == 0) hak_heap_page_empty(heap, page);
}

/* NULL, a pointer hakmem does not own, or a huge block aligned to 2 MiB. */
void hak_free_special(void* p) {
  if (p == NULL) return;
  hak_segment_t* seg = hak_segment_lookup(p);
  if (seg == NULL) {
    hak_count(lookup_failures, 1);
    if (hak_huge_arena_free_at(p)) hak_fatal("double free of a huge block (or a pointer into one freed)", p);
    hak_fatal("free of a pointer not allocated by hakmem", p);
  }
  hak_free_slow(seg, hak_page_of(seg, p), p);
}

static HAK_NOINLINE void free_slow_checked(hak_segment_t* seg, hak_page_t* page, void* p);

/* Most frees that miss the fast path are of a full page of this thread's heap
 * (its div_magic is 0 while it is full) or of another thread's heap: those
 * that start a block of a page are done here, without the checks and the
 * stack frame of the rest (and without the first free of a thread that has no
 * heap yet: heap_free_first). */
void hak_free_slow(hak_segment_t* seg, hak_page_t* page, void* p) {
  hak_heap_t* heap = hak_tls_heap;
  hak_heap_t* owner = hak_segment_heap(seg);
  if (likely(seg->kind == HAK_SEG_NORMAL && (uint8_t*)p >= hak_page_start(page))) {
    if (owner == heap) {
      if (page->in_full && hak_is_block_start_full(page, p)) {
        free_own_slow(heap, page, (hak_block_t*)p);
        return;
      }
    } else if (owner != NULL && heap != &hak_heap_empty && page->units != 0 &&
               page->cls != HAK_CLASS_LARGE && hak_is_class_block_start(page, p)) {
      free_remote(owner, page, (hak_block_t*)p);
      return;
    }
  }
  free_slow_checked(seg, page, p);
}

static HAK_NOINLINE void free_slow_checked(hak_segment_t* seg, hak_page_t* page, void* p) {
  if (seg->kind == HAK_SEG_HUGE) {
    if ((uint8_t*)p != (uint8_t*)seg + seg->huge_off) hak_fatal("free of an invalid pointer (inside a huge block)", p);
    if (hak_prof_has_samples()) hak_prof_forget(p);
    hak_huge_free(seg);
    return;
  }
  hak_heap_t* owner = hak_segment_heap(seg);
  if (owner == NULL || page->units == 0 || (uint8_t*)p < hak_page_start(page))
    hak_fatal("free of an invalid pointer (not a block)", p);
  /* The multiply test first: a division costs more than a remote free. */
  hak_block_t* b = hak_is_block_start(page, p) ? (hak_block_t*)p : hak_block_start(page, p);
  if ((void*)b != p && !__atomic_load_n(&page->has_aligned, __ATOMIC_RELAXED))
    hak_fatal("free of an invalid pointer (inside a block)", p);
  if (((void*)b != p || hak_page_is_sampled(page)) && hak_prof_has_samples()) hak_prof_forget(p);
  if (owner == hak_tls_heap) {
    free_own_slow(owner, page, b);
  } else if (unlikely(hak_tls_heap == &hak_heap_empty)) {
    heap_free_first(seg, page, owner, b);
  } else {
    free_remote(owner, page, b);
  }
}

/* ---- heap life -------------------------------------------------------------- */

static hak_heap_t* heap_new_locked(void) {
  size_t size = (sizeof(hak_heap_t) + 63) & ~(size_t)63;
  if (heap_chunk_next == NULL || heap_chunk_next + size > heap_chunk_end) {
    size_t chunk = 64 * 1024;
    uint8_t* p = hak_os_map(chunk);
    if (p == NULL) return NULL;
    heap_chunk_next = p;
    heap_chunk_end = p + chunk;
  }
  hak_heap_t* heap = (hak_heap_t*)heap_chunk_next;
  heap_chunk_next += size;
  /* (Each class's direct slots name its current page: heap_reset_current
   * leaves a class whose current page stays as it is.) */
  memcpy(heap->direct, hak_heap_empty.direct, sizeof heap->direct);
  memcpy(heap->current, hak_heap_empty.current, sizeof heap->current);
  heap->all_next = all_heaps;
  all_heaps = heap;
  hak_count(heaps, 1);
  return heap;
}

/* Frees that reached heaps in the spare pool (a free in flight while its
 * heap was absorbed) are passed on; called before mapping a new segment.
 * One heap's lists at a time, outside the lock, so that none is walked
 * under it. */
void hak_heaps_collect_spare(hak_heap_t* heap) {
  for (;;) {
    hak_block_t* lists[2] = {NULL, NULL};
    pthread_mutex_lock(&heaps_lock);
    for (hak_heap_t* h = spare_pool; h != NULL && lists[0] == NULL && lists[1] == NULL; h = h->pool_next) {
      if (!hak_remote_pending(h)) continue;
      lists[0] = atomic_exchange_explicit(&h->remote, NULL, memory_order_acquire);
      lists[1] = atomic_exchange_explicit(&h->remote_back, NULL, memory_order_acquire);
    }
    pthread_mutex_unlock(&heaps_lock);
    if (lists[0] == NULL && lists[1] == NULL) return;
    hak_remote_collect_stack(heap, lists[0]);
    hak_remote_collect_list(heap, lists[1]);
  }
}

/* The global heap's remote frees are collected when it allocates, and, so
 * that they do not wait for that, whenever a thread starts or ends. */
static void global_heap_collect(void) {
  if (hak_remote_pending(&hak_heap_global) && pthread_mutex_trylock(&global_heap_lock) == 0) {
    hak_remote_collect(&hak_heap_global);
    pthread_mutex_unlock(&global_heap_lock);
  }
}

/* Sets up the calling thread's heap: the abandoned heap want if it is in
 * the pool (else a spare or new one, heir of want), or with want NULL the
 * most recently abandoned one, else a spare one, else a new one.  With
 * dispatcher, want's thread hands work to new threads: the longest abandoned
 * heap of another of them (one no new thread of its own waited for), else a
 * spare or new one. */
static hak_heap_t* thread_heap_init(hak_heap_t* want, bool dispatcher) {
  hak_process_init();
  hak_fork_watch_thread(); /* before the heaps lock */
  global_heap_collect();
  pthread_mutex_lock(&heaps_lock);
  hak_heap_t** at = &abandoned_pool;
  if (dispatcher) {
    hak_heap_t** oldest = NULL;
    for (; *at != NULL; at = &(*at)->pool_next)
      if ((*at)->served == want && __atomic_load_n(&(*at)->heirs_outlived, __ATOMIC_RELAXED) == 0) oldest = at;
    if (oldest != NULL) at = oldest;
  } else if (want != NULL)
    while (*at != NULL && *at != want) at = &(*at)->pool_next;
  hak_heap_t* heap = *at;
  if (heap != NULL) {
    __atomic_store_n(at, heap->pool_next, __ATOMIC_RELAXED);
    hak_count(heaps_adopted, 1);
  } else if ((heap = spare_pool) != NULL) {
    spare_pool = heap->pool_next;
  } else {
    heap = heap_new_locked();
  }
  pthread_mutex_unlock(&heaps_lock);
  if (heap == NULL) return NULL;
  heap->heir_of = heap == want || dispatcher ? NULL : want;
  heap->served = dispatcher ? want : NULL;
  __atomic_store_n(&heap->heirs_outlived, 0, __ATOMIC_RELAXED);
  heap->pool_next = NULL;
  __atomic_store_n(&heap->kind, HAK_HEAP_THREAD, __ATOMIC_RELAXED); /* read by heirs */
  heap->tid = hak_thread_id();
  if (HAK_PROF) hak_prof_arm(heap);
  /* (Its pages carry no id: each takes this thread's as it is used.) */
  heap_reset_current(heap);
  hak_tls_heap = heap;
  hak_thread_register(heap);
  hak_heap_check(heap);
  return heap;
}

hak_heap_t* hak_thread_heap_init(void) { return thread_heap_init(NULL, false); }

/* Gives back the pages of a heap without a thread (in the pool, under the
 * heaps lock, or being absorbed) that hold no block: with retire, its current
 * pages are unpinned first and every such page goes back to its segment, as
 * units free since freed_ms; with trim, the others have the carved memory
 * above their blocks in use purged (free blocks back in address order, so
 * that the next owner fills the lowest first).  Then its kept empty pages and
 * spares go back too. */
static void heap_pages_give_back(hak_heap_t* heap, uint32_t freed_ms, bool retire, bool trim) {
  for (unsigned c = 0; c < HAK_CLASSES; c++) {
    if (retire && heap->current[c] != &hak_page_empty)
      hak_heap_use_page(heap, c, &hak_page_empty); /* lets the current page retire too */
    for (hak_page_t *page = heap->queue[c].first, *next; page != NULL; page = next) {
      next = page->next;
      if (page->used == 0) {
        hak_queue_remove(&heap->queue[c], page);
        hak_page_retire(heap, page, freed_ms);
      } else if (trim) {
        hak_page_trim(page);
      }
    }
  }
  hak_heap_flush_empty(heap);
}

/* A heap in the abandoned pool (under the heaps lock), when a thread ends and
 * on the sweeper's look: once it has waited the purge delay there untaken,
 * a dispatcher's thread's heap gives its current pages back to their
 * segments if empty and trims them if not, and every heap's pages are
 * trimmed; then, as a live heap's, its free units that have waited the delay
 * are purged.  Until then a dispatcher's thread's heap keeps its current
 * pages as its thread left them: the next of its threads goes on with them
 * (retired at each exit and their units purged, each new thread made them
 * again and faulted them in, docs/BENCHMARKS.md). */
static void pooled_purge_if_due(hak_heap_t* heap, uint32_t now_ms) {
  int32_t delay = HAK_POLICY(purge_delay_ms);
  if (delay < 0) return;
  if (!heap->pool_trimmed && (int32_t)(now_ms - heap->abandoned_ms - (uint32_t)delay) >= 0) {
    heap_pages_give_back(heap, heap->abandoned_ms, true, true);
    heap->pool_trimmed = true;
  }
  if ((heap->dirty_units != 0 || heap->empty.first != NULL) && (int32_t)(now_ms - heap->purge_due_ms) >= 0)
    hak_heap_purge(heap, now_ms, false);
}

/* Frees that reached abandoned heaps are collected whenever a thread ends.
 * Threads adopt the most recently abandoned heaps first, so without this a
 * heap deeper in the pool than threads come would keep every block freed since
 * it was abandoned.  The heaps stay in the pool (in place, under the lock), so
 * that a thread starting meanwhile still finds them.  Their pages are trimmed
 * then, and what is empty given back (thread churn's peak RSS 8.5-10.9 ->
 * 7.1-7.7 MB), but not those of the heaps a server's threads hand on
 * (served): the next of its threads takes one at once and would fault the
 * memory in again (a third of the requests a second). */
static void abandoned_collect(void) {
  if (__atomic_load_n(&abandoned_pool, __ATOMIC_RELAXED) == NULL) return;
  pthread_mutex_lock(&heaps_lock);
  uint32_t now = hak_now_ms();
  for (hak_heap_t** at = &abandoned_pool; *at != NULL;) {
    hak_heap_t* h = *at;
    pooled_purge_if_due(h, now);
    if (hak_remote_pending(h)) {
      hak_remote_collect(h);
      if (h->served == NULL) {
        heap_pages_give_back(h, now, false, true);
        hak_heap_purge(h, now, false);
      }
      if (h->segments == NULL && h->full_segments == NULL) { /* nothing left: a spare heap */
        __atomic_store_n(at, h->pool_next, __ATOMIC_RELAXED);
        h->pool_next = spare_pool;
        spare_pool = h;
        continue;
      }
    }
    at = &h->pool_next;
  }
  pthread_mutex_unlock(&heaps_lock);
}

/* Called at thread exit: collect what others freed, give back the empty
 * pages and the free units unless they are few (HAK_EXIT_DIRTY_UNITS_KEEP),
 * and put the heap where the next thread (or a live one short of memory)
 * takes it.  The heap of a dispatcher's thread keeps its current pages, with
 * their free blocks, for the next of them (pooled_purge_if_due), and gives
 * back only its kept empty pages: its queues hold no other empty page, as
 * its current pages stay pinned.  Others retire their current pages too if
 * empty (a heap nobody takes would keep them for as long as no thread ends
 * and the sweeper does not look). */
void hak_thread_heap_done(hak_heap_t* heap) {
  if (heap->kind != HAK_HEAP_THREAD) return;
  hak_remote_flush(heap);
  global_heap_collect();
  abandoned_collect();
  if (__atomic_load_n(&heap->sweep, __ATOMIC_RELAXED) != NULL) heap_sweep_back(heap); /* collected below */
  hak_remote_collect(heap);
  uint32_t now = hak_now_ms();
  heap->pool_trimmed = heap->served == NULL;
  if (heap->served == NULL)
    heap_pages_give_back(heap, now, true, false);
  else
    hak_heap_flush_empty(heap);
  hak_heap_purge(heap, now, HAK_POLICY(purge_delay_ms) >= 0 && heap->dirty_units > HAK_EXIT_DIRTY_UNITS_KEEP);
  if (__atomic_load_n(&hak_heap_dead.kind, __ATOMIC_ACQUIRE) != HAK_HEAP_DEAD) {
    pthread_mutex_lock(&heaps_lock);
    if (hak_heap_dead.kind != HAK_HEAP_DEAD) heap_sentinel_init(&hak_heap_dead, HAK_HEAP_DEAD);
    pthread_mutex_unlock(&heaps_lock);
  }
  hak_tls_heap = &hak_heap_dead;
  heap->heir_of = NULL;
  heap->tid = 0; /* a later thread may get this thread's id */
  hak_segments_clear_owner(heap);
  heap->abandoned_ms = now;
  pthread_mutex_lock(&heaps_lock);
  hak_remote_sweep_end(heap); /* (taken over meanwhile: the list waits for an heir) */
  hak_heap_t** pool = heap->segments || heap->full_segments ? &abandoned_pool : &spare_pool;
  heap->pool_next = *pool;
  __atomic_store_n(pool, heap, __ATOMIC_RELAXED); /* read unlocked in hak_heap_absorb_abandoned */
  /* Ended only now that it is in the pool: an heir waiting for this (in
   * heap_free_first) then finds it there once it has the lock.  (Marked
   * before, an heir came between and made a heap of its own: larson's
   * chain held two heaps' memory at once in one run in six.) */
  __atomic_store_n(&heap->kind, HAK_HEAP_EMPTY, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&heaps_lock);
}

/* A live heap short of memory takes over an abandoned heap's segments and
 * pages instead of mapping more: the one abandoned longest, once no starting
 * thread has taken it for the purge delay.  Returns false if there was none. */
bool hak_heap_absorb_abandoned(hak_heap_t* heap) {
  /* The global heap serves only stray allocations of exiting threads and is
   * collected rarely: memory it absorbed would stay out of reach. */
  if (heap->kind != HAK_HEAP_THREAD) return false;
  if (__atomic_load_n(&abandoned_pool, __ATOMIC_RELAXED) == NULL) return false;
  /* Not sooner: where threads come and go, each starting thread adopts the
   * heap of one that went and fills its pages; a heap absorbed meanwhile
   * would leave the next thread to start from nothing, its own pages queued
   * behind the absorber's (thread churn held 40 segments instead of 10, and
   * 1.5x glibc's peak RSS).  The oldest is last in the pool. */
  uint32_t now = hak_now_ms();
  int32_t delay = HAK_POLICY(purge_delay_ms);
  uint32_t wait = delay > 0 ? (uint32_t)delay : 0;
  pthread_mutex_lock(&heaps_lock);
  hak_heap_t** at = &abandoned_pool;
  while (*at != NULL && (*at)->pool_next != NULL) at = &(*at)->pool_next;
  hak_heap_t* from = *at;
  if (from != NULL && (int32_t)(now - from->abandoned_ms) >= (int32_t)wait)
    __atomic_store_n(at, from->pool_next, __ATOMIC_RELAXED);
  else
    from = NULL;
  pthread_mutex_unlock(&heaps_lock);
  if (from == NULL) return false;
  heap_absorb(heap, from);
  return true;
}

/* Absorbs heap->heir_of if it is abandoned now, on a refill (it is
 * forgotten once looked for: another thread may have taken it meanwhile;
 * and if it is the global heap, which is never abandoned).  Returns whether
 * it did. */
static HAK_NOINLINE bool heap_absorb_heir(hak_heap_t* heap) {
  hak_heap_t* want = heap->heir_of;
  int kind = hak_heap_kind(want);
  if (kind == HAK_HEAP_THREAD) return false; /* its thread still runs */
  if (kind != HAK_HEAP_EMPTY) {
    heap->heir_of = NULL;
    return false;
  }
  pthread_mutex_lock(&heaps_lock);
  hak_heap_t** at = &abandoned_pool;
  while (*at != NULL && *at != want) at = &(*at)->pool_next;
  bool found = *at != NULL;
  if (found) __atomic_store_n(at, want->pool_next, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&heaps_lock);
  heap->heir_of = NULL;
  if (found) heap_absorb(heap, want);
  return found;
}

/* Moves an abandoned heap, out of the pool, into the live heap. */
static void heap_absorb(hak_heap_t* heap, hak_heap_t* from) {
  hak_remote_flush(heap); /* its frees of from's blocks reach from's list, collected below */
  heap_pages_give_back(from, hak_now_ms(), true, false); /* (its current pages as its thread left them) */
  hak_segments_move(heap, from);
  hak_remote_take_reclaimed(heap, from);
  if (from->dirty_units != 0) { /* its free units not purged yet come along */
    hak_heap_purge_by(heap, from->purge_due_ms);
    heap->dirty_units += from->dirty_units;
    from->dirty_units = 0;
  }
  for (unsigned c = 0; c < HAK_CLASSES; c++) {
    while (from->queue[c].first != NULL) {
      hak_page_t* page = from->queue[c].first;
      hak_queue_remove(&from->queue[c], page);
      hak_queue_push_back(&heap->queue[c], page);
    }
    if (heap->current[c] != heap->queue[c].first) hak_heap_set_current(heap, c);
  }
  /* Frees that reached the old owner now belong to this heap. */
  hak_remote_collect_from(heap, from);
  hak_count(heaps_adopted, 1);
  hak_heap_check(heap);
  pthread_mutex_lock(&heaps_lock);
  from->pool_next = spare_pool;
  spare_pool = from;
  pthread_mutex_unlock(&heaps_lock);
}

/* Sweeps the dormant heaps (remote.c) once a purge delay at most (never if
 * memory is never purged), from a page event or refill of any thread's or
 * its remote frees; with all (malloc_trim), every other thread's heap at
 * once, whole.  self, the looking thread's heap if it is awake (else NULL),
 * is given back what the sweeper held of it. */
void hak_heaps_sweep(hak_heap_t* self, uint32_t now_ms, bool all) {
  static _Atomic uint32_t next_ms;
  static _Atomic bool behind; /* the last look left blocks unread */
  static uint32_t last_ms;    /* (under the heaps lock) */
  int32_t delay = HAK_POLICY(purge_delay_ms);
  if (!all) {
    if (delay < 0) return;
    uint32_t next = atomic_load_explicit(&next_ms, memory_order_relaxed);
    if (next != 0 && (int32_t)(now_ms - next) < 0) return; /* (0: none yet, whatever the clock) */
    uint32_t interval = delay > HAK_SWEEP_MIN_MS ? (uint32_t)delay : HAK_SWEEP_MIN_MS;
    if (atomic_load_explicit(&behind, memory_order_relaxed) && interval > HAK_SWEEP_STEP_MS)
      interval = HAK_SWEEP_STEP_MS;
    if (!atomic_compare_exchange_strong_explicit(&next_ms, &next, now_ms + interval, memory_order_relaxed,
                                                 memory_order_relaxed))
      return;
    if (pthread_mutex_trylock(&heaps_lock) != 0) return; /* (held by this thread, too) */
  } else {
    pthread_mutex_lock(&heaps_lock);
  }
  /* A look HAK_SWEEP_STEP_MS after the last reads a quarter of the most, one
   * four times as late the most: the share of the looking threads' time stays
   * bounded however often they look. */
  uint32_t since = now_ms - last_ms;
  size_t budget = SIZE_MAX; /* (malloc_trim: whole) */
  if (!all)
    budget = since >= 4 * HAK_SWEEP_STEP_MS ? HAK_SWEEP_WALK_MAX
             : HAK_SWEEP_WALK_MAX / 4 * (since < HAK_SWEEP_STEP_MS ? 1 : since / HAK_SWEEP_STEP_MS);
  last_ms = now_ms;
  /* Ended threads' heaps that no thread took give their memory back here
   * once it has waited the delay, as live heaps do on their page events. */
  for (hak_heap_t* h = abandoned_pool; h != NULL; h = h->pool_next) pooled_purge_if_due(h, now_ms);
  for (hak_heap_t* h = all_heaps; h != NULL; h = h->all_next) {
    if (h == self) {
      hak_remote_sweep_end(h); /* (awake) */
      continue;
    }
    if (hak_heap_kind(h) != HAK_HEAP_THREAD) continue; /* (an ended thread's was given back) */
    uint32_t slow_calls = atomic_load_explicit(&h->slow_calls, memory_order_relaxed);
    hak_block_t* head = atomic_load_explicit(&h->remote, memory_order_relaxed);
    if (h->sweep != NULL && slow_calls != h->sweep_slow_calls) {
      hak_remote_sweep_end(h); /* awake again */
    } else if (h->sweep != NULL || (all && head != NULL)) {
      h->sweep_slow_calls = slow_calls; /* (for the trim's: given back at the thread's next slow call) */
      if (budget != 0) budget -= hak_remote_sweep(h, budget);
    } else if (head == NULL || !h->sweep_armed || slow_calls != h->sweep_slow_calls) {
      /* Looked at again later: taken over once its thread has made no slow
       * call for HAK_DORMANT_MS while frees waited. */
      h->sweep_armed = head != NULL;
      h->sweep_slow_calls = slow_calls;
      h->sweep_armed_ms = now_ms;
    } else if ((int32_t)(now_ms - h->sweep_armed_ms) >= HAK_DORMANT_MS && budget != 0) {
      budget -= hak_remote_sweep(h, budget);
    }
  }
  if (!all) atomic_store_explicit(&behind, budget == 0, memory_order_relaxed);
  pthread_mutex_unlock(&heaps_lock);
}

/* Calls fn on every heap made and on the global heap, under the heaps lock
 * (their owners may be running: what fn reads is a snapshot). */
void hak_heaps_each(void (*fn)(hak_heap_t* heap, void* arg), void* arg) {
  pthread_mutex_lock(&heaps_lock);
  fn(&hak_heap_global, arg);
  for (hak_heap_t* h = all_heaps; h != NULL; h = h->all_next) fn(h, arg);
  pthread_mutex_unlock(&heaps_lock);
}

/* ---- trim ------------------------------------------------------------------ */

/* Gives back what a heap its caller may touch (its own, or the global heap
 * under its lock) holds unused: it collects its remote frees, retires its
 * empty current pages and kept empty pages, and purges its free units. */
static void heap_trim_own(hak_heap_t* heap, uint32_t now) {
  if (hak_remote_pending(heap)) hak_remote_collect(heap);
  for (unsigned c = 0; c < HAK_CLASSES; c++) {
    hak_page_t* page = heap->current[c];
    if (page == &hak_page_empty || page->used != HAK_USED_PINNED) continue;
    hak_queue_remove(&heap->queue[c], page);
    hak_heap_set_current(heap, c); /* unpinned: empty */
    hak_page_retire(heap, page, now);
  }
  hak_heap_flush_empty(heap);
  hak_heap_purge(heap, now, true);
}

/* Gives back at once everything that can be: the calling thread's empty pages
 * and free units, those of exited threads' heaps (with what was freed into
 * them since) and of the global heap, and the segment and huge caches.  Other
 * live threads' free units are theirs to touch: they go on their own purge
 * delay.  Returns whether any memory was given back. */
bool hak_trim(void) {
  size_t before = atomic_load_explicit(&hak_counters.purged_bytes, memory_order_relaxed) +
                  atomic_load_explicit(&hak_counters.munmap_calls, memory_order_relaxed);
  uint32_t now = hak_now_ms();
  hak_heap_t* heap = hak_tls_heap;
  if (heap->kind == HAK_HEAP_THREAD) hak_remote_flush(heap);
  /* What others freed into live heaps that do not collect (and this
   * thread's own list back, if the sweeper held it, to be collected now),
   * and into exited threads' heaps (collected otherwise when a thread ends). */
  hak_heaps_sweep(heap, now, true);
  abandoned_collect();
  if (heap->kind == HAK_HEAP_THREAD) heap_trim_own(heap, now);
  pthread_mutex_lock(&global_heap_lock);
  if (hak_heap_global.kind == HAK_HEAP_GLOBAL) heap_trim_own(&hak_heap_global, now);
  pthread_mutex_lock(&heaps_lock);
  /* Pooled heaps are touched only under heaps_lock until a thread takes one. */
  for (hak_heap_t* h = abandoned_pool; h != NULL; h = h->pool_next) {
    heap_pages_give_back(h, now, true, true);
    hak_heap_purge(h, now, true);
  }
  pthread_mutex_unlock(&heaps_lock);
  pthread_mutex_unlock(&global_heap_lock);
  hak_segment_cache_purge(now, true);
  hak_huge_cache_flush();
  return atomic_load_explicit(&hak_counters.purged_bytes, memory_order_relaxed) +
             atomic_load_explicit(&hak_counters.munmap_calls, memory_order_relaxed) !=
         before;
}
