/* Unit tests of hakmem's parts, through its internal header: size classes,
 * page carving, the segment map, unit runs in a segment, remote frees and
 * heap abandonment.  Linked with hakmem_api (no malloc override). */
#include <pthread.h>
#include <semaphore.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "internal.h"

static void test_size_classes(void) {
  hak_process_init();
  for (unsigned c = 0; c < HAK_CLASSES; c++) {
    CHECK(hak_class_size[c] % HAK_ALIGN == 0);
    CHECK(hak_class_of(hak_class_size[c]) == c);
    if (c > 0) CHECK(hak_class_size[c] > hak_class_size[c - 1]);
    CHECK(hak_class_units[c] >= 1 && hak_class_units[c] <= 16);
  }
  CHECK(hak_class_size[HAK_CLASSES - 1] == HAK_CLASS_MAX_SIZE);
  int bad = 0;
  for (size_t n = 1; n <= HAK_CLASS_MAX_SIZE; n++) {
    unsigned c = hak_class_of(n);
    size_t bs = hak_class_size[c];
    if (c >= HAK_CLASSES || bs < n) bad++;
    if (c > 0 && hak_class_size[c - 1] >= n) bad++;          /* the smallest class that fits */
    if (n <= HAK_CLASS_STEP_MAX && bs - n >= 16) bad++;         /* 16-byte steps */
    if (n > HAK_CLASS_STEP_MAX && (bs - n) * 5 > bs) bad++;     /* waste at most 1/5 */
  }
  CHECK(bad == 0);
  /* A size a little above a power of two (a buffer and its header) takes a
   * class a little above it: up to 8 KiB, less than 5/64 of the power
   * unused for a header of 8 bytes, and sqlite3's page-cache entry (a 4 KiB
   * page and 272 bytes) loses 48; above, at most 1/8. */
  for (size_t p = 1024; p <= HAK_CLASS_MAX_SIZE / 2; p *= 2) {
    size_t bs = hak_class_size[hak_class_of(p + 8)];
    if (p <= 8192)
      CHECK(bs - (p + 8) < p * 5 / 64);
    else
      CHECK(bs - (p + 8) < p / 8);
  }
  CHECK(hak_class_size[hak_class_of(4368)] - 4368 == 48);
  /* The small classes whose blocks fill their pages start them apart (no
   * two of the 16, 32 and 64-byte classes' first blocks 4K-alias), each at a
   * multiple of its alignment, and lose at most 512 bytes a page to it. */
  int misplaced = 0;
  for (unsigned c = 0; c < HAK_CLASSES; c++) {
    size_t size = hak_class_size[c], off = hak_class_start_off[c];
    if (off % (size & -size) != 0 || off > 512) misplaced++;
    if (off != 0 && hak_class_start_lines[c] != 1) misplaced++;
  }
  CHECK(misplaced == 0);
  unsigned c16 = hak_class_of(16), c32 = hak_class_of(32), c64 = hak_class_of(64);
  CHECK(hak_class_size[c16] == 16 && hak_class_size[c32] == 32 && hak_class_size[c64] == 64);
  CHECK(hak_class_start_off[c16] != hak_class_start_off[c32] &&
        hak_class_start_off[c16] != hak_class_start_off[c64] &&
        hak_class_start_off[c32] != hak_class_start_off[c64]);
  /* The heap's direct table (what malloc reads for sizes up to 1 KiB, with
   * the secure build's canary) points every size at the current page of its
   * class: with a live block in every class it serves, those pages are all
   * distinct. */
  void* live[HAK_CLASSES];
  unsigned nlive = 0;
  for (unsigned c = 0; c < HAK_DIRECT_CLASSES; c++)
    live[nlive++] = hak_malloc(hak_class_size[c] - HAK_CANARY_SIZE);
  hak_heap_t* heap = hak_tls_heap;
  int wrong = 0;
  for (size_t n = 0; n <= HAK_DIRECT_MAX; n++) {
    hak_page_t* page = heap->current[hak_class_of(n)];
    if (page == &hak_page_empty || heap->direct[(n + 15) >> 4] != page) wrong++;
  }
  CHECK(wrong == 0);
  for (unsigned i = 0; i < nlive; i++) hak_free(live[i]);
}

static void test_page_carving(void) {
  /* A class of 256-byte blocks: successive allocations come from one page,
   * carved lazily, and are distinct, aligned, and inside the page. */
  unsigned cls = hak_class_of(256);
  void* first = hak_malloc(256 - HAK_CANARY_SIZE);
  hak_segment_t* seg = hak_segment_of(first);
  hak_page_t* page = hak_page_of(seg, first);
  CHECK(page->block_size == 256);
  CHECK(page->cls == cls);
  CHECK(page->capacity < page->reserved); /* not all carved at once */
  uint32_t reserved = page->reserved;
  void** blocks = calloc(reserved, sizeof(void*));
  blocks[0] = first;
  int outside = 0;
  for (uint32_t i = 1; i < reserved; i++) {
    blocks[i] = hak_malloc(256 - HAK_CANARY_SIZE);
    if (hak_page_of(hak_segment_of(blocks[i]), blocks[i]) != page) outside++;
    if (((uintptr_t)blocks[i] - (uintptr_t)hak_page_start(page)) % 256 != 0) outside++;
  }
  CHECK(outside <= 1); /* the page may already have been partly used */
  CHECK(page->used >= reserved - 1);
  for (uint32_t i = 0; i < reserved; i++) hak_free(blocks[i]);
  free(blocks);
}

static void test_segment_map(void) {
  int on_stack = 0;
  void* p = hak_malloc(100);
  CHECK(hak_segment_lookup(p) == hak_segment_of(p));
  CHECK(hak_segmap_get(p) == HAK_MAP_SEGMENT);
  CHECK(hak_segment_lookup(&on_stack) == NULL);
  CHECK(hak_segment_lookup(NULL) == NULL);
  /* (Through a volatile: with the constant, GCC warns of the map access
   * that the range check before it rules out.) */
  void* volatile top = (void*)UINTPTR_MAX;
  CHECK(hak_segment_lookup(top) == NULL);
  void* q = malloc(100); /* the system allocator's */
  CHECK(hak_segment_lookup(q) == NULL);
  free(q);
  /* Unit 0 of a segment holds its header, never blocks. */
  hak_segment_t* seg = hak_segment_of(p);
  CHECK((uint8_t*)p >= (uint8_t*)seg + HAK_UNIT_SIZE);
  CHECK(seg->pages[0].units == 0 && seg->pages[0].div_magic == 0);
  void* huge = hak_malloc((size_t)8 << 20);
  hak_segment_t* hs = hak_segment_lookup(huge);
  CHECK(hs != NULL && hs->kind == HAK_SEG_HUGE && (uint8_t*)hs + hs->huge_off == (uint8_t*)huge);
  hak_free(huge);
  CHECK(hak_segmap_get(hs) == HAK_MAP_NONE);
  /* A block aligned exactly on a segment boundary finds its header below. */
  void* a = hak_aligned_alloc((size_t)4 << 20, (size_t)3 << 20);
  CHECK(((uintptr_t)a & (((size_t)4 << 20) - 1)) == 0);
  CHECK(hak_segmap_get(a) == HAK_MAP_HUGE_ABOVE);
  hak_segment_t* as = hak_segment_lookup(a);
  CHECK(as != NULL && as->kind == HAK_SEG_HUGE && (uint8_t*)as + as->huge_off == (uint8_t*)a);
  CHECK(hak_usable_size(a) >= ((size_t)3 << 20));
  hak_free(a);
  CHECK(hak_segmap_get(a) == HAK_MAP_NONE && hak_segmap_get(as) == HAK_MAP_NONE);
  hak_free(p);
}

static void test_block_start_check(void) {
  /* The multiply test agrees with the remainder for every offset of a page of
   * every class, and for the large (single-block) spans. */
  int bad = 0;
  for (unsigned c = 0; c < HAK_CLASSES; c++) {
    hak_page_t page = {0};
    uint8_t* start = (uint8_t*)(uintptr_t)0x10000;
    hak_page_set_start(&page, start);
    page.block_size = hak_class_size[c];
    page.div_magic = UINT64_MAX / page.block_size + 1;
    size_t span = (size_t)hak_class_units[c] * HAK_UNIT_SIZE;
    for (size_t off = 0; off < span; off += (off % 16 == 0 ? 1 : 7)) {
      bool expect = off % page.block_size == 0;
      if (hak_is_block_start(&page, start + off) != expect) bad++;
    }
  }
  CHECK(bad == 0);
  hak_page_t unused = {0};
  CHECK(!hak_is_block_start(&unused, (void*)0x12340));
}

static int find(hak_segment_t* seg, unsigned n) {
  bool backed;
  return hak_segment_find_units(seg, n, &backed);
}

