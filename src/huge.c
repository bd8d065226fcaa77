/* Huge blocks: above HAK_LARGE_MAX a block is laid out as a segment (header
 * at a 2 MiB boundary, so free finds it by the same mask).  Up to
 * ARENA_RUN_MAX granules it takes a run of 2 MiB granules of the huge-block
 * arena: chunks of address space reserved ARENA_CHUNK at a time, whose free
 * granules coalesce by construction and stay backed (dirty) until the purge
 * delay or the dirty budget gives them back, so that a program that frees
 * and allocates big buffers faults in nothing and maps nothing.  Larger
 * blocks, blocks aligned to 2 MiB or more, and every block when the arena
 * cannot reserve (an address-space limit) get a mapping of their own, which
 * realloc grows or moves with mremap; freed, such mappings are kept briefly
 * (bounded in bytes and age). */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "internal.h"

#define HUGE_CACHE_SLOTS 8
#define HUGE_CACHE_BYTES ((size_t)64 << 20)
#define HUGE_CACHE_MAX_AGE_MS 1000 /* 1 s */
/* A cached mapping reused for a smaller block keeps its backed tail (no page
 * faults when the next block is bigger again) while the tails of all live
 * huge blocks stay within this; beyond it the tail is unmapped. */
#define HUGE_SPARE_MAX ((size_t)32 << 20)

typedef struct huge_cached_s {
  hak_segment_t* seg; /* NULL: slot free */
  uint32_t freed_ms;
} huge_cached_t;

static pthread_mutex_t huge_lock = PTHREAD_MUTEX_INITIALIZER;
static huge_cached_t huge_cache[HUGE_CACHE_SLOTS];
static size_t huge_cache_bytes;
static size_t arena_dirty; /* bytes of the arena's dirty granules (below) */
static _Atomic size_t huge_spare_bytes; /* the kept tails of live huge blocks */

/* Drops the block's kept tail from the count (it is freed, or resized exactly). */
static void huge_spare_forget(hak_segment_t* seg) {
  if (seg->huge_spare_pages == 0) return;
  atomic_fetch_sub_explicit(&huge_spare_bytes, (size_t)seg->huge_spare_pages * HAK_OS_PAGE,
                            memory_order_relaxed);
  seg->huge_spare_pages = 0;
}

void hak_huge_lock(void) { pthread_mutex_lock(&huge_lock); }
void hak_huge_unlock(void) { pthread_mutex_unlock(&huge_lock); }

/* Takes the smallest cached mapping of at least total bytes, else the largest
 * smaller one (the caller resizes it: its pages are already backed, which
 * saves the page faults of a fresh mapping); unmaps the ones that have aged
 * out.  Called without the lock. */
static hak_segment_t* huge_cache_take(size_t total) {
  hak_segment_t* expired[HUGE_CACHE_SLOTS];
  int nexpired = 0;
  hak_segment_t* best = NULL;
  uint32_t now = hak_now_ms();
  pthread_mutex_lock(&huge_lock);
  int best_slot = -1;
  for (int i = 0; i < HUGE_CACHE_SLOTS; i++) {
    hak_segment_t* seg = huge_cache[i].seg;
    if (seg == NULL) continue;
    if ((int32_t)(now - huge_cache[i].freed_ms) > HUGE_CACHE_MAX_AGE_MS) {
      expired[nexpired++] = seg;
      huge_cache_bytes -= seg->map_size;
      huge_cache[i].seg = NULL;
      continue;
    }
    if (best_slot < 0) {
      best_slot = i;
      continue;
    }
    size_t have = huge_cache[best_slot].seg->map_size, size = seg->map_size;
    bool better = have >= total ? (size >= total && size < have) : size > have;
    if (better) best_slot = i;
  }
  if (best_slot >= 0) {
    best = huge_cache[best_slot].seg;
    huge_cache[best_slot].seg = NULL;
    huge_cache_bytes -= best->map_size;
  }
  pthread_mutex_unlock(&huge_lock);
  for (int i = 0; i < nexpired; i++) hak_os_unmap(expired[i], expired[i]->map_size);
  return best;
}

static bool huge_cache_full(void) {
  for (int i = 0; i < HUGE_CACHE_SLOTS; i++)
    if (huge_cache[i].seg == NULL) return false;
  return true;
}

static int huge_cache_oldest(void) {
  int oldest = -1;
  for (int i = 0; i < HUGE_CACHE_SLOTS; i++)
    if (huge_cache[i].seg != NULL && (oldest < 0 || (int32_t)(huge_cache[i].freed_ms - huge_cache[oldest].freed_ms) < 0))
      oldest = i;
  return oldest;
}

/* Bytes of the mappings cached and of the arena's dirty granules (statistics). */
size_t hak_huge_cached_bytes(void) {
  pthread_mutex_lock(&huge_lock);
  size_t bytes = huge_cache_bytes + arena_dirty;
  pthread_mutex_unlock(&huge_lock);
  return bytes;
}

/* Unmaps every cached mapping (malloc_trim, and a mapping that failed:
 * under an address-space limit the cache holds what the next one needs).
 * Returns whether it unmapped any. */
static bool arena_flush(void);
bool hak_huge_cache_flush(void) {
  bool arena_gave = arena_flush();
  hak_segment_t* cached[HUGE_CACHE_SLOTS];
  int n = 0;
  pthread_mutex_lock(&huge_lock);
  for (int i = 0; i < HUGE_CACHE_SLOTS; i++) {
    if (huge_cache[i].seg == NULL) continue;
    cached[n++] = huge_cache[i].seg;
    huge_cache[i].seg = NULL;
  }
  huge_cache_bytes = 0;
  pthread_mutex_unlock(&huge_lock);
  for (int i = 0; i < n; i++) hak_os_unmap(cached[i], cached[i]->map_size);
  return n != 0 || arena_gave;
}

/* Keeps a freed mapping, evicting the oldest if the cache is full. */
static void huge_cache_put(hak_segment_t* seg) {
  if (seg->map_size > HUGE_CACHE_BYTES / 2) {
    hak_os_unmap(seg, seg->map_size);
    return;
  }
  hak_segment_t* evicted[HUGE_CACHE_SLOTS + 1];
  int nevicted = 0;
  pthread_mutex_lock(&huge_lock);
  while (huge_cache_bytes + seg->map_size > HUGE_CACHE_BYTES || huge_cache_full()) {
    int oldest = huge_cache_oldest();
    evicted[nevicted++] = huge_cache[oldest].seg;
    huge_cache_bytes -= huge_cache[oldest].seg->map_size;
    huge_cache[oldest].seg = NULL;
  }
  for (int i = 0; i < HUGE_CACHE_SLOTS; i++) {
    if (huge_cache[i].seg == NULL) {
      huge_cache[i].seg = seg;
      huge_cache[i].freed_ms = hak_now_ms();
      huge_cache_bytes += seg->map_size;
      break;
    }
  }
  pthread_mutex_unlock(&huge_lock);
  for (int i = 0; i < nevicted; i++) hak_os_unmap(evicted[i], evicted[i]->map_size);
}

#define PAGE_UP(x) (((x) + HAK_OS_PAGE - 1) & ~(size_t)(HAK_OS_PAGE - 1))

