/* Segments: 2 MiB-aligned units of memory, the segment map that tells which
 * addresses hakmem owns, the arena they are carved from, and the cache of free
 * segments.  Free segments are kept rather than unmapped, so a steady workload
 * maps nothing new; their memory is given back once they have stayed free for
 * the purge delay (at once beyond a few), and the address space is kept. */
#include <pthread.h>
#include <string.h>

#include "internal.h"

HAK_BSS_LAST uint8_t hak_segmap[HAK_SEGMAP_SIZE];

void hak_segmap_set(const void* at, unsigned value) {
  uintptr_t idx = (uintptr_t)at >> HAK_SEG_SHIFT;
  if (idx < HAK_SEGMAP_SIZE) __atomic_store_n(&hak_segmap[idx], (uint8_t)value, __ATOMIC_RELEASE);
}

/* Segments are carved from arena chunks reserved many at a time. */
#define HAK_ARENA_CHUNK (32 * HAK_SEG_SIZE)
/* Free segments kept backed until the purge delay has passed: as many as the
 * most segments ever in use at once (since the last trim) leaves beside those
 * in use now, so that a program whose use of segments falls and rises again
 * faults nothing in and never has more backed than at its peak (the huge-block
 * arena's rule), within MAX, and at least KEEP.  Beyond, the oldest are
 * purged as they are cached. */
#define HAK_SEGMENT_DIRTY_KEEP 4
#define HAK_SEGMENT_DIRTY_MAX 512 /* 1 GiB, as the huge-block arena */

static pthread_mutex_t segment_lock = PTHREAD_MUTEX_INITIALIZER;
/* Free segments whose memory is still backed, newest first; each one's
 * unit_freed_ms[0] (unit 0 is the header, never a free unit) says when it
 * was cached. */
static hak_segment_t* cache_dirty;
static _Atomic size_t cache_dirty_count; /* read unlocked */
static _Atomic uint32_t cache_dirty_due_ms; /* when the oldest is due; read unlocked */
static hak_segment_t* cache_clean;   /* free segments purged (they read as zero) */
/* Segments in use (taken from the cache or the OS, not released), and the
 * most at once since the last trim: written under segment_lock, read unlocked. */
static _Atomic size_t segments_used, segments_used_peak;
static uint8_t* arena_next;          /* next uncarved segment of the chunk */
static uint8_t* arena_end;
/* Every normal segment ever carved (they are never unmapped), so that a
 * forked child can find them all without following any list.  The first
 * 16 (32 MiB) are listed beside the other globals, on a page touched anyway,
 * rather than on a page of a mapping of their own. */
#define HAK_REGISTRY_FIRST 16
static hak_segment_t* registry_first[HAK_REGISTRY_FIRST];
static hak_segment_t** registry = registry_first;
static size_t registry_count, registry_cap = HAK_REGISTRY_FIRST;

/* Room in the registry for one more segment; false if it cannot grow. */
static bool registry_room(void) {
  if (registry_count < registry_cap) return true;
  size_t cap = registry_cap < 4096 ? 4096 : registry_cap * 2;
  hak_segment_t** grown = hak_os_map(cap * sizeof *grown);
  if (grown == NULL) return false;
  for (size_t i = 0; i < registry_count; i++) grown[i] = registry[i];
  if (registry != registry_first) hak_os_unmap(registry, registry_cap * sizeof *registry);
  registry = grown;
  registry_cap = cap;
  return true;
}

static bool registry_add(hak_segment_t* seg) {
  if (!registry_room()) return false;
  registry[registry_count++] = seg;
  return true;
}

/* In a forked child (single-threaded, every lock held): the parent's other
 * threads are gone, and new threads may get their thread pointers; their
 * heaps' segments must not match any thread id any more. */
void hak_segments_fork_child(hak_heap_t* survivor) {
  for (size_t i = 0; i < registry_count; i++)
    if (hak_segment_heap(registry[i]) != survivor) hak_segment_clear_owner(registry[i]);
}