static void test_unit_runs(void) {
  static hak_segment_t seg; /* only the unit bitmaps and count are used */
  seg.free_units = 0xFFFFFFFFu;
  seg.free_count = 32;
  CHECK(find(&seg, 1) == 0);
  CHECK(find(&seg, 32) == 0);
  hak_segment_take_units(&seg, 0, 3);
  CHECK(find(&seg, 1) == 3);
  hak_segment_take_units(&seg, 4, 10);
  CHECK(find(&seg, 1) == 3);
  CHECK(find(&seg, 2) == 14);
  CHECK(find(&seg, 18) == 14);
  CHECK(find(&seg, 19) == -1);
  CHECK(seg.free_count == 19);
  hak_segment_give_units(&seg, 0, 3);
  CHECK(find(&seg, 4) == 0); /* units 0-3: unit 3 was never taken */
  CHECK(find(&seg, 5) == 14);
  /* Runs whose units are all still backed come first. */
  bool backed = true;
  CHECK(hak_segment_find_units(&seg, 2, &backed) == 0 && !backed);
  seg.dirty_units = (1u << 20) | (1u << 22) | (1u << 23);
  CHECK(hak_segment_find_units(&seg, 1, &backed) == 20 && backed);
  CHECK(hak_segment_find_units(&seg, 2, &backed) == 22 && backed);
  CHECK(hak_segment_find_units(&seg, 3, &backed) == 0 && !backed);
  seg.dirty_units = 0;
}

/* ---- remote frees -------------------------------------------------------- */

#define NREMOTE 1000
static void* remote_blocks[NREMOTE];

static void* free_all(void* arg) {
  for (int i = 0; i < NREMOTE; i++) hak_free(remote_blocks[i]);
  return NULL;
}

static void test_remote_free(void) {
  for (int i = 0; i < NREMOTE; i++) remote_blocks[i] = hak_malloc(48);
  hak_heap_t* heap = hak_tls_heap;
  hak_page_t* page = hak_page_of(hak_segment_of(remote_blocks[0]), remote_blocks[0]);
  uint32_t used_before = page->used;
  pthread_t t;
  pthread_create(&t, NULL, free_all, NULL);
  pthread_join(t, NULL);
  /* The frees wait on this heap's list; the page still counts them. */
  CHECK(hak_remote_pending(heap));
  CHECK(page->used == used_before);
  hak_remote_collect(heap);
  CHECK(!hak_remote_pending(heap));
  CHECK(page->used < used_before);
}

/* A thread's remote frees of small blocks wait in its outbox while they go to
 * one heap: they reach the owner when HAK_OUTBOX_MAX are there, when a block
 * of another heap is freed, on the thread's refill, and at its exit. */
enum { OUTBOX_FEW = 5, OUTBOX_ALL = HAK_OUTBOX_MAX + 2 * OUTBOX_FEW };
static void* outbox_mine[OUTBOX_ALL];
static void* outbox_other;
static void* outbox_big; /* above HAK_SMALL_MAX: never waits */
static hak_heap_t* outbox_other_heap;
static pthread_barrier_t outbox_step, outbox_other_ready, outbox_other_done;

/* Blocks on heap's list (and on what the sweeper gave back apart). */
static size_t remote_length(hak_heap_t* heap) {
  size_t n = 0;
  for (hak_block_t* b = atomic_load(&heap->remote); b != NULL; b = hak_block_next_remote(b)) n++;
  for (hak_block_t* b = atomic_load(&heap->remote_back); b != NULL; b = hak_block_next_remote(b)) n++;
  return n;
}

/* Each step ends at a barrier where the main thread checks the lists. */
static void outbox_step_done(void) {
  pthread_barrier_wait(&outbox_step);
  pthread_barrier_wait(&outbox_step);
}

static void* outbox_freer(void* arg) {
  (void)arg;
  for (int i = 0; i < OUTBOX_FEW; i++) hak_free(outbox_mine[i]);
  hak_free(outbox_big);
  outbox_step_done(); /* 1: they wait in the outbox, the big block went */
  hak_free(outbox_other);
  outbox_step_done(); /* 2: a block of another heap sent them */
  void* own = hak_malloc(100);
  outbox_step_done(); /* 3: a refill sent the other heap's one */
  for (int i = OUTBOX_FEW; i < OUTBOX_FEW + HAK_OUTBOX_MAX; i++) hak_free(outbox_mine[i]);
  outbox_step_done(); /* 4: a full outbox went at once */
  for (int i = OUTBOX_FEW + HAK_OUTBOX_MAX; i < OUTBOX_ALL; i++) hak_free(outbox_mine[i]);
  hak_free(own);
  return NULL; /* 5: the rest go at its exit */
}

static void* outbox_owner(void* arg) {
  (void)arg;
  outbox_other = hak_malloc(48);
  outbox_other_heap = hak_tls_heap;
  pthread_barrier_wait(&outbox_other_ready);
  pthread_barrier_wait(&outbox_other_done); /* alive, so that its heap stays its own */
  return NULL;
}

static void outbox_check(size_t mine, size_t other) {
  pthread_barrier_wait(&outbox_step);
  CHECK(remote_length(hak_tls_heap) == mine);
  CHECK(remote_length(outbox_other_heap) == other);
  pthread_barrier_wait(&outbox_step);
}

static void test_remote_outbox(void) {
  hak_heap_t* heap = hak_tls_heap;
  hak_remote_collect(heap);
  for (int i = 0; i < OUTBOX_ALL; i++) REQUIRE((outbox_mine[i] = hak_malloc(48)) != NULL);
  REQUIRE((outbox_big = hak_malloc(HAK_SMALL_MAX + 1000)) != NULL);
  pthread_t owner, freer;
  REQUIRE(pthread_barrier_init(&outbox_step, NULL, 2) == 0);
  REQUIRE(pthread_barrier_init(&outbox_other_ready, NULL, 2) == 0);
  REQUIRE(pthread_barrier_init(&outbox_other_done, NULL, 2) == 0);
  REQUIRE(pthread_create(&owner, NULL, outbox_owner, NULL) == 0);
  pthread_barrier_wait(&outbox_other_ready);
  REQUIRE(pthread_create(&freer, NULL, outbox_freer, NULL) == 0);
  outbox_check(1, 0);
  outbox_check(1 + OUTBOX_FEW, 0);
  outbox_check(1 + OUTBOX_FEW, 1);
  outbox_check(1 + OUTBOX_FEW + HAK_OUTBOX_MAX, 1);
  pthread_join(freer, NULL);
  CHECK(remote_length(heap) == 1 + OUTBOX_ALL);
  pthread_barrier_wait(&outbox_other_done);
  pthread_join(owner, NULL);
  hak_page_t* page = hak_page_of(hak_segment_of(outbox_mine[0]), outbox_mine[0]);
  uint32_t used = page->used, in_page = 0;
  for (int i = 0; i < OUTBOX_ALL; i++)
    in_page += hak_page_of(hak_segment_of(outbox_mine[i]), outbox_mine[i]) == page;
  hak_remote_collect(heap);
  CHECK(remote_length(heap) == 0);
  CHECK(page->used == used - in_page);
  pthread_barrier_destroy(&outbox_step);
  pthread_barrier_destroy(&outbox_other_ready);
  pthread_barrier_destroy(&outbox_other_done);
}

/* A heap's list is a stack of chains, one a push; its owner walks several
 * side by side, each up to where the chain below begins.  Here chains of 1
 * to 40 blocks of several classes, more chains than are walked at once, with
 * blocks of another live heap among them (passed on to it). */
enum { STACK_MINE = 3000, STACK_OTHER = 60 };
static void* stack_mine[STACK_MINE];
static void* stack_other[STACK_OTHER];
static hak_heap_t* stack_other_heap;
static pthread_barrier_t stack_step;

static void* stack_owner(void* arg) {
  (void)arg;
  for (int i = 0; i < STACK_OTHER; i++) REQUIRE((stack_other[i] = hak_malloc(24)) != NULL);
  stack_other_heap = hak_tls_heap;
  pthread_barrier_wait(&stack_step); /* handed over */
  pthread_barrier_wait(&stack_step); /* passed on to this heap */
  hak_remote_collect(hak_tls_heap);
  return NULL;
}