/* ---- the arena ------------------------------------------------------------
 *
 * Each chunk is one mapping of ARENA_CHUNK bytes (MAP_NORESERVE, 2 MiB
 * aligned), carved in granules of one segment.  Two bitmaps per chunk: free
 * granules, and of those the ones still backed (dirty), each stamped with the
 * time it was freed.  Everything is under huge_lock. */
#define ARENA_GRANULE HAK_SEG_SIZE
#define ARENA_CHUNK ((size_t)256 << 20)
#define ARENA_GRANULES ((unsigned)(ARENA_CHUNK / ARENA_GRANULE)) /* 128 */
#define ARENA_WORDS (ARENA_GRANULES / 64)
#define ARENA_CHUNKS_MAX 64
/* Blocks of more granules (64 MiB) get mappings of their own. */
#define ARENA_RUN_MAX (ARENA_GRANULES / 4)
/* The dirty granules stay within what the most granules ever in use at once
 * (since the last trim) leaves beside those in use now, so that the arena's
 * backed memory does not exceed its peak in use; and within ARENA_DIRTY_MAX.
 * Beyond, the oldest are purged, at frees and at allocations (with a purge
 * delay of -1, none are).  docs/BENCHMARKS.md has the variants measured. */
#define ARENA_DIRTY_MAX ((size_t)1 << 30)

typedef struct arena_chunk_s {
  uint8_t* base; /* NULL: unused slot */
  unsigned free_count;
  uint64_t free[ARENA_WORDS];
  uint64_t dirty[ARENA_WORDS]; /* free and still backed */
  uint64_t unzeroed[ARENA_WORDS]; /* free, purged, but with MADV_FREE: may read as before */
  uint32_t freed_ms[ARENA_GRANULES];
  /* Secure build: the guard pages laid in each granule, which stay when its
   * block is freed so that the next block of the same run finds them in
   * place (laying and lifting a guard splits and merges the chunk's kernel
   * mapping).  Written by the granule's owner, or under the lock when free. */
  uint16_t guard_head[ARENA_GRANULES]; /* the head guard's page (0: none) */
  uint8_t guard_tail[ARENA_GRANULES];  /* the granule's last page is a guard */
} arena_chunk_t;

HAK_BSS_LAST arena_chunk_t hak_arena[ARENA_CHUNKS_MAX];
static unsigned arena_slots;          /* [0, arena_slots) have been used */
static size_t arena_used, arena_used_peak; /* bytes of granules in use, and the most */
static _Atomic bool arena_has_dirty;  /* read unlocked: a purge may be due */
static _Atomic uint32_t arena_oldest_ms; /* the oldest dirty granule's stamp */

/* (Always inlined: huge.c is compiled -Os, which would make it a call in
 * the arena's loops over granules.) */
static inline __attribute__((always_inline)) bool bit_get(const uint64_t* w, unsigned i) {
  return (w[i >> 6] >> (i & 63)) & 1;
}
/* The first granule from i on whose bit is `on` (ARENA_GRANULES if none). */
static unsigned bit_next(const uint64_t* w, unsigned i, bool on) {
  for (; i < ARENA_GRANULES; i = (i | 63) + 1) {
    uint64_t word = (on ? w[i >> 6] : ~w[i >> 6]) & (~(uint64_t)0 << (i & 63));
    if (word != 0) return (i & ~63u) + (unsigned)__builtin_ctzll(word);
  }
  return ARENA_GRANULES;
}

/* The mask of bits [i, stop) within the word of bit i (stop at most its end). */
static inline uint64_t bits_mask(unsigned i, unsigned stop) {
  unsigned width = stop - i;
  return (width == 64 ? ~(uint64_t)0 : ((uint64_t)1 << width) - 1) << (i & 63);
}

/* The end of [i, end) within the word of bit i. */
static inline unsigned bits_stop(unsigned i, unsigned end) { return (i | 63) + 1 < end ? (i | 63) + 1 : end; }

/* The bits set in [i, end). */
static unsigned bits_count(const uint64_t* w, unsigned i, unsigned end) {
  unsigned count = 0;
  for (unsigned stop; i < end; i = stop) {
    stop = bits_stop(i, end);
    count += (unsigned)hak_popcount(w[i >> 6] & bits_mask(i, stop));
  }
  return count;
}

/* Sets bit i + k of w for each bit k of mask. */
static void bits_or(uint64_t* w, unsigned i, uint64_t mask) {
  w[i >> 6] |= mask << (i & 63);
  if ((i & 63) != 0 && (i >> 6) + 1 < ARENA_WORDS) w[(i >> 6) + 1] |= mask >> (64 - (i & 63));
}

static void bits_put(uint64_t* w, unsigned i, unsigned n, bool on) {
  for (unsigned end = i + n, stop; i < end; i = stop) {
    stop = bits_stop(i, end);
    if (on)
      w[i >> 6] |= bits_mask(i, stop);
    else
      w[i >> 6] &= ~bits_mask(i, stop);
  }
}

static void arena_dirty_add(size_t bytes) { arena_dirty += bytes; }
static void arena_dirty_sub(size_t bytes) { arena_dirty -= bytes; }

/* Gives back the memory of n dirty granules from g: one madvise. */
static void arena_purge_run(arena_chunk_t* ch, unsigned g, unsigned n) {
  if (!hak_os_purge(ch->base + (size_t)g * ARENA_GRANULE, (size_t)n * ARENA_GRANULE))
    bits_put(ch->unzeroed, g, n, true);
  bits_put(ch->dirty, g, n, false);
  arena_dirty_sub((size_t)n * ARENA_GRANULE);
}

/* Notes the oldest dirty granule's stamp for hak_huge_purge_if_due. */
static void arena_note_oldest(void) {
  bool any = false;
  uint32_t oldest = 0;
  for (unsigned c = 0; c < arena_slots && arena_dirty != 0; c++) {
    arena_chunk_t* ch = &hak_arena[c];
    if (ch->base == NULL) continue;
    for (unsigned g = 0; g < ARENA_GRANULES; g++)
      if (bit_get(ch->dirty, g) && (!any || (int32_t)(ch->freed_ms[g] - oldest) < 0)) {
        oldest = ch->freed_ms[g];
        any = true;
      }
  }
  atomic_store_explicit(&arena_oldest_ms, oldest, memory_order_relaxed);
  atomic_store_explicit(&arena_has_dirty, any, memory_order_relaxed);
}

/* Purges the dirty granules that have waited the delay (all of them if all),
 * one madvise per run of them. */
static void arena_purge(uint32_t now_ms, bool all) {
  int32_t delay = HAK_POLICY(purge_delay_ms);
  for (unsigned c = 0; c < arena_slots && arena_dirty != 0; c++) {
    arena_chunk_t* ch = &hak_arena[c];
    if (ch->base == NULL) continue;
    for (unsigned g = 0; g < ARENA_GRANULES;) {
      if (!bit_get(ch->dirty, g) || !(all || hak_purge_is_due(ch->freed_ms[g], now_ms, delay))) {
        g++;
        continue;
      }
      unsigned s = g;
      while (g < ARENA_GRANULES && bit_get(ch->dirty, g) && (all || hak_purge_is_due(ch->freed_ms[g], now_ms, delay)))
        g++;
      arena_purge_run(ch, s, g - s);
    }
  }
  arena_note_oldest();
}