/* Clears the owner's id from the segment's pages, the ones that carry it
 * (stamped_units): the descriptors heading them, the only ones free reads.
 * Every other descriptor stays all zero, a free segment's too: a page's
 * are cleared as it is retired. */
void hak_segment_clear_owner(hak_segment_t* seg) {
  /* (Not a write either where none does: a forked child clears every
   * segment, and a cached one's header may be purged.) */
  if (seg->stamped_units == 0) return;
  for (uint32_t m = seg->stamped_units; m != 0; m &= m - 1)
    atomic_store_explicit(&seg->pages[__builtin_ctz(m)].owner_tid, 0, memory_order_release);
  seg->stamped_units = 0;
}

/* The segments heap holds (a bound of its pages, for the sweep: remote.c). */
size_t hak_segments_held(hak_heap_t* heap) {
  size_t n = 0;
  pthread_mutex_lock(&segment_lock);
  for (size_t i = 0; i < registry_count; i++) n += hak_segment_heap(registry[i]) == heap;
  pthread_mutex_unlock(&segment_lock);
  return n;
}

void hak_segments_lock(void) { pthread_mutex_lock(&segment_lock); }
void hak_segments_unlock(void) { pthread_mutex_unlock(&segment_lock); }

static hak_segment_t* segment_from_os(void) {
  if (arena_next == arena_end) {
    /* Under a limit of address space, one at a time (what is reserved
     * counts against it). */
    uint8_t* chunk = hak_os_space_limited() ? NULL : hak_os_map_aligned(HAK_ARENA_CHUNK, HAK_SEG_SIZE, 0);
    size_t size = HAK_ARENA_CHUNK;
    if (chunk == NULL) { /* address space is tight (ulimit -v): one at a time */
      size = HAK_SEG_SIZE;
      chunk = hak_os_map_aligned(size, HAK_SEG_SIZE, 0);
      /* The huge-block cache's mappings count against the limit too. */
      if (chunk == NULL && hak_huge_cache_flush()) chunk = hak_os_map_aligned(size, HAK_SEG_SIZE, 0);
      if (chunk == NULL) return NULL;
    }
    hak_os_thp(chunk, size);
    arena_next = chunk;
    arena_end = chunk + size;
  }
  hak_segment_t* seg = (hak_segment_t*)arena_next;
  /* The secure build: the rest of unit 0 after the header is a guard. */
  if (HAK_SECURE && !hak_os_guard_mark((uint8_t*)seg + HAK_SEG_HDR_SIZE, HAK_UNIT_SIZE - HAK_SEG_HDR_SIZE))
    return NULL;
  if (!registry_add(seg)) return NULL;
  arena_next += HAK_SEG_SIZE;
  seg->zero_units = HAK_SEG_ALL_FREE; /* as the system mapped it */
  return seg;
}

/* Counts segments taken (+1) or released (-1), under segment_lock; true if
 * more are taken than ever before. */
static bool segments_count(int delta) {
  size_t used = atomic_load_explicit(&segments_used, memory_order_relaxed) + (size_t)(ptrdiff_t)delta;
  atomic_store_explicit(&segments_used, used, memory_order_relaxed);
  if (used <= atomic_load_explicit(&segments_used_peak, memory_order_relaxed)) return false;
  atomic_store_explicit(&segments_used_peak, used, memory_order_relaxed);
  return true;
}