static void test_remote_stack(void) {
  hak_heap_t* heap = hak_tls_heap;
  hak_remote_collect(heap);
  REQUIRE(pthread_barrier_init(&stack_step, NULL, 2) == 0);
  pthread_t owner;
  REQUIRE(pthread_create(&owner, NULL, stack_owner, NULL) == 0);
  pthread_barrier_wait(&stack_step);
  for (int i = 0; i < STACK_MINE; i++) REQUIRE((stack_mine[i] = hak_malloc(16 + (size_t)(i * 37) % 1000)) != NULL);
  /* The pages' counts, to see each block collected once. */
  enum { PAGES = 512 };
  static hak_page_t* pages[PAGES];
  static uint32_t used[PAGES], mine_in[PAGES];
  size_t npages = 0;
  for (int i = 0; i < STACK_MINE; i++) {
    hak_page_t* page = hak_page_of(hak_segment_of(stack_mine[i]), stack_mine[i]);
    size_t k = 0;
    while (k < npages && pages[k] != page) k++;
    REQUIRE(k < PAGES);
    if (k == npages) {
      pages[k] = page;
      used[npages++] = page->used;
    }
    mine_in[k]++;
  }
  size_t mine = 0, other = 0, chains = 0;
  while (mine < STACK_MINE) {
    size_t len = 1 + (chains * 7) % 40;
    hak_block_t *first = NULL, *last = NULL;
    for (size_t j = 0; j < len && mine < STACK_MINE; j++) {
      hak_block_t* b = other < STACK_OTHER && (mine + j) % 50 == 7 ? stack_other[other++] : stack_mine[mine++];
      if (first == NULL) last = b;
      hak_block_set_next(b, first);
      first = b;
    }
    hak_remote_push_chain(heap, first, last);
    chains++;
  }
  CHECK(chains > 4 * HAK_COLLECT_WAYS);
  CHECK(remote_length(heap) == STACK_MINE + other);
  hak_remote_collect(heap);
  CHECK(remote_length(heap) == 0);
  CHECK(remote_length(stack_other_heap) == other);
  for (size_t k = 0; k < npages; k++) CHECK(pages[k]->used == used[k] - mine_in[k]);
  hak_heap_check(heap);
  pthread_barrier_wait(&stack_step);
  pthread_join(owner, NULL);
  pthread_barrier_destroy(&stack_step);
}

/* A heap whose thread hands its blocks to others and then waits: once they
 * are all freed, the sweep gives the memory of its full pages back, and the
 * heap retires those pages when its thread collects again. */
enum { DORMANT_BLOCKS = 4000, DORMANT_SIZE = 64 };
static void* dormant_blocks[DORMANT_BLOCKS];
static hak_heap_t* dormant_heap;
static pthread_barrier_t dormant_step;
static hak_segment_t* dormant_swept_seg; /* where a swept page was */
static unsigned dormant_swept_index;

static void* dormant_owner(void* arg) {
  (void)arg;
  for (int i = 0; i < DORMANT_BLOCKS; i++) REQUIRE((dormant_blocks[i] = hak_malloc(DORMANT_SIZE)) != NULL);
  dormant_heap = hak_tls_heap;
  pthread_barrier_wait(&dormant_step); /* handed over */
  pthread_barrier_wait(&dormant_step); /* swept meanwhile */
  hak_remote_collect(hak_tls_heap);
  CHECK(atomic_load(&dormant_heap->reclaimed) == NULL);
  CHECK(dormant_swept_seg->free_units >> dormant_swept_index & 1); /* retired */
  hak_heap_check(hak_tls_heap);
  void* again = hak_malloc(DORMANT_SIZE); /* the heap works on */
  CHECK(again != NULL);
  hak_free(again);
  pthread_barrier_wait(&dormant_step);
  return NULL;
}

static bool page_resident(const hak_page_t* page) {
  unsigned char vec[HAK_UNIT_SIZE / HAK_OS_PAGE];
  void* start = (uint8_t*)hak_segment_of(page) + ((size_t)page->index << HAK_UNIT_SHIFT);
  REQUIRE(mincore(start, HAK_UNIT_SIZE, vec) == 0);
  for (size_t i = 0; i < sizeof vec; i++)
    if (vec[i] & 1) return true;
  return false;
}

/* by_trim: malloc_trim's sweep, at once; else the periodic one. */
static void dormant_sweep(bool by_trim) {
  REQUIRE(pthread_barrier_init(&dormant_step, NULL, 2) == 0);
  pthread_t owner;
  REQUIRE(pthread_create(&owner, NULL, dormant_owner, NULL) == 0);
  pthread_barrier_wait(&dormant_step);
  /* Its first pages are full now (in no queue); the last is its current one. */
  hak_page_t* first = hak_page_of(hak_segment_of(dormant_blocks[0]), dormant_blocks[0]);
  hak_page_t* held = NULL; /* a full page with one block still out: not swept */
  int kept = -1;
  for (int i = 0; i < DORMANT_BLOCKS && held == NULL; i++) {
    hak_page_t* page = hak_page_of(hak_segment_of(dormant_blocks[i]), dormant_blocks[i]);
    if (page != first && page->in_full) held = page, kept = i;
  }
  REQUIRE(first->in_full && held != NULL);
  dormant_swept_index = first->index;
  dormant_swept_seg = hak_segment_of(first);
  for (int i = 0; i < DORMANT_BLOCKS; i++)
    if (i != kept) hak_free(dormant_blocks[i]);
  hak_remote_flush(hak_tls_heap);
  size_t reclaimed = atomic_load(&hak_counters.reclaimed_pages);
  /* Swept on a look HAK_DORMANT_MS after the first (times far ahead of the
   * clock: the other threads' page events do not sweep meanwhile). */
  uint32_t t = hak_now_ms() + 1000000 * (by_trim ? 2 : 1);
  if (by_trim) {
    CHECK(hak_trim());
  } else {
    hak_heaps_sweep(hak_tls_heap, t, false);
    CHECK(atomic_load(&hak_counters.reclaimed_pages) == reclaimed);
    hak_heaps_sweep(hak_tls_heap, t + HAK_DORMANT_MS / 2, false);
    CHECK(atomic_load(&hak_counters.reclaimed_pages) == reclaimed); /* not dormant long enough */
    hak_heaps_sweep(hak_tls_heap, t + HAK_DORMANT_MS, false);
  }
  size_t swept = atomic_load(&hak_counters.reclaimed_pages) - reclaimed;
  CHECK(swept >= 1);
  CHECK(atomic_load(&dormant_heap->reclaimed) != NULL);
  CHECK(held->in_full); /* untouched */
  if (HAK_POLICY(purge_mode) == HAK_PURGE_DONTNEED) CHECK(!page_resident(first));
  /* Nothing new came: a third look reads nothing. */
  size_t walked = atomic_load(&hak_counters.sweep_walked);
  hak_heaps_sweep(hak_tls_heap, t + 2 * HAK_DORMANT_MS, false);
  CHECK(atomic_load(&hak_counters.sweep_walked) == walked);
  pthread_barrier_wait(&dormant_step);
  pthread_barrier_wait(&dormant_step); /* it collected */
  hak_free(dormant_blocks[kept]);
  pthread_join(owner, NULL);
  pthread_barrier_destroy(&dormant_step);
}

static void test_dormant_sweep(void) {
  dormant_sweep(false);
  dormant_sweep(true);
}

/* A dormant heap's list longer than a look reads: the sweeper reads it over
 * looks, HAK_SWEEP_WALK_MAX blocks each, freeing each page once it has read
 * all its blocks, and then reads each block that comes once; it gives the
 * rest back when the heap's thread wakes or ends.  malloc_trim reads a
 * list whole.  No block is lost on the way. */
enum { LONG_BLOCKS = 2 * HAK_SWEEP_WALK_MAX + 8192, LONG_LATER = 200 };
static void* long_blocks[LONG_BLOCKS];
static hak_heap_t* long_heap;
static pthread_barrier_t long_step;

static void* long_large;  /* and a large block of the owner's */
static bool long_wakes;   /* the owner wakes (malloc_trim) before it ends */
static bool long_refills; /* ... or by a malloc that refills from its queues */

static void* long_owner(void* arg) {
  int count = *(int*)arg;
  for (int i = 0; i < count; i++) REQUIRE((long_blocks[i] = hak_malloc(16)) != NULL);
  REQUIRE((long_large = hak_malloc(600000)) != NULL); /* (a large block: a page of its own) */
  long_heap = hak_tls_heap;
  pthread_barrier_wait(&long_step); /* handed over */
  pthread_barrier_wait(&long_step); /* swept meanwhile */
  if (long_wakes) {
    /* What the sweeper held comes back, and is collected. */
    hak_trim();
    CHECK(long_heap->sweep == NULL);
    CHECK(remote_length(long_heap) == 0);
    CHECK(atomic_load(&long_heap->reclaimed) == NULL);
    hak_heap_check(hak_tls_heap);
  }
  if (long_refills) {
    /* Its first refill takes its list back and collects it. */
    void* q = hak_malloc(3000); /* (a class it has no page of) */
    CHECK(q != NULL);
    CHECK(long_heap->sweep == NULL);
    CHECK(remote_length(long_heap) == 0);
    hak_free(q);
    hak_heap_check(hak_tls_heap);
  }
  pthread_barrier_wait(&long_step);
  return NULL;
}

/* Blocks on heap's list, held by the sweeper and in the pages it freed. */
static size_t long_accounted(hak_heap_t* heap) {
  size_t n = remote_length(heap) + hak_remote_swept_held(heap);
  for (hak_page_t* page = atomic_load(&heap->reclaimed); page != NULL; page = page->prev) n += page->reserved;
  return n;
}

static size_t walked_since(size_t* mark) {
  size_t now = atomic_load(&hak_counters.sweep_walked), d = now - *mark;
  *mark = now;
  return d;
}