/* The dirty bytes allowed now. */
static size_t arena_budget(void) {
  size_t room = arena_used_peak - arena_used;
  return room < ARENA_DIRTY_MAX ? room : ARENA_DIRTY_MAX;
}

/* The dirty granules freed longest ago, [*at, *end) of the chunk returned
 * (a run of those freed together); NULL if none is dirty. */
static arena_chunk_t* arena_oldest_dirty(unsigned* at, unsigned* end) {
  arena_chunk_t* oldest = NULL;
  unsigned first = 0;
  for (unsigned c = 0; c < arena_slots; c++) {
    arena_chunk_t* ch = &hak_arena[c];
    if (ch->base == NULL) continue;
    for (unsigned g = 0; g < ARENA_GRANULES; g++)
      if (bit_get(ch->dirty, g) && (oldest == NULL || (int32_t)(ch->freed_ms[g] - oldest->freed_ms[first]) < 0)) {
        oldest = ch;
        first = g;
      }
  }
  if (oldest == NULL) return NULL;
  unsigned last = first;
  while (last < ARENA_GRANULES && bit_get(oldest->dirty, last) && oldest->freed_ms[last] == oldest->freed_ms[first]) last++;
  *at = first;
  *end = last;
  return oldest;
}

/* Beyond the dirty budget: purges the granules freed longest ago, a run of
 * those freed together at a time (its high end first, no more than the
 * excess). */
static void arena_purge_over(size_t budget) {
  while (arena_dirty > budget) {
    unsigned at, end;
    arena_chunk_t* oldest = arena_oldest_dirty(&at, &end);
    if (oldest == NULL) break;
    size_t excess = (arena_dirty - budget + ARENA_GRANULE - 1) / ARENA_GRANULE;
    unsigned n = end - at < excess ? end - at : (unsigned)excess;
    arena_purge_run(oldest, end - n, n);
  }
}

static void arena_purge_over_budget(void) { arena_purge_over(arena_budget()); }

/* Reserves a chunk; false if the slots are used up or the system refuses
 * (the caller then maps the block on its own). */
static bool arena_grow(unsigned* slot) {
  unsigned c = 0;
  while (c < arena_slots && hak_arena[c].base != NULL) c++;
  if (c == ARENA_CHUNKS_MAX || hak_os_space_limited()) return false;
  uint8_t* base = hak_os_map_aligned(ARENA_CHUNK, ARENA_GRANULE, 0);
  if (base == NULL) return false;
  hak_os_thp(base, ARENA_CHUNK);
  arena_chunk_t* ch = &hak_arena[c];
  memset(ch, 0, sizeof *ch);
  ch->base = base;
  ch->free_count = ARENA_GRANULES;
  bits_put(ch->free, 0, ARENA_GRANULES, true);
  if (c == arena_slots) arena_slots++;
  *slot = c;
  return true;
}

/* The best place for n granules: the window of a free run with the most
 * dirty granules (no page faults), then (secure build) with the most of its
 * guards in place (a head guard at page `head` of its first granule, a tail
 * guard on its last page: no mprotect), then one at an end of its run (the
 * rest stays whole), then in the shortest run (best fit).  False if none. */
static bool arena_find(unsigned n, unsigned head, unsigned* chunk, unsigned* start) {
  bool found = false;
  unsigned best_dirty = 0, best_len = 0, best_guards = 0;
  bool best_edge = false;
  for (unsigned c = 0; c < arena_slots; c++) {
    arena_chunk_t* ch = &hak_arena[c];
    if (ch->base == NULL || ch->free_count < n) continue;
    for (unsigned s = bit_next(ch->free, 0, true), e; s < ARENA_GRANULES; s = bit_next(ch->free, e, true)) {
      e = bit_next(ch->free, s, false);
      unsigned len = e - s;
      if (len < n) continue;
      unsigned d = bits_count(ch->dirty, s, s + n);
      /* Release build: with every dirty granule of the run in its first
       * window, no later window has more, and the first is at an end. */
      bool first_only = !HAK_SECURE && bits_count(ch->dirty, s, e) == d;
      for (unsigned w = s;; w++) {
        bool edge = w == s || w + n == e;
        unsigned guards = HAK_SECURE ? (ch->guard_head[w] == head) + ch->guard_tail[w + n - 1] : 0;
        bool better = !found || d > best_dirty ||
                      (d == best_dirty && (guards > best_guards || (guards == best_guards &&
                      (edge > best_edge || (edge == best_edge && len < best_len)))));
        if (better) {
          found = true;
          best_dirty = d;
          best_guards = guards;
          best_edge = edge;
          best_len = len;
          *chunk = c;
          *start = w;
        }
        /* Nor can one do better than a window all dirty, at an end, with
         * its guards in place (a freed block's own run, the common case). */
        if (w + n == e || first_only || (d == n && edge && (!HAK_SECURE || guards == 2))) break;
        d += (unsigned)bit_get(ch->dirty, w + n) - (unsigned)bit_get(ch->dirty, w);
      }
    }
  }
  return found;
}

/* While the dirty granules are over the budget (they would be purged), the
 * backed pages of the oldest move into the granules of a block just taken
 * at g (n granules, `backed` the mask of those that have pages), one mremap
 * each, instead of being purged while the block's own granules fault in:
 * the same memory given back, without 512 faults a granule.  Returns the
 * mask of the block's granules backed now.  (Not for a block that must
 * read as zero.)  In the secure build a granule's guard markers move with
 * its pages (the destination's own go with its mapping), and so does the
 * record of them, for the block's arena_guard_run to lift or keep; guards
 * made with mprotect split the mapping, which mremap cannot move across. */
static uint64_t arena_fill(arena_chunk_t* ch, unsigned g, unsigned n, uint64_t backed, unsigned* lost) {
  if (HAK_SECURE && !hak_os_guard_marks()) return backed;
  size_t budget = arena_budget();
  /* Not under a limit of address space, where the kernel unmaps the
   * destination before it refuses the move (and mapping it again fails). */
  if (arena_dirty > budget && hak_os_space_limited()) return backed;
  for (unsigned i = 0; i < n && arena_dirty > budget; i++) {
    if (backed >> i & 1) continue;
    unsigned at, end;
    arena_chunk_t* from = arena_oldest_dirty(&at, &end);
    int moved = from == NULL ? 0
                             : hak_os_move_pages(from->base + (size_t)(end - 1) * ARENA_GRANULE,
                                                 ch->base + (size_t)(g + i) * ARENA_GRANULE, ARENA_GRANULE);
    if (moved != 1) {
      if (moved < 0) *lost = i + 1;
#if HAK_SECURE
      if (from != NULL) { /* mapped again: its guard markers went with the old mapping */
        ch->guard_head[g + i] = 0;
        ch->guard_tail[g + i] = 0;
      }
#endif
      break;
    }
    bits_put(from->dirty, end - 1, 1, false);
    arena_dirty_sub(ARENA_GRANULE);
    backed |= (uint64_t)1 << i;
#if HAK_SECURE
    ch->guard_head[g + i] = from->guard_head[end - 1];
    ch->guard_tail[g + i] = from->guard_tail[end - 1];
    from->guard_head[end - 1] = 0;
    from->guard_tail[end - 1] = 0;
#endif
  }
  return backed;
}