hak_segment_t* hak_segment_acquire(hak_heap_t* heap) {
  pthread_mutex_lock(&segment_lock);
  hak_segment_t* seg = cache_dirty;
  bool dirty = seg != NULL, taken = false;
  if (dirty) {
    cache_dirty = seg->next;
    cache_dirty_count--;
  } else if ((seg = cache_clean) != NULL) {
    cache_clean = seg->next;
  } else if (registry_room() && (seg = hak_huge_take_granule()) != NULL) {
    taken = registry_add(seg); /* (room made) */
  } else {
    seg = segment_from_os();
  }
  bool more_than_ever = seg != NULL && segments_count(1);
  pthread_mutex_unlock(&segment_lock);
  if (seg == NULL) return NULL;
  /* A segment from the backed cache keeps its dirty units (still counted
   * committed, with their free times): the new owner reuses them first and
   * purges them in its turn; so do the units of a free huge granule taken.
   * Another one's header is backed now; its units are counted as pages
   * take them. */
  if (!dirty) {
    if (taken) {
      uint32_t now = hak_now_ms();
      for (unsigned u = 1; u < HAK_UNITS; u++) {
        seg->unit_freed_ms[u] = now;
        seg->unit_purged_ms[u] = 0;
      }
      seg->dirty_units = HAK_SEG_ALL_FREE;
      seg->zero_units = 0;
      hak_committed_add(HAK_SEG_HDR_SIZE + ((size_t)(HAK_UNITS - 1) << HAK_UNIT_SHIFT));
    } else {
      seg->dirty_units = 0; /* unit_purged_ms: zero from the OS, else stamped as it was cached */
      hak_committed_add(HAK_SEG_HDR_SIZE);
    }
  }
  if (more_than_ever) hak_huge_purge_for_growth(); /* room for the segments' growth */
  /* Its descriptors are all zero (page_retire), whether its header was
   * purged or not. */
#if HAK_DEBUG
  static const hak_page_t zero;
  for (unsigned u = 0; u < HAK_UNITS; u++) hak_assert(memcmp(&seg->pages[u], &zero, sizeof zero) == 0);
  hak_assert(seg->stamped_units == 0);
#endif
  seg->kind = HAK_SEG_NORMAL;
  seg->free_units = HAK_SEG_ALL_FREE;
  seg->free_count = HAK_UNITS - 1;
  seg->next = seg->prev = NULL;
  seg->map_size = 0;
  seg->huge_off = 0;
  atomic_store_explicit(&seg->heap, heap, memory_order_release);
  hak_segmap_set(seg, HAK_MAP_SEGMENT);
  hak_count(segments, 1);
  return seg;
}

/* Purges a free segment into the clean cache.  Its units still backed are
 * stamped (the header is written again anyway) if they go for having stayed
 * cached the delay, so that their next owner can tell a refault (learn.c). */
static void cache_clean_push(hak_segment_t* seg, uint32_t now_ms, int32_t delay) {
  uint32_t dirty = seg->dirty_units;
  bool waited = delay > 0 && hak_purge_is_due(seg->unit_freed_ms[0], now_ms, delay);
  bool zeroed = hak_os_purge(seg, HAK_SEG_SIZE); /* the header too */
  hak_committed_sub(HAK_SEG_HDR_SIZE + ((size_t)hak_popcount(dirty) << HAK_UNIT_SHIFT));
  for (unsigned u = 0; u < HAK_UNITS; u++)
    seg->unit_purged_ms[u] = waited && (dirty >> u & 1) ? now_ms | 1 : 0;
  if (waited && dirty != 0) hak_count(idle_purged_units, (size_t)hak_popcount(dirty));
  seg->dirty_units = 0;
  seg->zero_units = zeroed ? HAK_SEG_ALL_FREE : 0;
  pthread_mutex_lock(&segment_lock);
  seg->next = cache_clean;
  cache_clean = seg;
  pthread_mutex_unlock(&segment_lock);
}

/* Free segments cached backed now (read unlocked). */
size_t hak_segment_cache_dirty(void) { return atomic_load_explicit(&cache_dirty_count, memory_order_relaxed); }

/* The free segments that may stay backed now. */
static size_t segments_dirty_budget(void) {
  size_t used = atomic_load_explicit(&segments_used, memory_order_relaxed);
  size_t room = atomic_load_explicit(&segments_used_peak, memory_order_relaxed) - used;
  if (room > HAK_SEGMENT_DIRTY_MAX) room = HAK_SEGMENT_DIRTY_MAX; /* (also when the loads disagree) */
  return room > HAK_SEGMENT_DIRTY_KEEP ? room : HAK_SEGMENT_DIRTY_KEEP;
}