static void long_start(pthread_t* owner, int* count) {
  REQUIRE(pthread_barrier_init(&long_step, NULL, 2) == 0);
  REQUIRE(pthread_create(owner, NULL, long_owner, count) == 0);
  pthread_barrier_wait(&long_step);
}

static void long_end(pthread_t owner) {
  pthread_barrier_wait(&long_step);
  pthread_barrier_wait(&long_step); /* it collected */
  pthread_join(owner, NULL);
  pthread_barrier_destroy(&long_step);
}

/* The times of a dormant heap's looks: far ahead of the clock, so that
 * the other threads' page events do not sweep meanwhile. */
static uint32_t look_step(void) { return (uint32_t)HAK_POLICY(purge_delay_ms) + HAK_SWEEP_MIN_MS; }

static void test_sweep_bounded(void) {
  pthread_t owner;
  int count = LONG_BLOCKS;
  long_wakes = true;
  long_start(&owner, &count);
  for (int i = 0; i < LONG_BLOCKS - LONG_LATER; i++) hak_free(long_blocks[i]);
  hak_free(long_large); /* (held with the blocks of no page counted) */
  hak_remote_flush(hak_tls_heap);
  size_t listed = remote_length(long_heap); /* (a block of an earlier test's may wait there too) */
  REQUIRE(listed >= LONG_BLOCKS - LONG_LATER + 1);
  size_t reclaimed = atomic_load(&hak_counters.reclaimed_pages), mark = 0;
  walked_since(&mark);
  uint32_t t = hak_now_ms() + 3000000; /* beyond the times of test_dormant_sweep */
  hak_heaps_sweep(hak_tls_heap, t, false);
  CHECK(walked_since(&mark) == 0); /* not dormant yet */
  t += HAK_DORMANT_MS;
  for (size_t read = 0; read < listed; t += look_step()) {
    hak_heaps_sweep(hak_tls_heap, t, false);
    size_t walked = walked_since(&mark);
    CHECK(walked == (listed - read < HAK_SWEEP_WALK_MAX ? listed - read : HAK_SWEEP_WALK_MAX));
    CHECK(long_accounted(long_heap) == listed);
    if (walked == 0) break;
    read += walked;
  }
  CHECK(atomic_load(&hak_counters.reclaimed_pages) > reclaimed);
  CHECK(remote_length(long_heap) == 0);
  /* What comes is read once. */
  for (int i = LONG_BLOCKS - LONG_LATER; i < LONG_BLOCKS; i++) hak_free(long_blocks[i]);
  hak_remote_flush(hak_tls_heap);
  hak_heaps_sweep(hak_tls_heap, t, false);
  t += look_step();
  CHECK(walked_since(&mark) == LONG_LATER);
  CHECK(long_accounted(long_heap) == listed + LONG_LATER);
  /* Every page full and freed whole is given back: what is held is of the
   * owner's current page. */
  hak_page_t* last = hak_page_of(hak_segment_of(long_blocks[LONG_BLOCKS - 1]), long_blocks[LONG_BLOCKS - 1]);
  CHECK(!last->in_full);
  size_t of_last = 0, extra = listed - (LONG_BLOCKS - LONG_LATER + 1); /* (an earlier test's block, maybe) */
  for (int i = 0; i < LONG_BLOCKS; i++) of_last += hak_page_of(hak_segment_of(long_blocks[i]), long_blocks[i]) == last;
  size_t held = hak_remote_swept_held(long_heap);
  CHECK(held >= of_last + 1 && held <= of_last + 1 + extra); /* (and the large block) */
  /* Its thread makes a slow call: the next look gives it all back. */
  hak_heap_note_slow(long_heap);
  hak_heaps_sweep(hak_tls_heap, t, false);
  t += look_step();
  CHECK(hak_remote_swept_held(long_heap) == 0 && long_heap->sweep == NULL);
  CHECK(remote_length(long_heap) == held);
  /* malloc_trim: the whole list at once. */
  hak_trim();
  CHECK(walked_since(&mark) == held);
  CHECK(long_accounted(long_heap) == listed + LONG_LATER);
  long_end(owner);
}

/* Frees that keep coming into a dormant heap are read once each. */
static void test_sweep_once(void) {
  pthread_t owner;
  int count = 100;
  long_wakes = true;
  long_start(&owner, &count);
  size_t mark = 0;
  walked_since(&mark);
  for (int i = 0; i < 50; i++) hak_free(long_blocks[i]);
  hak_remote_flush(hak_tls_heap);
  uint32_t t = hak_now_ms() + 4000000;
  hak_heaps_sweep(hak_tls_heap, t, false);
  t += HAK_DORMANT_MS;
  hak_heaps_sweep(hak_tls_heap, t, false);
  size_t first = walked_since(&mark);
  CHECK(first >= 50); /* (and an earlier test's block, maybe) */
  for (int i = 50; i < 53; i++) {
    hak_free(long_blocks[i]);
    hak_remote_flush(hak_tls_heap);
    t += look_step();
    hak_heaps_sweep(hak_tls_heap, t, false);
    CHECK(walked_since(&mark) == 1);
  }
  CHECK(hak_remote_swept_held(long_heap) == first + 3);
  long_end(owner);
  for (int i = 53; i < 100; i++) hak_free(long_blocks[i]);
  hak_free(long_large);
}

/* Pushes long_blocks[*pushed .. *pushed + len) onto long_heap's list as one
 * chain (the first of them last in it), and advances *pushed. */
static void push_long_chain(size_t* pushed, size_t len) {
  hak_block_t *first = NULL, *last = NULL;
  for (size_t j = 0; j < len; j++) {
    hak_block_t* b = long_blocks[(*pushed)++];
    if (first == NULL) last = b;
    hak_block_set_next(b, first);
    first = b;
  }
  hak_remote_push_chain(long_heap, first, last);
}

/* The owner ends (its list given back and collected): nothing is left on
 * the list or held, and no page of the first count blocks, nor long_large's,
 * has a block out. */
static void long_finish(pthread_t owner, int count) {
  hak_free(long_large);
  hak_remote_flush(hak_tls_heap);
  long_end(owner);
  CHECK(long_heap->sweep == NULL);
  CHECK(remote_length(long_heap) == 0);
  size_t in_use = 0;
  for (int i = 0; i < count; i++) in_use += hak_page_used(hak_page_of(hak_segment_of(long_blocks[i]), long_blocks[i])) != 0;
  in_use += hak_page_used(hak_page_of(hak_segment_of(long_large), long_large)) != 0;
  CHECK(in_use == 0);
}

/* The heap's thread ends while the sweeper holds its list: the list is given
 * back first, and the heap collects it as it ends (its pages all empty). */
static void test_sweep_abandoned(void) {
  pthread_t owner;
  int count = LONG_BLOCKS;
  long_wakes = false;
  long_start(&owner, &count);
  for (int i = 0; i < LONG_BLOCKS / 2; i++) hak_free(long_blocks[i]);
  hak_remote_flush(hak_tls_heap);
  REQUIRE(remote_length(long_heap) >= LONG_BLOCKS / 2);
  uint32_t t = hak_now_ms() + 6000000; /* beyond test_sweep_once's */
  hak_heaps_sweep(hak_tls_heap, t, false);
  hak_heaps_sweep(hak_tls_heap, t + HAK_DORMANT_MS, false);
  CHECK(long_heap->sweep != NULL);
  CHECK(remote_length(long_heap) == 0); /* taken, part of it read */
  for (int i = LONG_BLOCKS / 2; i < LONG_BLOCKS; i++) hak_free(long_blocks[i]); /* (on the list again) */
  long_finish(owner, LONG_BLOCKS);
}

/* The sweeper reads a stack of chains side by side, as the owner collects
 * it, and may stop anywhere in it: what it leaves must be a whole list (and
 * stack) again.  Chains of 1 to 40 blocks and a run of one-block chains (a
 * round of first blocks only, where looks stop among them), read a few blocks
 * a look (budgets of 1 to 97), given back half read and taken again: every
 * block is read once, each full page freed when its last block is, and the
 * owner, once it ends, collects everything. */