/* Takes n free granules from g; returns the mask of those that were dirty
 * (bit i: granule g + i). */
static uint64_t arena_take(arena_chunk_t* ch, unsigned g, unsigned n, uint64_t* unzeroed) {
  uint64_t dirty = 0, stale = 0;
  for (unsigned i = 0; i < n; i++) {
    if (bit_get(ch->dirty, g + i)) dirty |= (uint64_t)1 << i;
    if (bit_get(ch->unzeroed, g + i)) stale |= (uint64_t)1 << i;
  }
  if (unzeroed != NULL) *unzeroed = stale;
  bits_put(ch->free, g, n, false);
  bits_put(ch->dirty, g, n, false);
  bits_put(ch->unzeroed, g, n, false);
  ch->free_count -= n;
  arena_used += (size_t)n * ARENA_GRANULE;
  if (arena_used > arena_used_peak) arena_used_peak = arena_used;
  arena_dirty_sub((size_t)hak_popcount(dirty) * ARENA_GRANULE);
  return dirty;
}

/* Makes guard pages of the arena accessible again.  Removing guard markers
 * frees page-table entries; with mprotect, the range starts and ends at
 * guards (or inside accessible pages), so it only joins the kernel's
 * mappings and needs none: failing is not running out of memory. */
static void arena_guard_lift(uint8_t* p, size_t size) {
  if (!hak_os_guard_unmark(p, size)) hak_fatal("cannot lift a guard page of the huge-block arena", p);
}

/* Secure build: the guards earlier blocks left in granules [a, b] of ch,
 * but a's head guard and b's tail guard. */
static unsigned arena_guards_inside(const arena_chunk_t* ch, unsigned a, unsigned b) {
  unsigned count = 0;
  for (unsigned k = a; k <= b; k++) count += (k != a && ch->guard_head[k] != 0) + (k != b && ch->guard_tail[k] != 0);
  return count;
}

/* Lifts those: each marker (removing them from a range walks its every
 * page), or with one mprotect from a's head guard to b's tail guard. */
static void arena_guards_lift_inside(arena_chunk_t* ch, unsigned a, unsigned b) {
  bool marks = hak_os_guard_marks();
  if (!marks) {
    uint8_t* lo = ch->base + (size_t)a * ARENA_GRANULE + ((size_t)ch->guard_head[a] + 1) * HAK_OS_PAGE;
    uint8_t* hi = ch->base + (size_t)(b + 1) * ARENA_GRANULE - (ch->guard_tail[b] ? HAK_OS_PAGE : 0);
    arena_guard_lift(lo, (size_t)(hi - lo));
  }
  for (unsigned k = a; k <= b; k++) {
    uint8_t* granule = ch->base + (size_t)k * ARENA_GRANULE;
    if (k != a && ch->guard_head[k] != 0) {
      if (marks) arena_guard_lift(granule + (size_t)ch->guard_head[k] * HAK_OS_PAGE, HAK_OS_PAGE);
      ch->guard_head[k] = 0;
    }
    if (k != b && ch->guard_tail[k]) {
      if (marks) arena_guard_lift(granule + ARENA_GRANULE - HAK_OS_PAGE, HAK_OS_PAGE);
      ch->guard_tail[k] = 0;
    }
  }
}

/* Lifts the guards inside the free run around granule g beyond the
 * HAK_ARENA_GUARDS_KEPT kept (under the lock).  Guard markers do not split
 * the mapping: they all stay. */
static void arena_guards_trim(arena_chunk_t* ch, unsigned g) {
  if (!HAK_SECURE || hak_os_guard_marks()) return;
  unsigned a = g, b = g;
  while (a > 0 && bit_get(ch->free, a - 1)) a--;
  while (b + 1 < ARENA_GRANULES && bit_get(ch->free, b + 1)) b++;
  if (arena_guards_inside(ch, a, b) > HAK_ARENA_GUARDS_KEPT) arena_guards_lift_inside(ch, a, b);
}

/* Gives n granules from g back, those of the mask `backed` dirty (bit i:
 * granule g + i has pages; the others were purged or never backed), stamped
 * now; purges them at once with a delay of 0, and beyond the budget the
 * oldest. */
static void arena_give_some(arena_chunk_t* ch, unsigned g, unsigned n, uint64_t backed) {
  uint32_t now = hak_now_ms();
  if (n < 64) backed &= ((uint64_t)1 << n) - 1;
  bits_put(ch->free, g, n, true);
  bits_or(ch->dirty, g, backed);
  for (unsigned i = 0; i < n; i++) ch->freed_ms[g + i] = now;
  ch->free_count += n;
  arena_used -= (size_t)n * ARENA_GRANULE;
  arena_guards_trim(ch, g);
  arena_dirty_add((size_t)hak_popcount(backed) * ARENA_GRANULE);
  int32_t delay = HAK_POLICY(purge_delay_ms);
  if (delay == 0) {
    for (unsigned i = 0, end; i < n; i = end + 1) { /* each run of backed granules, one madvise */
      for (end = i; end < n && (backed >> end & 1); end++) {
      }
      if (end > i) arena_purge_run(ch, g + i, end - i);
    }
  } else if (delay > 0) {
    arena_purge_over_budget();
    if (!atomic_load_explicit(&arena_has_dirty, memory_order_relaxed) ||
        hak_purge_is_due(atomic_load_explicit(&arena_oldest_ms, memory_order_relaxed), now, delay))
      arena_purge(now, false); /* (notes the oldest) */
  }
}

static void arena_give(arena_chunk_t* ch, unsigned g, unsigned n) { arena_give_some(ch, g, n, ~(uint64_t)0); }

/* The segments grow past the most they ever held: the arena's dirty
 * granules are purged down to the room the process's peak of committed
 * memory leaves (hak_committed_headroom), so that memory a huge block gave
 * back and the segments' new memory are not both resident (sort frees its
 * 8 MiB buffer and allocates its merge buffers at once: 17 MB of peak RSS
 * against glibc's 10 MB).  The arena's own budget weighs only its own peak.
 * Not at every segment taken: where segments come and go below their peak
 * (big's blocks under 1 MiB), the purges bought no RSS and cost faults. */
void hak_huge_purge_for_growth(void) {
  if (!atomic_load_explicit(&arena_has_dirty, memory_order_relaxed) || HAK_POLICY(purge_delay_ms) <= 0) return;
  size_t headroom = hak_committed_headroom();
  pthread_mutex_lock(&huge_lock);
  size_t budget = arena_budget();
  arena_purge_over(headroom < budget ? headroom : budget);
  arena_note_oldest(); /* (arena_has_dirty false once none is left) */
  pthread_mutex_unlock(&huge_lock);
}

/* A new segment, while the arena holds granules backed and free and no
 * block (where huge blocks still come and go, it reuses its granules
 * itself: taking them cost big 3.7% more faults and 1 MiB of peak RSS): the
 * one freed longest ago (the first of its run: a block's last granule may
 * hold only a page of it) leaves the arena for good and becomes the segment,
 * pages and all, its header cleared and the rest of its unit 0 purged (in
 * the secure build, guarded).  Otherwise both would be resident: the memory
 * a huge block gave back, waiting for its delay, and the segments' new
 * memory (sort -S 8M frees its 8 MiB buffer and allocates its merge buffers
 * at once: 11.4 MB of peak RSS against glibc's 9.8 MB).  Taken in place, not
 * moved into a segment carved elsewhere: a move split that segment's kernel
 * mapping for good, two more mappings a segment, and its huge page.  The
 * segment's units read as what the block held.  The secure build takes the
 * first granule of the run that carries no guard page.  NULL if none. */