/* Purges the cached backed segments that are due (all of them if all), and
 * beyond the budget the oldest whatever their age, unless purging is off.
 * Cheap when nothing is due: a few unlocked loads. */
void hak_segment_cache_purge(uint32_t now_ms, bool all) {
  size_t count = atomic_load_explicit(&cache_dirty_count, memory_order_relaxed);
  int32_t delay = HAK_POLICY(purge_delay_ms); /* read once: one decision, one value */
  if (count == 0 || (!all && delay < 0)) return;
  if (!all && count <= segments_dirty_budget() &&
      !hak_purge_is_due(atomic_load_explicit(&cache_dirty_due_ms, memory_order_relaxed), now_ms, delay))
    return;
  hak_segment_t* purge = NULL;
  pthread_mutex_lock(&segment_lock);
  size_t kept = 0, keep = segments_dirty_budget();
  if (all) /* a new start for the budget */
    atomic_store_explicit(&segments_used_peak, atomic_load_explicit(&segments_used, memory_order_relaxed),
                          memory_order_relaxed);
  for (hak_segment_t **link = &cache_dirty, *seg; (seg = *link) != NULL;) {
    bool over = kept >= keep && delay >= 0;
    if (all || over || hak_purge_is_due(seg->unit_freed_ms[0], now_ms, delay)) {
      *link = seg->next;
      seg->next = purge;
      purge = seg;
      cache_dirty_count--;
    } else {
      if (kept == 0 || (int32_t)(seg->unit_freed_ms[0] - atomic_load_explicit(&cache_dirty_due_ms, memory_order_relaxed)) < 0)
        atomic_store_explicit(&cache_dirty_due_ms, seg->unit_freed_ms[0], memory_order_relaxed);
      kept++;
      link = &seg->next;
    }
  }
  pthread_mutex_unlock(&segment_lock);
  while (purge != NULL) {
    hak_segment_t* next = purge->next;
    cache_clean_push(purge, now_ms, delay);
    purge = next;
  }
}

/* Unmaps a cached segment (under segment_lock), its backed units with it. */
static void segment_unmap(hak_segment_t* seg, bool backed) {
  for (size_t i = 0; i < registry_count; i++)
    if (registry[i] == seg) {
      registry[i] = registry[--registry_count];
      break;
    }
  if (backed) hak_committed_sub(HAK_SEG_HDR_SIZE + ((size_t)hak_popcount(seg->dirty_units) << HAK_UNIT_SHIFT));
  hak_os_unmap(seg, HAK_SEG_SIZE);
}

/* Unmaps every cached segment, for a mapping the system refused (a limit of
 * address space, `ulimit -v`, or of mappings): segments are otherwise kept
 * mapped for good, so after a phase of many blocks a huge block could find
 * no room even with everything freed.  Returns whether any was unmapped. */
bool hak_segment_cache_unmap(void) {
  pthread_mutex_lock(&segment_lock);
  bool any = cache_dirty != NULL || cache_clean != NULL;
  while (cache_dirty != NULL) {
    hak_segment_t* seg = cache_dirty;
    cache_dirty = seg->next;
    segment_unmap(seg, true);
  }
  while (cache_clean != NULL) {
    hak_segment_t* seg = cache_clean;
    cache_clean = seg->next;
    segment_unmap(seg, false);
  }
  atomic_store_explicit(&cache_dirty_count, 0, memory_order_relaxed);
  pthread_mutex_unlock(&segment_lock);
  return any;
}