static void test_sweep_stack(void) {
  enum { COUNT = 10000 };
  pthread_t owner;
  int count = COUNT;
  long_wakes = false;
  long_refills = false;
  long_start(&owner, &count);
  hak_page_t* full[8];
  size_t nfull = 0;
  for (int i = 0; i < COUNT; i++) {
    hak_page_t* page = hak_page_of(hak_segment_of(long_blocks[i]), long_blocks[i]);
    if (!page->in_full || (nfull > 0 && full[nfull - 1] == page)) continue;
    REQUIRE(nfull < 8);
    full[nfull++] = page;
  }
  CHECK(nfull >= 1);
  size_t before = remote_length(long_heap), pushed = 0, chains = 0;
  while (pushed < COUNT) {
    size_t len = COUNT - pushed == 3 ? 3 : COUNT - pushed <= 400 ? 1 : 1 + (chains * 7) % 40;
    if (COUNT - pushed > 3 && len > COUNT - pushed - 3) len = COUNT - pushed - 3; /* (the top chain: 3) */
    push_long_chain(&pushed, len);
    chains++;
  }
  size_t listed = remote_length(long_heap), total = listed;
  CHECK(listed == before + COUNT);
  size_t reclaimed = atomic_load(&hak_counters.reclaimed_pages), read = 0, look = 0;
  bool gave_back = false;
  static const size_t budgets[] = {1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 97};
#if !HAK_SECURE
  hak_block_t* top = long_blocks[COUNT - 1]; /* (its chain: it, then COUNT - 2, then COUNT - 3;
                                                 below, the one-block chains, read before the give-back) */
#endif
  for (;;) {
    size_t budget = budgets[look++ % (sizeof budgets / sizeof budgets[0])];
    size_t n = hak_remote_sweep(long_heap, budget);
    CHECK(n == (listed - read < budget ? listed - read : budget));
    read += n;
    CHECK(long_accounted(long_heap) == total);
#if !HAK_SECURE
    /* Side by side, the first look (one block) read the top chain's second
     * block, and left its first linked to its third. */
    if (look == 1) CHECK(hak_block_next_remote(top) == long_blocks[COUNT - 3]);
#endif
    if (n == 0) break;
    if (!gave_back && read >= listed / 2) {
      /* Given back, part unread; the next look takes it again, all of it
       * unread now (but the blocks of pages freed meanwhile). */
      hak_remote_sweep_end(long_heap);
      CHECK(long_heap->sweep == NULL);
      CHECK(long_accounted(long_heap) == total);
      listed = remote_length(long_heap);
      read = 0;
      gave_back = true;
    }
  }
  CHECK(gave_back);
  CHECK(remote_length(long_heap) == 0);
  CHECK(atomic_load(&hak_counters.reclaimed_pages) - reclaimed == nfull);
  for (size_t k = 0; k < nfull; k++) CHECK(full[k]->used == 0);
  long_finish(owner, COUNT);
}

/* A look that reads a plain list (what a give-back left) and then a stack
 * of chains keeps to its budget across the two (from a review: a walk of
 * the stack given the whole budget passed every other test). */
static void test_sweep_budget_mixed(void) {
  enum { COUNT = 2000, CHAIN = 5 };
  pthread_t owner;
  int count = COUNT;
  long_wakes = false;
  long_refills = false;
  long_start(&owner, &count);
  size_t before = remote_length(long_heap), pushed = 0;
  for (int half = 0; half < 2; half++) {
    while (pushed < (size_t)(half + 1) * COUNT / 2) push_long_chain(&pushed, CHAIN);
    if (half == 0) {
      CHECK(hak_remote_sweep(long_heap, 10) == 10);
      hak_remote_sweep_end(long_heap); /* remote_back: a plain list; remote: one block */
    }
  }
  size_t total = remote_length(long_heap);
  CHECK(total == before + COUNT);
  size_t n = hak_remote_sweep(long_heap, 1500), read = n;
  CHECK(n == 1500);
  CHECK(long_accounted(long_heap) == total);
  while ((n = hak_remote_sweep(long_heap, 97)) != 0) read += n;
  CHECK(read == total);
  CHECK(long_accounted(long_heap) == total);
  long_finish(owner, COUNT);
}

/* Given back while part of it is unread, the list waits apart, and its
 * owner collects it; malloc_trim reads a list whole however long, and gives
 * it back at once where memory is never purged but by malloc_trim (no look
 * would come to give it back when the owner wakes). */
static void test_sweep_trim(void) {
  pthread_t owner;
  int count = LONG_BLOCKS;
  long_wakes = false;
  long_refills = true;
  long_start(&owner, &count);
  for (int i = 0; i < LONG_BLOCKS - LONG_LATER; i++) hak_free(long_blocks[i]);
  hak_remote_flush(hak_tls_heap);
  size_t listed = remote_length(long_heap), mark = 0;
  walked_since(&mark);
  uint32_t t = hak_now_ms() + 7000000; /* beyond test_sweep_abandoned's */
  hak_heaps_sweep(hak_tls_heap, t, false);
  t += HAK_DORMANT_MS;
  hak_heaps_sweep(hak_tls_heap, t, false);
  t += look_step();
  CHECK(walked_since(&mark) == HAK_SWEEP_WALK_MAX);
  /* Awake: given back, the unread part apart, and one block on the list. */
  hak_heap_note_slow(long_heap);
  hak_heaps_sweep(hak_tls_heap, t, false);
  t += look_step();
  CHECK(long_heap->sweep == NULL && !long_heap->sweep_armed);
  CHECK(atomic_load(&long_heap->remote_back) != NULL);
  CHECK(atomic_load(&long_heap->remote) != NULL && hak_remote_pending(long_heap));
  CHECK(long_accounted(long_heap) == listed);
  /* Taken over again (by malloc_trim): what waited apart comes with it. */
  size_t before = remote_length(long_heap);
  REQUIRE(before > HAK_SWEEP_WALK_MAX);
  size_t reclaimed = atomic_load(&hak_counters.reclaimed_pages);
  hak_trim();
  CHECK(walked_since(&mark) == before);
  CHECK(atomic_load(&hak_counters.reclaimed_pages) > reclaimed);
  CHECK(long_heap->sweep != NULL && remote_length(long_heap) == 0);
  CHECK(long_accounted(long_heap) == listed);
  /* Never purged but by malloc_trim (no look comes to give the list back):
   * a later trim reads only what came, and the thread takes its list back
   * at its first refill. */
  int32_t delay = HAK_POLICY(purge_delay_ms);
  hak_policy_publish_delay(-1);
  for (int i = LONG_BLOCKS - LONG_LATER; i < LONG_BLOCKS; i++) hak_free(long_blocks[i]);
  hak_remote_flush(hak_tls_heap);
  hak_trim();
  CHECK(walked_since(&mark) == LONG_LATER);
  CHECK(long_heap->sweep != NULL);
  CHECK(long_accounted(long_heap) == listed + LONG_LATER);
  long_end(owner); /* (long_refills: the checks) */
  hak_policy_publish_delay(delay);
  long_refills = false;
  hak_free(long_large);
}

/* A block of another heap's on a dormant heap's list (freed while its
 * segment moved, or pushed on by a heap absorbed): held apart from the
 * pages' chains, given back, and passed on to its owner. */
static void test_sweep_foreign(void) {
  pthread_t owner;
  int count = 100;
  long_wakes = true;
  long_start(&owner, &count);
  void* mine[2] = {hak_malloc(16), hak_malloc(16)};
  hak_page_t* page = hak_page_of(hak_segment_of(mine[0]), mine[0]);
  REQUIRE(page == hak_page_of(hak_segment_of(mine[1]), mine[1]));
  uint32_t used = page->used;
  for (int i = 0; i < 50; i++) hak_free(long_blocks[i]);
  hak_remote_flush(hak_tls_heap);
  for (int k = 0; k < 2; k++) {
    hak_block_in(page, (hak_block_t*)mine[k]);
    hak_block_tag(page, (hak_block_t*)mine[k]);
    hak_remote_push(long_heap, mine[k]);
  }
  size_t listed = remote_length(long_heap);
  uint32_t t = hak_now_ms() + 8000000; /* beyond test_sweep_trim's */
  hak_heaps_sweep(hak_tls_heap, t, false);
  hak_heaps_sweep(hak_tls_heap, t + HAK_DORMANT_MS, false);
  CHECK(hak_remote_swept_held(long_heap) == listed);
  CHECK(page->used == used); /* untouched */
  long_end(owner); /* it wakes: takes its list back and collects it */
  hak_remote_collect(hak_tls_heap);
  CHECK(page->used == used - 2);
  hak_heap_check(hak_tls_heap);
  for (int i = 50; i < 100; i++) hak_free(long_blocks[i]);
  hak_free(long_large);
}

/* Runs fn in a thread that allocates long_blocks[0..99], and frees them
 * into its heap once it has handed them over. */
static void own_run(void* (*fn)(void*), void* arg) {
  REQUIRE(pthread_barrier_init(&long_step, NULL, 2) == 0);
  pthread_t owner;
  REQUIRE(pthread_create(&owner, NULL, fn, arg) == 0);
  pthread_barrier_wait(&long_step);
  for (int i = 0; i < 100; i++) hak_free(long_blocks[i]);
  hak_remote_flush(hak_tls_heap);
  pthread_barrier_wait(&long_step);
  pthread_join(owner, NULL);
  pthread_barrier_destroy(&long_step);
}

/* The same through the looks of its own outbox flushes, on the real clock
 * (about HAK_DORMANT_MS; run before the tests that move the looks' times
 * far ahead): its heap is taken over once dormant, not given back at every
 * look. */
enum { FLUSH_THEIRS = 40000 };
static void** flush_theirs;

