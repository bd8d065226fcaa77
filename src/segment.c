/* Segments: 2 MiB-aligned units of memory, the segment map that tells which
 * addresses hakmem owns, the arena they are carved from, and the cache of free
 * segments.  Free segments are kept (purged beyond a few) rather than unmapped,
 * so a steady workload maps nothing new. */
#include <pthread.h>
#include <string.h>

#include "internal.h"

uint8_t hak_segmap[HAK_SEGMAP_SIZE];

void hak_segmap_set(const void* at, unsigned value) {
  uintptr_t idx = (uintptr_t)at >> HAK_SEG_SHIFT;
  if (idx < HAK_SEGMAP_SIZE) __atomic_store_n(&hak_segmap[idx], (uint8_t)value, __ATOMIC_RELEASE);
}

/* Segments are carved from arena chunks reserved many at a time. */
#define HAK_ARENA_CHUNK (32 * HAK_SEG_SIZE)
/* Free segments kept without purging; the rest are purged when cached. */
#define HAK_SEGMENT_DIRTY_KEEP 2

static pthread_mutex_t segment_lock = PTHREAD_MUTEX_INITIALIZER;
static hak_segment_t* cache_dirty;   /* free segments whose memory is still backed */
static size_t cache_dirty_count;
static hak_segment_t* cache_clean;   /* free segments purged (they read as zero) */
static uint8_t* arena_next;          /* next uncarved segment of the chunk */
static uint8_t* arena_end;
/* Every normal segment ever carved (they are never unmapped), so that a
 * forked child can find them all without following any list. */
static hak_segment_t** registry;
static size_t registry_count, registry_cap;

static bool registry_add(hak_segment_t* seg) {
  if (registry_count == registry_cap) {
    size_t cap = registry_cap ? registry_cap * 2 : 4096;
    hak_segment_t** grown = hak_os_map(cap * sizeof *grown);
    if (grown == NULL) return false;
    for (size_t i = 0; i < registry_count; i++) grown[i] = registry[i];
    if (registry != NULL) hak_os_unmap(registry, registry_cap * sizeof *registry);
    registry = grown;
    registry_cap = cap;
  }
  registry[registry_count++] = seg;
  return true;
}

/* In a forked child (single-threaded, every lock held): the parent's other
 * threads are gone, and new threads may get their thread pointers; their
 * heaps' segments must not match any thread id any more. */
void hak_segments_fork_child(hak_heap_t* survivor) {
  for (size_t i = 0; i < registry_count; i++)
    if (hak_segment_heap(registry[i]) != survivor)
      atomic_store_explicit(&registry[i]->owner_tid, 0, memory_order_relaxed);
}

void hak_segments_lock(void) { pthread_mutex_lock(&segment_lock); }
void hak_segments_unlock(void) { pthread_mutex_unlock(&segment_lock); }

static hak_segment_t* segment_from_os(void) {
  if (arena_next == arena_end) {
    uint8_t* chunk = hak_os_map_aligned(HAK_ARENA_CHUNK, HAK_SEG_SIZE, 0);
    size_t size = HAK_ARENA_CHUNK;
    if (chunk == NULL) { /* address space is tight (ulimit -v): one at a time */
      chunk = hak_os_map_aligned(HAK_SEG_SIZE, HAK_SEG_SIZE, 0);
      size = HAK_SEG_SIZE;
      if (chunk == NULL) return NULL;
    }
    arena_next = chunk;
    arena_end = chunk + size;
  }
  hak_segment_t* seg = (hak_segment_t*)arena_next;
  if (!registry_add(seg)) return NULL;
  arena_next += HAK_SEG_SIZE;
  return seg;
}

hak_segment_t* hak_segment_acquire(hak_heap_t* heap) {
  pthread_mutex_lock(&segment_lock);
  hak_segment_t* seg = cache_dirty;
  bool dirty = seg != NULL;
  if (dirty) {
    cache_dirty = seg->next;
    cache_dirty_count--;
  } else if ((seg = cache_clean) != NULL) {
    cache_clean = seg->next;
  } else {
    seg = segment_from_os();
  }
  pthread_mutex_unlock(&segment_lock);
  if (seg == NULL) return NULL;
  if (dirty) memset(seg->pages, 0, sizeof seg->pages);
  seg->kind = HAK_SEG_NORMAL;
  seg->free_units = HAK_SEG_ALL_FREE;
  seg->dirty_units = 0;
  seg->next = seg->prev = NULL;
  seg->map_size = 0;
  seg->huge_block = NULL;
  atomic_store_explicit(&seg->heap, heap, memory_order_release);
  atomic_store_explicit(&seg->owner_tid, heap->tid, memory_order_relaxed);
  hak_segmap_set(seg, HAK_MAP_SEGMENT);
  hak_count(segments, 1);
  return seg;
}

void hak_segment_release(hak_segment_t* seg) {
  hak_assert(seg->free_units == HAK_SEG_ALL_FREE);
  hak_segmap_set(seg, HAK_MAP_NONE);
  atomic_store_explicit(&seg->heap, NULL, memory_order_relaxed);
  atomic_store_explicit(&seg->owner_tid, 0, memory_order_relaxed);
  pthread_mutex_lock(&segment_lock);
  if (cache_dirty_count < HAK_SEGMENT_DIRTY_KEEP) {
    seg->next = cache_dirty;
    cache_dirty = seg;
    cache_dirty_count++;
    pthread_mutex_unlock(&segment_lock);
    return;
  }
  pthread_mutex_unlock(&segment_lock);
  hak_os_purge(seg, HAK_SEG_SIZE); /* the header too: it reads back as zero */
  pthread_mutex_lock(&segment_lock);
  seg->next = cache_clean;
  cache_clean = seg;
  pthread_mutex_unlock(&segment_lock);
}

/* First run of n free units in the segment, or -1. */
int hak_segment_find_units(hak_segment_t* seg, unsigned n) {
  uint32_t m = seg->free_units;
  for (unsigned i = 1; i < n && m; i++) m &= seg->free_units >> i;
  if (m == 0) return -1;
  return __builtin_ctz(m);
}

static uint32_t unit_mask(unsigned idx, unsigned n) {
  return (n >= 32 ? 0xFFFFFFFFu : ((1u << n) - 1)) << idx;
}

void hak_segment_take_units(hak_segment_t* seg, unsigned idx, unsigned n) {
  hak_assert((seg->free_units & unit_mask(idx, n)) == unit_mask(idx, n));
  seg->free_units &= ~unit_mask(idx, n);
}

void hak_segment_give_units(hak_segment_t* seg, unsigned idx, unsigned n) {
  hak_assert((seg->free_units & unit_mask(idx, n)) == 0);
  seg->free_units |= unit_mask(idx, n);
}