hak_segment_t* hak_huge_take_granule(void) {
  if (!atomic_load_explicit(&arena_has_dirty, memory_order_relaxed) || HAK_POLICY(purge_delay_ms) <= 0) return NULL;
  if (HAK_SECURE && !hak_os_guard_marks()) return NULL; /* an mprotect guard splits the chunk's mapping */
  /* A taken granule keeps its chunk mapped for good: not under a limit of
   * address space, where malloc_trim and a refused mapping unmap chunks. */
  if (hak_os_space_limited()) return NULL;
  hak_segment_t* seg = NULL;
  pthread_mutex_lock(&huge_lock);
  unsigned at, end;
  arena_chunk_t* from = arena_used == 0 ? arena_oldest_dirty(&at, &end) : NULL;
  if (from != NULL) {
    unsigned g = at;
#if HAK_SECURE
    while (g < end && (from->guard_head[g] != 0 || from->guard_tail[g])) g++;
#endif
    uint8_t* granule = from->base + (size_t)g * ARENA_GRANULE;
    uint8_t* after_header = granule + HAK_SEG_HDR_SIZE; /* the rest of unit 0, no page's */
    bool ready = g < end;
    if (ready && HAK_SECURE)
      ready = hak_os_guard_mark(after_header, HAK_UNIT_SIZE - HAK_SEG_HDR_SIZE);
    else if (ready)
      hak_os_purge(after_header, HAK_UNIT_SIZE - HAK_SEG_HDR_SIZE);
    if (ready) {
      bits_put(from->free, g, 1, false);
      bits_put(from->dirty, g, 1, false);
      from->free_count--;
      arena_dirty_sub(ARENA_GRANULE);
      arena_note_oldest();
      HAK_VG_UNDEFINED(granule, ARENA_GRANULE); /* (perhaps inside a block freed before) */
      memset(granule, 0, HAK_SEG_HDR_SIZE);
      seg = (hak_segment_t*)granule;
    }
  }
  pthread_mutex_unlock(&huge_lock);
  return seg;
}

void hak_huge_purge_if_due(uint32_t now_ms) {
  if (!atomic_load_explicit(&arena_has_dirty, memory_order_relaxed)) return;
  if (!hak_purge_is_due(atomic_load_explicit(&arena_oldest_ms, memory_order_relaxed), now_ms,
                    HAK_POLICY(purge_delay_ms)))
    return;
  pthread_mutex_lock(&huge_lock);
  arena_purge(now_ms, false);
  pthread_mutex_unlock(&huge_lock);
}

/* The process-wide caches' memory that has waited the delay: free segments
 * and the arena's granules. */
void hak_caches_purge_if_due(uint32_t now_ms) {
  hak_segment_cache_purge(now_ms, false);
  hak_huge_purge_if_due(now_ms);
}

/* Purges every dirty granule and unmaps the chunks with nothing in use
 * (malloc_trim, and a mapping that failed).  Returns whether it gave back
 * anything. */
static bool arena_flush(void) {
  uint8_t* unmap[ARENA_CHUNKS_MAX];
  unsigned nunmap = 0;
  pthread_mutex_lock(&huge_lock);
  bool any = arena_dirty != 0;
  for (unsigned c = 0; c < arena_slots; c++) {
    arena_chunk_t* ch = &hak_arena[c];
    if (ch->base == NULL || ch->free_count != ARENA_GRANULES) continue;
    unmap[nunmap++] = ch->base;
    arena_dirty_sub((size_t)bits_count(ch->dirty, 0, ARENA_GRANULES) * ARENA_GRANULE);
    ch->base = NULL;
  }
  arena_purge(0, true);
  arena_used_peak = arena_used; /* a new start for the budget */
  hak_committed_peak_restart();
  pthread_mutex_unlock(&huge_lock);
  for (unsigned i = 0; i < nunmap; i++) hak_os_unmap(unmap[i], ARENA_CHUNK);
  return any || nunmap != 0;
}

void hak_huge_arena_info(size_t* reserved, size_t* dirty_bytes, size_t* free_bytes) {
  pthread_mutex_lock(&huge_lock);
  size_t n = 0, fb = 0;
  for (unsigned c = 0; c < arena_slots; c++)
    if (hak_arena[c].base != NULL) {
      n++;
      fb += (size_t)hak_arena[c].free_count * ARENA_GRANULE;
    }
  *reserved = n * ARENA_CHUNK;
  *dirty_bytes = arena_dirty;
  *free_bytes = fb;
  pthread_mutex_unlock(&huge_lock);
}

/* For the report of a free hakmem finds no block for: whether p lies in a
 * free granule of the arena (a huge block freed already, freed again). */
bool hak_huge_arena_free_at(const void* p) {
  bool free_granule = false;
  pthread_mutex_lock(&huge_lock);
  for (unsigned c = 0; c < arena_slots; c++) {
    const arena_chunk_t* ch = &hak_arena[c];
    if (ch->base == NULL || (const uint8_t*)p < ch->base || (const uint8_t*)p >= ch->base + ARENA_CHUNK) continue;
    free_granule = bit_get(ch->free, (unsigned)(((const uint8_t*)p - ch->base) / ARENA_GRANULE));
    break;
  }
  pthread_mutex_unlock(&huge_lock);
  return free_granule;
}

/* The secure build puts a guard page before the block (after the header)
 * and one after it, at the end of the mapping. */
#define HUGE_GUARD (HAK_SECURE ? (size_t)HAK_OS_PAGE : 0)
/* The offset of a block without alignment, the only kind cached. */
#define HUGE_PLAIN_OFFSET (HAK_SEG_HDR_SIZE + HUGE_GUARD)

/* Distance from the header to the block: the header page, or the alignment.
 * An alignment of 2 MiB or more puts the block exactly one segment above the
 * header, and the segment map marks the block's unit HAK_MAP_HUGE_ABOVE. */
static size_t huge_offset(size_t align) {
  if (align <= HUGE_PLAIN_OFFSET) return HUGE_PLAIN_OFFSET;
  if (align < HAK_SEG_SIZE) return align;
  return HAK_SEG_SIZE;
}

/* Lays the guard pages of the secure build around a block at off in a
 * mapping of total bytes. */
static bool huge_guard(hak_segment_t* seg, size_t off, size_t total) {
  if (!HAK_SECURE) return true;
  seg->huge_guard_page = (uint32_t)(total / HAK_OS_PAGE) - 1;
  return hak_os_guard((uint8_t*)seg + off - HUGE_GUARD, HUGE_GUARD) &&
         hak_os_guard((uint8_t*)seg + total - HUGE_GUARD, HUGE_GUARD);
}

/* Moves the guard after the block of a reused mapping to end the block at
 * total bytes, the pages beyond kept backed as the release build keeps them. */