static void* flush_owner(void* arg) {
  (void)arg;
  for (int i = 0; i < 100; i++) REQUIRE((long_blocks[i] = hak_malloc(16)) != NULL);
  long_heap = hak_tls_heap;
  pthread_barrier_wait(&long_step); /* handed over */
  pthread_barrier_wait(&long_step); /* freed: on its list */
  uint32_t start = hak_now_ms();
  int k = 0;
  while (__atomic_load_n(&long_heap->sweep, __ATOMIC_RELAXED) == NULL && k < FLUSH_THEIRS &&
         hak_now_ms() - start < 4 * HAK_DORMANT_MS) {
    hak_free(flush_theirs[k++]);
    hak_remote_flush(hak_tls_heap);
    if (k % HAK_SWEEP_FLUSHES == 0) usleep(4000);
  }
  CHECK(long_heap->sweep != NULL); /* its own look took it */
  CHECK(hak_remote_swept_held(long_heap) >= 100);
  hak_trim(); /* awake: back, and collected */
  CHECK(long_heap->sweep == NULL && remote_length(long_heap) == 0);
  hak_heap_check(hak_tls_heap);
  *(int*)&flush_theirs[FLUSH_THEIRS] = k; /* (where it stopped) */
  return NULL;
}

static void test_sweep_flush_own(void) {
  if (HAK_POLICY(purge_delay_ms) < 0) return;
  REQUIRE((flush_theirs = hak_malloc((FLUSH_THEIRS + 1) * sizeof(void*))) != NULL);
  for (int i = 0; i < FLUSH_THEIRS; i++) REQUIRE((flush_theirs[i] = hak_malloc(16)) != NULL);
  own_run(flush_owner, NULL);
  int stopped = *(int*)&flush_theirs[FLUSH_THEIRS];
  hak_trim(); /* (this thread's list, perhaps taken meanwhile, back and collected) */
  for (int i = stopped; i < FLUSH_THEIRS; i++) hak_free(flush_theirs[i]);
  hak_free(flush_theirs);
  hak_heap_check(hak_tls_heap);
}

/* A thread that frees only others' blocks looks at its own heap as at any
 * other (it is dormant too: given its list back, it would not collect it). */
static void* own_look_owner(void* arg) {
  uint32_t t = *(uint32_t*)arg;
  for (int i = 0; i < 100; i++) REQUIRE((long_blocks[i] = hak_malloc(16)) != NULL);
  long_heap = hak_tls_heap;
  pthread_barrier_wait(&long_step); /* handed over */
  pthread_barrier_wait(&long_step); /* freed */
  size_t walked = atomic_load(&hak_counters.sweep_walked);
  hak_heaps_sweep(NULL, t, false);                  /* (arms) */
  hak_heaps_sweep(NULL, t + HAK_DORMANT_MS, false); /* takes over */
  CHECK(long_heap->sweep != NULL);
  CHECK(atomic_load(&hak_counters.sweep_walked) - walked >= 100);
  hak_heaps_sweep(NULL, t + HAK_DORMANT_MS + look_step(), false);
  CHECK(long_heap->sweep != NULL); /* kept */
  hak_heaps_sweep(hak_tls_heap, t + HAK_DORMANT_MS + 2 * look_step(), false);
  CHECK(long_heap->sweep == NULL); /* awake */
  hak_remote_collect(hak_tls_heap);
  hak_heap_check(hak_tls_heap);
  return NULL;
}

static void test_sweep_own(void) {
  uint32_t t = hak_now_ms() + 9000000; /* beyond test_sweep_foreign's */
  own_run(own_look_owner, &t);
}

/* A thread that makes no page event still checks its purge delay (and looks
 * at the dormant heaps) once every 64 refills. */
static void test_refill_looks(void) {
  if (HAK_PROF) return; /* (its refills all go the slow way) */
  hak_heap_t* heap = hak_tls_heap;
  void* p = hak_malloc(64);
  unsigned cls = hak_page_of(hak_segment_of(p), p)->cls; /* (the secure build's blocks are larger) */
  uint32_t stale = hak_now_ms() - 1000;
  heap->purge_looked_ms = stale;
  heap->refills = 0;
  void* q = hak_alloc_refill(heap, heap->current[cls], 64);
  CHECK(heap->purge_looked_ms == stale); /* (the page had free blocks: no page event) */
  heap->refills = (uint8_t)(256 - 4);
  void* r = hak_alloc_refill(heap, heap->current[cls], 64);
  CHECK(heap->purge_looked_ms != stale);
  hak_free(p);
  hak_free(q);
  hak_free(r);
}

/* ---- abandonment ------------------------------------------------------------ */

static void* leaver_heap;
static void* left_blocks[64];

static void* leaver(void* arg) {
  for (int i = 0; i < 64; i++) left_blocks[i] = hak_malloc(32 + i * 16);
  leaver_heap = hak_tls_heap;
  return NULL; /* exits holding its blocks */
}

static void* adopter(void* arg) {
  void* p = hak_malloc(64);
  *(void**)arg = hak_tls_heap;
  hak_free(p);
  return NULL;
}

static void test_abandon_adopt(void) {
  pthread_t t;
  pthread_create(&t, NULL, leaver, NULL);
  pthread_join(t, NULL);
  size_t adopted = atomic_load(&hak_counters.heaps_adopted);
  /* The blocks outlive their thread; freeing them goes to the abandoned heap. */
  for (int i = 0; i < 64; i++) hak_free(left_blocks[i]);
  hak_segment_t* seg = hak_segment_of(left_blocks[0]);
  CHECK(hak_segment_heap(seg) == leaver_heap);
  void* new_heap = NULL;
  pthread_create(&t, NULL, adopter, &new_heap);
  pthread_join(t, NULL);
  CHECK(new_heap == leaver_heap); /* the next thread adopted it whole */
  CHECK(atomic_load(&hak_counters.heaps_adopted) == adopted + 1);
}

/* A large block that realloc grows in place takes up to twice its units
 * where those are free: the next growths by half fit without another call. */
static void test_grow_ahead(void) {
  char* p = hak_malloc(150 << 10); /* a large block of 3 units */
  REQUIRE(p != NULL);
  hak_segment_t* seg = hak_segment_of(p);
  hak_page_t* page = hak_page_of(seg, p);
  REQUIRE(page->cls == HAK_CLASS_LARGE && page->units == 3);
  int room = (size_t)page->index + 6 <= HAK_UNITS && (seg->free_units & hak_unit_mask(page->index + 3, 3)) == hak_unit_mask(page->index + 3, 3);
  char* q = hak_realloc(p, 200 << 10); /* needs 4 */
  if (room) CHECK(q == p && page->units == 6 && hak_usable_size(q) >= (size_t)380 << 10);
  char* r = hak_realloc(q, 300 << 10);
  if (room) CHECK(r == q && page->units == 6);
  hak_free(r);
}

/* A thread's id is on the pages of its heap it uses, and on none once it
 * ends; a thread that adopts the heap stamps each page as it first uses it,
 * frees into it or grows a block of it in place, not all of them at once. */
enum { STAMP_SMALL = 3000 }; /* 48 B: two full pages and more */
static void* stamp_small[STAMP_SMALL];
static void* stamp_large;
static hak_heap_t* stamp_heap;
static int stamp_ok;

/* How many pages heap's segments hold, if each carries id (0: none) as
 * stamped_units says; else 0. */
static int heap_pages_carry(hak_heap_t* heap, uintptr_t id) {
  hak_segment_t* lists[2] = {heap->segments, heap->full_segments};
  int pages = 0;
  for (int l = 0; l < 2; l++)
    for (hak_segment_t* seg = lists[l]; seg != NULL; seg = seg->next)
      for (unsigned u = 1; u < HAK_UNITS; u++) {
        uintptr_t tid = atomic_load(&seg->pages[u].owner_tid);
        if (tid != (seg->pages[u].units ? id : 0)) return 0;
        if ((tid != 0) != (seg->stamped_units >> u & 1)) return 0;
        pages += seg->pages[u].units != 0;
      }
  return pages;
}

static hak_page_t* page_of_block(void* p) { return hak_page_of(hak_segment_of(p), p); }
static int page_carries(hak_page_t* page, uintptr_t id) {
  return atomic_load(&page->owner_tid) == id && (hak_segment_of(page)->stamped_units >> page->index & 1) == (id != 0);
}

static void* stamper(void* arg) {
  (void)arg;
  for (int i = 0; i < STAMP_SMALL; i++) stamp_small[i] = hak_malloc(48);
  stamp_large = hak_realloc(hak_malloc(200 << 10), 300 << 10); /* placed with room to grow */
  stamp_heap = hak_tls_heap;
  /* (Its own pages: a heap it took over may hold others, not used yet.) */
  uintptr_t me = hak_thread_id();
  stamp_ok = page_carries(page_of_block(stamp_small[0]), me) &&
             page_carries(page_of_block(stamp_small[STAMP_SMALL - 1]), me) && page_carries(page_of_block(stamp_large), me);
  return NULL;
}

/* The full pages of the first block and of the last block of another full page. */
static hak_page_t *stamp_freed, *stamp_untouched;