void hak_segment_release(hak_segment_t* seg) {
  hak_assert(seg->free_units == HAK_SEG_ALL_FREE);
  hak_segmap_set(seg, HAK_MAP_NONE);
  atomic_store_explicit(&seg->heap, NULL, memory_order_relaxed);
  uint32_t now = hak_now_ms();
  if (HAK_POLICY(purge_delay_ms) == 0) {
    pthread_mutex_lock(&segment_lock);
    segments_count(-1);
    pthread_mutex_unlock(&segment_lock);
    cache_clean_push(seg, now, 0);
    return;
  }
  seg->unit_freed_ms[0] = now;
  pthread_mutex_lock(&segment_lock);
  if (cache_dirty == NULL) atomic_store_explicit(&cache_dirty_due_ms, now, memory_order_relaxed);
  seg->next = cache_dirty;
  cache_dirty = seg;
  cache_dirty_count++;
  segments_count(-1);
  pthread_mutex_unlock(&segment_lock);
  hak_segment_cache_purge(now, false);
}

/* Adds what the heaps' segments hold to usage, walking every segment ever
 * carved.  Other threads may be changing the descriptors it reads: the
 * figures are a snapshot. */
void hak_segments_usage(hak_usage_t* usage) {
  pthread_mutex_lock(&segment_lock);
  for (size_t i = 0; i < registry_count; i++) {
    hak_segment_t* seg = registry[i];
    if (hak_segment_heap(seg) == NULL) {
      usage->cached_segments++;
      continue;
    }
    usage->segments++;
    usage->free_unit_bytes +=
        (size_t)hak_popcount(__atomic_load_n(&seg->free_units, __ATOMIC_RELAXED)) << HAK_UNIT_SHIFT;
    for (unsigned u = 1; u < HAK_UNITS;) {
      hak_page_t* page = &seg->pages[u];
      unsigned units = __atomic_load_n(&page->units, __ATOMIC_RELAXED);
      if (units == 0) {
        u++;
        continue;
      }
      size_t used = __atomic_load_n(&page->used, __ATOMIC_RELAXED) & ~HAK_USED_PINNED;
      size_t fit = __atomic_load_n(&page->reserved, __ATOMIC_RELAXED);
      size_t block = __atomic_load_n(&page->block_size, __ATOMIC_RELAXED);
      uint8_t cls = __atomic_load_n(&page->cls, __ATOMIC_RELAXED);
      unsigned k = cls < HAK_CLASSES ? cls : HAK_CLASSES;
      usage->pages++;
      usage->class_pages[k]++;
      usage->class_live[k] += used;
      usage->in_use_bytes += used * block;
      if (fit > used) {
        usage->class_free[k] += fit - used;
        usage->class_free_bytes[k] += (fit - used) * block;
      }
      u += units;
    }
  }
  pthread_mutex_unlock(&segment_lock);
}

/* Starts of the runs of n units all set in mask. */
static uint32_t run_starts(uint32_t mask, unsigned n) {
  uint32_t m = mask;
  for (unsigned i = 1; i < n && m; i++) m &= mask >> i;
  return m;
}

/* A run of n free units in the segment, or -1: the first whose units are all
 * still backed if there is one (reusing them costs no page fault, and lets
 * the purge take the ones left idle), else the first. */
int hak_segment_find_units(hak_segment_t* seg, unsigned n, bool* backed) {
  if (seg->free_count < n) return -1;
  uint32_t m = run_starts(seg->free_units, n);
  if (m == 0) return -1;
  uint32_t d = run_starts(seg->dirty_units, n);
  *backed = d != 0;
  return __builtin_ctz(d != 0 ? d : m);
}

void hak_segment_take_units(hak_segment_t* seg, unsigned idx, unsigned n) {
  hak_assert((seg->free_units & hak_unit_mask(idx, n)) == hak_unit_mask(idx, n));
  seg->free_units &= ~hak_unit_mask(idx, n);
  seg->free_count -= n;
}

void hak_segment_give_units(hak_segment_t* seg, unsigned idx, unsigned n) {
  hak_assert((seg->free_units & hak_unit_mask(idx, n)) == 0);
  seg->free_units |= hak_unit_mask(idx, n);
  seg->free_count += n;
}