static bool huge_guard_tail(hak_segment_t* seg, size_t total) {
  size_t at = total - HUGE_GUARD, old = (size_t)seg->huge_guard_page * HAK_OS_PAGE;
  if (at == old) return true;
  if (old + HUGE_GUARD <= seg->map_size && !hak_os_unguard((uint8_t*)seg + old, HUGE_GUARD)) return false;
  seg->huge_guard_page = (uint32_t)(at / HAK_OS_PAGE);
  return hak_os_guard((uint8_t*)seg + at, HUGE_GUARD);
}

/* Where a huge block's usable bytes end: its tail guard in the secure build
 * (in the arena, the run's last page), else its mapping's end (with the
 * kept tail). */
static size_t huge_usable_end(const hak_segment_t* seg) {
  return HAK_SECURE ? (size_t)seg->huge_guard_page * HAK_OS_PAGE : seg->map_size;
}

/* Enters a huge block in the segment map (and the live counts), or takes it out. */
static void huge_map(hak_segment_t* seg, bool on) {
  hak_segmap_set(seg, on ? HAK_MAP_SEGMENT : HAK_MAP_NONE);
  if (seg->huge_off == HAK_SEG_SIZE)
    hak_segmap_set((uint8_t*)seg + HAK_SEG_SIZE, on ? HAK_MAP_HUGE_ABOVE : HAK_MAP_NONE);
  if (on) {
    hak_count(huge_live, 1);
    hak_count(huge_live_bytes, seg->map_size);
    hak_committed_add(0); /* a new peak, perhaps */
  } else {
    hak_uncount(huge_live, 1);
    hak_uncount(huge_live_bytes, seg->map_size);
  }
}

/* A mapping of total bytes whose header is 2 MiB aligned and whose block
 * (one segment above it when align exceeds 2 MiB) is aligned to align. */
static uint8_t* huge_map_aligned(size_t total, size_t align) {
  return align <= HAK_SEG_SIZE ? hak_os_map_aligned(total, HAK_SEG_SIZE, 0)
                               : hak_os_map_aligned(total, align, HAK_SEG_SIZE);
}

/* Secure build: gives a block holding granules [g, g + n) of ch its guards,
 * the page before the block and the run's last page (often still in place
 * from an earlier block of the run), then lifts the ones earlier blocks
 * left inside.  False if the kernel refuses a guard (its mapping limit);
 * the guards are then as they were. */
static bool arena_guard_run(hak_segment_t* seg, arena_chunk_t* ch, unsigned g, unsigned n) {
  if (!HAK_SECURE) return true;
  uint8_t* run = ch->base + (size_t)g * ARENA_GRANULE;
  unsigned end = g + n - 1;
  uint8_t* tail = run + (size_t)n * ARENA_GRANULE - HAK_OS_PAGE;
  uint16_t head = (uint16_t)((seg->huge_off - HUGE_GUARD) / HAK_OS_PAGE), old_head = ch->guard_head[g];
  if (old_head != head && !hak_os_guard_mark(run + (size_t)head * HAK_OS_PAGE, HAK_OS_PAGE)) return false;
  if (!ch->guard_tail[end] && !hak_os_guard_mark(tail, HAK_OS_PAGE)) {
    if (old_head != head) arena_guard_lift(run + (size_t)head * HAK_OS_PAGE, HAK_OS_PAGE);
    return false;
  }
  if (old_head != 0 && old_head != head) arena_guard_lift(run + (size_t)old_head * HAK_OS_PAGE, HAK_OS_PAGE);
  ch->guard_head[g] = head;
  ch->guard_tail[end] = 1;
  if (arena_guards_inside(ch, g, end) != 0) arena_guards_lift_inside(ch, g, end);
  seg->huge_guard_page = (uint32_t)((size_t)(tail - (uint8_t*)seg) / HAK_OS_PAGE);
  return true;
}

/* A block from the arena: header at the start of a run of granules, block at
 * off, needing total bytes.  NULL if the arena cannot serve it (the caller
 * maps it on its own). */
static void* arena_alloc(size_t off, size_t size, size_t total, bool zero) {
  size_t runs = (total + ARENA_GRANULE - 1) / ARENA_GRANULE;
  if (runs > ARENA_RUN_MAX) return NULL;
  unsigned n = (unsigned)runs, c, g;
  pthread_mutex_lock(&huge_lock);
  if (!arena_find(n, (unsigned)((off - HUGE_GUARD) / HAK_OS_PAGE), &c, &g)) {
    if (!arena_grow(&c)) {
      pthread_mutex_unlock(&huge_lock);
      return NULL;
    }
    g = 0;
  }
  arena_chunk_t* ch = &hak_arena[c];
  uint64_t unzeroed;
  uint64_t dirty = arena_take(ch, g, n, &unzeroed);
  int32_t delay = HAK_POLICY(purge_delay_ms);
  unsigned lost = 0;
  if (delay > 0 && !zero) dirty = arena_fill(ch, g, n, dirty | unzeroed, &lost);
  if (lost != 0) {
    /* A granule of the run is no longer mapped (arena_fill): it stays taken
     * for good, out of use; the others go back as they are now (moved pages
     * and all), and the block is made elsewhere or refused. */
    if (lost > 1) arena_give_some(ch, g, lost - 1, dirty);
    if (lost < n) arena_give_some(ch, g + lost, n - lost, dirty >> lost);
    pthread_mutex_unlock(&huge_lock);
    return NULL;
  }
  if (delay > 0) {
    arena_purge_over_budget();
    uint32_t now = hak_now_ms();
    if (atomic_load_explicit(&arena_has_dirty, memory_order_relaxed) &&
        hak_purge_is_due(atomic_load_explicit(&arena_oldest_ms, memory_order_relaxed), now, delay))
      arena_purge(now, false);
  }
  uint8_t* base = ch->base + (size_t)g * ARENA_GRANULE;
  pthread_mutex_unlock(&huge_lock);
  hak_segment_t* seg = (hak_segment_t*)base;
  HAK_VG_UNDEFINED(seg, HAK_SEG_HDR_SIZE); /* perhaps inside a block freed before */
  memset(seg, 0, 64); /* the header's first line: whatever was here before */
  memset(seg->pages, 0, sizeof seg->pages); /* free's fast path reads them: no page, no owner */
  seg->kind = HAK_SEG_HUGE;
  seg->map_size = total;
  seg->huge_off = (uint32_t)off;
  seg->huge_run = n;
  seg->huge_chunk = c;
  if (!arena_guard_run(seg, ch, g, n)) {
    pthread_mutex_lock(&huge_lock);
    arena_give(ch, g, n);
    pthread_mutex_unlock(&huge_lock);
    return NULL;
  }
  if (zero) {
    /* Granules never used, or purged with MADV_DONTNEED, read as zero; those
     * still backed, or purged with MADV_FREE (the purge mode is an option a
     * program may change), may not. */
    uint8_t *block = base + off, *lo = NULL, *hi = NULL; /* the run of such granules pending */
    for (unsigned i = 0; i <= n; i++) {
      if (i < n && ((dirty | unzeroed) >> i & 1)) {
        if (lo == NULL) lo = base + (size_t)i * ARENA_GRANULE;
        hi = base + (size_t)(i + 1) * ARENA_GRANULE;
        continue;
      }
      if (lo == NULL) continue;
      if (lo < block) lo = block;
      if (hi > block + size) hi = block + size;
      if (lo < hi) {
        HAK_VG_UNDEFINED(lo, (size_t)(hi - lo));
        hak_os_zero(lo, (size_t)(hi - lo));
      }
      lo = NULL;
    }
  }
  huge_map(seg, true);
  hak_count(huge_allocs, 1);
  return base + off;
}