static void* stamp_heir(void* arg) {
  (void)arg;
  hak_free(stamp_small[0]); /* its first act: it takes the ended thread's heap */
  uintptr_t me = hak_thread_id();
  int ok = hak_tls_heap == stamp_heap;
  hak_page_t* current = hak_tls_heap->current[stamp_freed->cls];
  hak_page_t* large = page_of_block(stamp_large);
  ok &= page_carries(stamp_freed, me);  /* freed into */
  ok &= current == &hak_page_empty || page_carries(current, me); /* used */
  ok &= page_carries(stamp_untouched, 0) && page_carries(large, 0);
  /* A unit more than it holds, where the unit after it is free (the secure
   * build lays blocks out otherwise). */
  size_t target = hak_usable_size(stamp_large) + HAK_UNIT_SIZE;
  unsigned end = (unsigned)large->index + large->units;
  int room = end < HAK_UNITS && (hak_segment_of(large)->free_units >> end & 1) && target <= HAK_LARGE_MAX;
  void* grown = hak_realloc(stamp_large, target);
  if (room) ok &= grown == stamp_large && page_carries(large, me);
  stamp_large = grown;
  stamp_ok = ok;
  return NULL;
}

static void test_adopted_pages_stamped(void) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, stamper, NULL) == 0);
  pthread_join(t, NULL);
  CHECK(stamp_ok);
  CHECK(heap_pages_carry(stamp_heap, 0) >= 3); /* its end cleared them */
  stamp_freed = page_of_block(stamp_small[0]);
  stamp_untouched = NULL;
  for (int i = 1; i < STAMP_SMALL; i++) {
    hak_page_t* page = page_of_block(stamp_small[i]);
    if (page != stamp_freed && page->in_full) stamp_untouched = page;
  }
  REQUIRE(stamp_freed->in_full && stamp_untouched != NULL);
  REQUIRE(pthread_create(&t, NULL, stamp_heir, NULL) == 0);
  pthread_join(t, NULL);
  CHECK(stamp_ok);
  CHECK(heap_pages_carry(stamp_heap, 0) >= 3);
  for (int i = 1; i < STAMP_SMALL; i++) hak_free(stamp_small[i]);
  hak_free(stamp_large);
}

/* A live heap short of units takes over an exited thread's heap only once no
 * starting thread has adopted it for the purge delay: until then it maps a
 * segment of its own. */
/* Frees a few of the leaver's blocks, which wait in its outbox until the
 * absorber has taken the leaver's heap (and left it spare). */
enum { WAITING = 5 };
static pthread_barrier_t waiter_step;
static void* waiter(void* arg) {
  (void)arg;
  hak_free(hak_malloc(16)); /* a heap of its own, before the leaver's is abandoned */
  pthread_barrier_wait(&waiter_step);
  pthread_barrier_wait(&waiter_step);
  for (int i = 0; i < WAITING; i++) hak_free(left_blocks[i]);
  pthread_barrier_wait(&waiter_step);
  pthread_barrier_wait(&waiter_step);
  return NULL; /* its exit sends them: to their segments' new owner */
}

static void test_absorb_after_delay(void) {
  REQUIRE(hak_option_set("PURGE_DELAY_MS", 100) == 0);
  hak_free(hak_malloc(16)); /* this thread has a heap */
  hak_heap_t* self = hak_tls_heap;
  pthread_t t, w;
  REQUIRE(pthread_barrier_init(&waiter_step, NULL, 2) == 0);
  pthread_create(&w, NULL, waiter, NULL);
  pthread_barrier_wait(&waiter_step);
  pthread_create(&t, NULL, leaver, NULL);
  pthread_join(t, NULL);
  pthread_barrier_wait(&waiter_step);
  pthread_barrier_wait(&waiter_step); /* they wait in its outbox */
  hak_segment_t* seg = hak_segment_of(left_blocks[0]);
  CHECK(hak_segment_heap(seg) == leaver_heap);
  enum { BIG = 40 };
  static void* big[BIG];
  /* 1 MiB blocks take 16 units each: this heap soon needs new ones. */
  size_t segments = atomic_load(&hak_counters.segments);
  size_t mib = ((size_t)1 << 20) - HAK_CANARY_SIZE; /* the largest that is not huge */
  for (int i = 0; i < 4; i++) REQUIRE((big[i] = hak_malloc(mib)) != NULL);
  CHECK(atomic_load(&hak_counters.segments) > segments);  /* it was short of units */
  CHECK(hak_segment_heap(seg) == leaver_heap); /* but too soon: left for a starting thread */
  struct timespec pause = {0, 150 * 1000000};
  nanosleep(&pause, NULL);
  int i = 4;
  for (; i < BIG && hak_segment_heap(seg) != self; i++) REQUIRE((big[i] = hak_malloc(mib)) != NULL);
  CHECK(hak_segment_heap(seg) == self); /* absorbed, blocks and all */
  hak_remote_collect(self);
  pthread_barrier_wait(&waiter_step);
  pthread_join(w, NULL);
  CHECK(remote_length(self) == WAITING);
  CHECK(remote_length(leaver_heap) == 0);
  pthread_barrier_destroy(&waiter_step);
  for (int k = 0; k < i; k++) hak_free(big[k]);
  for (int k = WAITING; k < 64; k++) hak_free(left_blocks[k]);
}

/* A thread handing each request to a new thread whose first act frees it
 * (a server's accepting thread): past HAK_DISPATCHER_HEIRS of them, each
 * new thread takes the heap an earlier such one left, the longest left
 * first, instead of one of its own each while their responses live; such a
 * heap keeps its current pages in the pool until it has waited the delay. */
enum { REQUESTS = 3 * HAK_DISPATCHER_HEIRS, WORKERS = REQUESTS + 3 };
static void* responses[WORKERS];
static hak_heap_t* worker_heaps[WORKERS];
struct request {
  void* block;
  int index;
  sem_t* hold; /* if not NULL, the worker waits on it before it ends */
};

static void* emptied_block; /* of a page the last worker emptied */
static int kept_unstamped; /* current pages a worker took over without its id */
static void* request_worker(void* arg) {
  struct request* rq = arg;
  hak_free(rq->block); /* its first act: a block of the accepting thread, which runs on */
  hak_page_t* kept = hak_tls_heap->current[hak_class_of(200 + HAK_CANARY_SIZE)];
  if (kept != &hak_page_empty && atomic_load(&kept->owner_tid) != hak_thread_id())
    __atomic_fetch_add(&kept_unstamped, 1, __ATOMIC_RELAXED);
  responses[rq->index] = hak_malloc(200);
  if (rq->index == WORKERS - 1) { /* fills a page of 3000 B blocks, starts another, empties the first */
    enum { N = 40 };
    void* b[N];
    for (int i = 0; i < N; i++) REQUIRE((b[i] = hak_malloc(3000)) != NULL);
    hak_page_t* first = hak_page_of(hak_segment_of(b[0]), b[0]);
    for (int i = 0; i < N; i++)
      if (hak_page_of(hak_segment_of(b[i]), b[i]) == first) hak_free(b[i]);
    REQUIRE(hak_tls_heap->current[first->cls] != first);
    emptied_block = b[0];
  }
  __atomic_store_n(&worker_heaps[rq->index], hak_tls_heap, __ATOMIC_RELEASE); /* (awaited by the test) */
  if (rq->hold != NULL) sem_wait(rq->hold);
  return NULL; /* its response outlives it */
}

static void start_worker(pthread_t* t, struct request* rq, int index, sem_t* hold) {
  *rq = (struct request){hak_malloc(100), index, hold};
  REQUIRE(rq->block != NULL && pthread_create(t, NULL, request_worker, rq) == 0);
}