/* Gives an arena block's granules back. */
static void arena_free(hak_segment_t* seg) {
  arena_chunk_t* ch = &hak_arena[seg->huge_chunk];
  unsigned g = (unsigned)(((uint8_t*)seg - ch->base) / ARENA_GRANULE), n = seg->huge_run;
  pthread_mutex_lock(&huge_lock);
  arena_give(ch, g, n);
  pthread_mutex_unlock(&huge_lock);
}

/* Resizes an arena block in place: within its run, or over the free granules
 * after it (shrinking gives the granules it no longer needs back).  False if
 * the granules after it are not free. */
static bool arena_resize(hak_segment_t* seg, size_t total) {
  size_t runs = (total + ARENA_GRANULE - 1) / ARENA_GRANULE;
  unsigned n = seg->huge_run;
  arena_chunk_t* ch = &hak_arena[seg->huge_chunk];
  unsigned g = (unsigned)(((uint8_t*)seg - ch->base) / ARENA_GRANULE);
  if (runs > n) {
    if (runs > ARENA_RUN_MAX || g + runs > ARENA_GRANULES) return false;
    pthread_mutex_lock(&huge_lock);
    bool room = bits_count(ch->free, g + n, (unsigned)runs + g) == runs - n;
    if (room) arena_take(ch, g + n, (unsigned)runs - n, NULL);
    pthread_mutex_unlock(&huge_lock);
    if (!room) return false;
    if (!arena_guard_run(seg, ch, g, (unsigned)runs)) {
      pthread_mutex_lock(&huge_lock);
      arena_give(ch, g + n, (unsigned)runs - n);
      pthread_mutex_unlock(&huge_lock);
      return false;
    }
  } else if (runs < n) {
    if (!arena_guard_run(seg, ch, g, (unsigned)runs)) return true; /* it keeps its granules */
    pthread_mutex_lock(&huge_lock);
    arena_give(ch, g + (unsigned)runs, n - (unsigned)runs);
    pthread_mutex_unlock(&huge_lock);
  }
  seg->huge_run = (uint32_t)runs;
  if (total > seg->map_size) {
    hak_count(huge_live_bytes, total - seg->map_size);
    hak_committed_add(0); /* a new peak, perhaps */
  } else {
    hak_uncount(huge_live_bytes, seg->map_size - total);
  }
  seg->map_size = total;
  return true;
}

/* Granules of a moving block copied between two purges of its old place. */
#define ARENA_MOVE_BATCH 4

/* Moves an arena block that cannot grow in place to a new run: copies it a
 * granule at a time and purges its old granules as they are copied (but the
 * header's), so that the move does not hold both copies resident.  NULL if
 * the arena cannot serve the new size (the caller copies). */
static void* arena_move(hak_segment_t* seg, size_t off, size_t size, size_t total) {
  pthread_mutex_lock(&huge_lock);
  size_t peak = arena_used_peak;
  pthread_mutex_unlock(&huge_lock);
  uint8_t* q = arena_alloc(off, size, total, false);
  if (q == NULL) return NULL;
  uint8_t* base = (uint8_t*)seg;
  size_t end = huge_usable_end(seg);
  unsigned n = seg->huge_run, pending = 0;
  bool zeroed = true; /* every purge of the old place left it reading as zero */
  /* The two places are never backed at once: the peak in use is what it was
   * before, or what is in use without the old place, and the dirty granules
   * beyond what that leaves go before the copy faults in the new place. */
  pthread_mutex_lock(&huge_lock);
  size_t without = arena_used - (size_t)n * ARENA_GRANULE;
  arena_used_peak = peak > without ? peak : without;
  if (HAK_POLICY(purge_delay_ms) > 0) arena_purge_over_budget();
  pthread_mutex_unlock(&huge_lock);
  for (unsigned i = 0; i < n; i++) {
    size_t lo = i == 0 ? off : (size_t)i * ARENA_GRANULE, hi = (size_t)(i + 1) * ARENA_GRANULE;
    if (hi > end) hi = end;
    if (lo < hi) {
      HAK_VG_UNDEFINED(q + (lo - off), hi - lo); /* perhaps inside a block freed before */
      memcpy(q + (lo - off), base + lo, hi - lo);
    }
    if (i == 0) continue;
    if (++pending == ARENA_MOVE_BATCH || i + 1 == n) {
      zeroed &= hak_os_purge(base + (size_t)(i + 1 - pending) * ARENA_GRANULE, (size_t)pending * ARENA_GRANULE);
      pending = 0;
    }
  }
  huge_map(seg, false);
  arena_chunk_t* ch = &hak_arena[seg->huge_chunk];
  unsigned g = (unsigned)((base - ch->base) / ARENA_GRANULE);
  pthread_mutex_lock(&huge_lock);
  arena_give_some(ch, g, n, 1);
  if (!zeroed && n > 1) bits_put(ch->unzeroed, g + 1, n - 1, true);
  pthread_mutex_unlock(&huge_lock);
  return q;
}

#if HAK_SECURE
/* Grows a guarded cached mapping to total bytes without faulting its backed
 * pages in anew.  Guarded, it is several kernel mappings (header, head guard,
 * block, tail guard, perhaps a kept tail after it), which one mremap cannot
 * resize: the last of them is grown in place if the addresses after it are
 * free, else the block's pages are moved (and grown) to a new mapping, the
 * header copied there; then the tail guard is laid at the new end.  NULL if
 * it could not (the mapping is then gone). */
static hak_segment_t* huge_grow_guarded(hak_segment_t* seg, size_t total) {
  uint8_t* base = (uint8_t*)seg;
  size_t guard_at = (size_t)seg->huge_guard_page * HAK_OS_PAGE, old_size = seg->map_size;
  size_t last = guard_at + HUGE_GUARD < old_size ? guard_at + HUGE_GUARD : guard_at;
  if (hak_os_remap(base + last, old_size - last, total - last, NULL) != NULL) {
    seg->map_size = total;
    if (!hak_os_unguard(base + guard_at, total - HUGE_GUARD - guard_at)) goto fail;
  } else {
    /* The old tail guard made accessible first joins the block and the
     * kept tail after it into one mapping, all of it moved, and grown to
     * include the new tail guard: the kernel joins the pieces of one
     * mapping again when they have the same protection (as when a later
     * reuse moves the guard), not those of two. */
    size_t off = HUGE_PLAIN_OFFSET;
    if (!hak_os_unguard(base + guard_at, HUGE_GUARD)) goto fail;
    uint8_t* dest = hak_os_map_aligned(total, HAK_SEG_SIZE, 0);
    if (dest == NULL) goto fail;
    if (hak_os_remap(base + off, old_size - off, total - off, dest + off) == NULL) {
      hak_os_unmap(dest, total); /* (the old pages stay where they were) */
      goto fail;
    }
    memcpy(dest, base, sizeof(hak_segment_t));
    hak_os_unmap(base, off); /* what is left of the old one: header and head guard */
    base = dest;
    seg = (hak_segment_t*)dest;
    seg->map_size = total;
    if (!hak_os_guard(base + off - HUGE_GUARD, HUGE_GUARD)) goto fail;
  }
  seg->huge_guard_page = (uint32_t)((total - HUGE_GUARD) / HAK_OS_PAGE);
  if (!hak_os_guard(base + total - HUGE_GUARD, HUGE_GUARD)) goto fail;
  return seg;
fail:
  hak_os_unmap(seg, seg->map_size);
  return NULL;
}
#endif