static void* accepting_thread(void* arg) {
  (void)arg;
  size_t heaps = atomic_load(&hak_counters.heaps);
  struct request rq, rq2;
  pthread_t t, t2;
  for (int i = 0; i < REQUESTS; i++) {
    start_worker(&t, &rq, i, NULL);
    pthread_join(t, NULL);
  }
  /* The first ones each a heap of their own; from the first of a dispatcher's,
   * one heap handed on. */
  int reused = 0;
  for (int i = HAK_DISPATCHER_HEIRS + 1; i < REQUESTS; i++)
    reused += worker_heaps[i] == worker_heaps[HAK_DISPATCHER_HEIRS];
  CHECK(reused == REQUESTS - HAK_DISPATCHER_HEIRS - 1);
  CHECK(kept_unstamped == 0); /* (a free into one would have taken the slow path) */
  CHECK(atomic_load(&hak_counters.heaps) <= heaps + 1 + HAK_DISPATCHER_HEIRS + 1);
  /* Two at once, ended in turn: the next takes the longer ended one's heap. */
  sem_t hold, hold2;
  sem_init(&hold, 0, 0);
  sem_init(&hold2, 0, 0);
  int x = REQUESTS, y = REQUESTS + 1, z = REQUESTS + 2;
  start_worker(&t, &rq, x, &hold);
  while (__atomic_load_n(&worker_heaps[x], __ATOMIC_ACQUIRE) == NULL) sched_yield();
  start_worker(&t2, &rq2, y, &hold2);
  while (__atomic_load_n(&worker_heaps[y], __ATOMIC_ACQUIRE) == NULL) sched_yield();
  sem_post(&hold);
  pthread_join(t, NULL);
  sem_post(&hold2);
  pthread_join(t2, NULL);
  start_worker(&t, &rq, z, NULL);
  pthread_join(t, NULL);
  CHECK(worker_heaps[x] != worker_heaps[y] && worker_heaps[z] == worker_heaps[x]);
  /* In the pool, its current page stays until it has waited the delay; a
   * page it emptied went back at its end (kept, the pool's heaps held 25%
   * more at the server's peak). */
  hak_heap_t* left = worker_heaps[z];
  hak_page_t* page = hak_page_of(hak_segment_of(responses[z]), responses[z]);
  hak_segment_t* eseg = hak_segment_of(emptied_block);
  uint32_t eunit = hak_unit_mask((unsigned)(((uintptr_t)emptied_block >> HAK_UNIT_SHIFT) & (HAK_UNITS - 1)), 1);
  CHECK(left->kind == HAK_HEAP_EMPTY && left->current[page->cls] == page);
  CHECK(hak_segment_heap(eseg) != left || (eseg->free_units & eunit) != 0);
  hak_heaps_sweep(hak_tls_heap, hak_now_ms() + 20000000, false); /* (past the sweep tests' times) */
  CHECK(left->current[page->cls] == &hak_page_empty);
  for (int i = 0; i < WORKERS; i++) hak_free(responses[i]);
  sem_destroy(&hold);
  sem_destroy(&hold2);
  return NULL;
}

static void test_dispatcher_heirs(void) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, accepting_thread, NULL) == 0);
  pthread_join(t, NULL);
}

/* An exiting thread's heap gives back its empty pages (its current pages
 * too) and its free units but 128 KiB, and never with a delay of -1 (which
 * purged them all at the thread's exit). */
static void* unit_leaver(void* arg) {
  (void)arg;
  enum { N = 8 };
  void* big[N];
  left_blocks[0] = hak_malloc(64); /* a block kept: its heap stays in the pool */
  hak_free(hak_malloc(64));
  hak_free(hak_malloc(700));
  for (int i = 0; i < N; i++) {
    REQUIRE((big[i] = hak_malloc(200 << 10)) != NULL);
    memset(big[i], 1, 200 << 10);
  }
  for (int i = 0; i < N; i++) hak_free(big[i]);
  leaver_heap = hak_tls_heap;
  return NULL;
}

/* A pooled heap pins no page: a full page that a collected free puts back
 * into an empty queue does not become current (pinned, it would never be
 * retired, and the heap kept its segment for good). */
enum { FULL_BLOCKS = 600 };
static void* full_blocks[FULL_BLOCKS];
static void* filler(void* arg) {
  (void)arg;
  for (int i = 0; i < FULL_BLOCKS; i++) REQUIRE((full_blocks[i] = hak_malloc(1000)) != NULL);
  leaver_heap = hak_tls_heap;
  return NULL; /* its pages full, or all but the current one */
}

static void* ender(void* arg) {
  hak_free(arg); /* a heap of its own (not the pooled one): its end collects the pool */
  return NULL;
}

static void end_a_thread(void) {
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, ender, hak_malloc(16)) == 0);
  pthread_join(t, NULL);
}

static void test_exit_gives_back(void) {
  REQUIRE(hak_option_set("PURGE_DELAY_MS", 50) == 0);
  pthread_t t;
  pthread_create(&t, NULL, unit_leaver, NULL);
  pthread_join(t, NULL);
  hak_heap_t* left = leaver_heap;
  hak_page_t* page = hak_page_of(hak_segment_of(left_blocks[0]), left_blocks[0]);
  CHECK(left->kind == HAK_HEAP_EMPTY && left->current[page->cls] == &hak_page_empty);
  CHECK(hak_page_used(page) == 1 && page->used == 1); /* not pinned */
  CHECK(left->dirty_units <= HAK_EXIT_DIRTY_UNITS_KEEP && left->empty.first == NULL);
  hak_free(left_blocks[0]);

  pthread_create(&t, NULL, filler, NULL);
  pthread_join(t, NULL);
  static hak_page_t* full_pages[FULL_BLOCKS];
  for (int i = 0; i < FULL_BLOCKS; i++) full_pages[i] = hak_page_of(hak_segment_of(full_blocks[i]), full_blocks[i]);
  /* The pages not full first: the queue is empty then. */
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < FULL_BLOCKS; i++)
      if (full_pages[i]->in_full == pass) hak_free(full_blocks[i]);
    hak_remote_flush(hak_tls_heap);
    end_a_thread();
  }
  int held = 0; /* pages of those blocks still with a block out or pinned */
  for (int i = 0; i < FULL_BLOCKS; i++) held += full_pages[i]->used != 0;
  CHECK(held == 0);

  REQUIRE(hak_option_set("PURGE_DELAY_MS", -1) == 0);
  size_t purged = atomic_load(&hak_counters.purged_bytes);
  pthread_create(&t, NULL, unit_leaver, NULL);
  pthread_join(t, NULL);
  CHECK(((hak_heap_t*)leaver_heap)->dirty_units >= 8 * 3);
  CHECK(atomic_load(&hak_counters.purged_bytes) == purged);
  hak_free(left_blocks[0]);
  REQUIRE(hak_option_set("PURGE_DELAY_MS", 100) == 0);
}

/* ---- huge blocks ------------------------------------------------------------ */

static size_t counter(_Atomic size_t* c) { return atomic_load(c); }

static void test_huge_cache_and_remap(void) {
  /* A freed huge block is kept briefly: the same size again maps nothing. */
  size_t size = (size_t)8 << 20;
  unsigned char* p = hak_malloc(size);
  REQUIRE(p != NULL);
  memset(p, 0xCD, size);
  hak_free(p);
  size_t maps = counter(&hak_counters.mmap_calls);
  unsigned char* q = hak_malloc(size);
  CHECK(q == p);
  CHECK(counter(&hak_counters.mmap_calls) == maps);
  hak_free(q);
  /* calloc of a reused mapping is zero. */
  unsigned char* z = hak_calloc(1, size);
  REQUIRE(z != NULL);
  int nonzero = 0;
  for (size_t i = 0; i < size; i += 4093) nonzero += z[i] != 0;
  CHECK(nonzero == 0 && z[size - 1] == 0);
  hak_free(z);

  /* Growing 64 MiB to 128 MiB moves pages with mremap: the contents follow,
   * no new mapping of the new size is filled by copying. */
  size_t big = (size_t)64 << 20;
  unsigned char* g = hak_malloc(big);
  REQUIRE(g != NULL);
  for (size_t i = 0; i < big; i += 4096) g[i] = (unsigned char)(i >> 12);
  size_t remaps = counter(&hak_counters.mremap_calls);
  unsigned char* h = hak_realloc(g, 2 * big);
  REQUIRE(h != NULL);
#if !HAK_SECURE /* the secure build copies: guard pages split the mapping */
  CHECK(counter(&hak_counters.mremap_calls) > remaps);
#else
  (void)remaps;
#endif
  int wrong = 0;
  for (size_t i = 0; i < big; i += 4096) wrong += h[i] != (unsigned char)(i >> 12);
  CHECK(wrong == 0);
  CHECK(hak_usable_size(h) >= 2 * big);
  h[2 * big - 1] = 1;
  hak_free(h);
}

/* The debug build checks a heap's invariants after each slow-path step: a
 * broken count is caught (in a child, which aborts). */
static void test_invariant_check(void) {
#if HAK_DEBUG
  hak_free(hak_malloc(40));
  hak_heap_check(hak_tls_heap); /* whole */
  fflush(NULL);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    hak_heap_t* heap = hak_tls_heap;
    heap->empty_units += 1; /* a count that no longer matches the empty pages */
    hak_heap_check(heap);
    _exit(0);
  }
  int status;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
#endif
}

int main(void) {
  test_size_classes();
  test_page_carving();
  test_segment_map();
  test_block_start_check();
  test_unit_runs();
  test_remote_free();
  test_remote_outbox();
  test_sweep_flush_own();
  test_dormant_sweep();
  test_sweep_bounded();
  test_sweep_once();
  test_sweep_abandoned();
  test_sweep_stack();
  test_sweep_budget_mixed();
  test_sweep_trim();
  test_sweep_foreign();
  test_sweep_own();
  test_refill_looks();
  test_abandon_adopt();
  test_adopted_pages_stamped();
  test_grow_ahead();
  test_absorb_after_delay();
  test_remote_stack(); /* (its thread's heap, left in the pool, would be the sweep tests') */
  test_dispatcher_heirs(); /* (after the sweep tests: it looks later than they do) */
  test_exit_gives_back();
  test_huge_cache_and_remap();
  test_invariant_check();
  return hak_test_result("test_units");
}