/* Fits a cached mapping to total bytes: keeps the backed tail of a larger one
 * (within HUGE_SPARE_MAX) or trims it, grows a smaller one in place or moves
 * it with mremap, and moves the secure build's tail guard.  NULL if it could
 * not (the mapping is then gone). */
static hak_segment_t* huge_fit_cached(hak_segment_t* seg, size_t total) {
  if (seg->map_size >= total) {
    size_t tail = seg->map_size - total; /* (0: nothing to keep or trim) */
    if (atomic_fetch_add_explicit(&huge_spare_bytes, tail, memory_order_relaxed) + tail <= HUGE_SPARE_MAX) {
      seg->huge_spare_pages = (uint32_t)(tail / HAK_OS_PAGE);
    } else {
      atomic_fetch_sub_explicit(&huge_spare_bytes, tail, memory_order_relaxed);
      hak_os_unmap((uint8_t*)seg + total, tail);
      seg->map_size = total;
    }
    /* The secure build's guard after the block moves to its new end (also
     * where a kept tail left it elsewhere). */
    if (HAK_SECURE && !huge_guard_tail(seg, total)) {
      huge_spare_forget(seg);
      hak_os_unmap(seg, seg->map_size);
      return NULL;
    }
    return seg;
  }
#if HAK_SECURE
  return huge_grow_guarded(seg, total);
#endif
  if (hak_os_remap(seg, seg->map_size, total, NULL) == NULL) {
    uint8_t* dest = hak_os_map_aligned(total, HAK_SEG_SIZE, 0);
    if (dest == NULL || hak_os_remap(seg, seg->map_size, total, dest) == NULL) {
      if (dest != NULL) hak_os_unmap(dest, total);
      hak_os_unmap(seg, seg->map_size);
      return NULL;
    }
    seg = (hak_segment_t*)dest;
  }
  seg->map_size = total;
  return seg;
}

void* hak_huge_alloc(size_t size, size_t align, bool zero) {
  if (size > HAK_SIZE_LIMIT || align > HAK_SIZE_LIMIT) {
    errno = ENOMEM;
    return NULL;
  }
  size_t off = huge_offset(align);
  /* (A block of 0 bytes gets a page: aligned to 2 MiB or more, its address
   * is a segment past its header, and would otherwise lie past its mapping.) */
  size_t total = PAGE_UP(off + (size != 0 ? size : 1)) + HUGE_GUARD;
  if (off < HAK_SEG_SIZE) {
    void* p = arena_alloc(off, size, total, zero);
    if (p != NULL) return p;
  }
  if (off == HUGE_PLAIN_OFFSET) {
    hak_segment_t* seg = huge_cache_take(total);
    if (seg != NULL) seg = huge_fit_cached(seg, total);
    if (seg != NULL) {
      seg->huge_off = (uint32_t)off;
      if (zero) {
        HAK_VG_UNDEFINED((uint8_t*)seg + off, size); /* freed: inaccessible to memcheck */
        hak_os_zero((uint8_t*)seg + off, size);
      }
      huge_map(seg, true);
      return (uint8_t*)seg + off;
    }
  }
  /* A mapping of its own: the arena's and the segment cache's memory that
   * has waited the delay goes first (a program past its arena phase, using
   * only blocks above 64 MiB, kept it all: a review found 400 MB). */
  hak_caches_purge_if_due(hak_now_ms());
  /* The header sits on a 2 MiB boundary; with a larger alignment, that
   * boundary is one segment below an aligned address.  The mapping kept is
   * at most size + alignment (plus a page of rounding). */
  uint8_t* base = huge_map_aligned(total, align);
  if (base == NULL && hak_huge_cache_flush()) base = huge_map_aligned(total, align);
  if (base == NULL && hak_segment_cache_unmap()) base = huge_map_aligned(total, align);
  if (base == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  if (!huge_guard((hak_segment_t*)base, off, total)) {
    hak_os_unmap(base, total);
    errno = ENOMEM;
    return NULL;
  }
  hak_os_thp(base, total);
  hak_segment_t* seg = (hak_segment_t*)base;
  seg->kind = HAK_SEG_HUGE;
  seg->map_size = total;
  seg->huge_off = (uint32_t)off;
  huge_map(seg, true);
  hak_count(huge_allocs, 1);
  return base + off;
}

void hak_huge_free(hak_segment_t* seg) {
  huge_map(seg, false);
  if (seg->huge_run != 0) {
    arena_free(seg);
    return;
  }
  huge_spare_forget(seg);
  if (seg->huge_off == HUGE_PLAIN_OFFSET)
    huge_cache_put(seg);
  else
    hak_os_unmap(seg, seg->map_size);
}

size_t hak_huge_usable(hak_segment_t* seg, const void* p) {
  return (size_t)((uint8_t*)seg + huge_usable_end(seg) - (const uint8_t*)p);
}

/* Resizes a huge block without copying when it can: shrink in place, grow in
 * place, or move the pages to a new 2 MiB-aligned place.  NULL means the
 * caller must allocate and copy (or that memory is exhausted). */
void* hak_huge_realloc(hak_segment_t* seg, void* p, size_t size) {
  if ((uint8_t*)p != (uint8_t*)seg + seg->huge_off) hak_fatal("realloc of an invalid pointer (inside a huge block)", p);
  uint8_t* base = (uint8_t*)seg;
  if (size <= HAK_LARGE_MAX || size > HAK_SIZE_LIMIT) return NULL;
  size_t off = (size_t)((uint8_t*)p - base);
  if (seg->huge_run != 0) {
    size_t total = PAGE_UP(off + size) + HUGE_GUARD;
    if (total == seg->map_size) return p;
    return arena_resize(seg, total) ? p : arena_move(seg, off, size, total);
  }
  if (HAK_SECURE) return NULL; /* a guarded mapping is not one mapping mremap can move */
  huge_spare_forget(seg); /* the mapping is fitted to the new size below */
  size_t old_total = seg->map_size;
  size_t total = PAGE_UP(off + size);
  if (total == old_total) return p;
  if (total < old_total || hak_os_remap(base, old_total, total, NULL) != NULL) {
    if (total < old_total) hak_os_unmap(base + total, old_total - total);
    seg->map_size = total;
    if (total > old_total) {
      hak_count(huge_live_bytes, total - old_total);
      hak_committed_add(0); /* a new peak, perhaps */
    } else
      hak_uncount(huge_live_bytes, old_total - total);
    return p;
  }
  uint8_t* dest = hak_os_map_aligned(total, HAK_SEG_SIZE, 0);
  if (dest == NULL) return NULL;
  huge_map(seg, false);
  if (hak_os_remap(base, old_total, total, dest) == NULL) {
    huge_map(seg, true);
    hak_os_unmap(dest, total);
    return NULL;
  }
  seg = (hak_segment_t*)dest;
  seg->map_size = total;
  huge_map(seg, true);
  return dest + off;
}
