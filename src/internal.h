/* hakmem internals: types, constants and the inline fast paths.
 *
 * Memory comes in 2 MiB segments aligned to 2 MiB, each split into 32 units
 * of 64 KiB.  A page is a run of one or more units holding blocks of one size
 * class; its descriptor sits in the segment header, so pointer -> segment is a
 * mask and segment -> page an index.  Each segment belongs to one heap; each
 * thread has one heap.  See docs/DESIGN.md for the whole picture.
 */
#ifndef HAK_INTERNAL_H
#define HAK_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hakmem.h"

/* glibc 2.32 and later say whether the process has had a second thread
 * (hak_fork_watch); elsewhere the fork handlers are registered at start. */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
#include <sys/single_threaded.h>
#define HAK_LAZY_FORK_HANDLERS 1
#else
#define HAK_LAZY_FORK_HANDLERS 0
#endif

#define HAK_API __attribute__((visibility("default")))
/* A public entry point on a path the benchmarks time: it starts a cache
 * line, so that its speed does not move with the size of the code before it
 * (a 16-byte shift of realloc's cost realloc growth 5%; docs/BENCHMARKS.md). */
#define HAK_ENTRY HAK_API __attribute__((aligned(64)))
#define HAK_INLINE static inline __attribute__((always_inline))
#define HAK_NOINLINE __attribute__((noinline))
#define HAK_COLD __attribute__((noinline, cold))
/* Big zero-initialized tables touched sparsely or seldom (the segment map,
 * the huge-block arena's chunks, the profiler's stacks, the statistics
 * baseline, the dead and global heaps, the option paths): as common symbols
 * they go after every other .bss variable, so that the small globals every
 * process touches share two pages instead of lying in four between them
 * (peak RSS; docs/BENCHMARKS.md).  Common needs external linkage:
 * hak_-prefixed names. */
#define HAK_BSS_LAST __attribute__((common))

/* Bits set in x.  The baseline x86-64 target has no popcnt instruction, and
 * __builtin_popcount would call libgcc's table-driven routine from the
 * segment and arena paths; this is a few shifts and one multiply, inline. */
HAK_INLINE unsigned hak_popcount(uint64_t x) {
  x -= (x >> 1) & 0x5555555555555555ull;
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return (unsigned)((x * 0x0101010101010101ull) >> 56);
}
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

#ifndef HAK_OBSERVE
#define HAK_OBSERVE 0 /* 1 in the observing build (make observe): per-operation counters */
#endif
#ifndef HAK_STATIC_ARCHIVE
#define HAK_STATIC_ARCHIVE 0 /* 1 in build/libhakmem.a (override.c) */
#endif
#ifndef HAK_SECURE
#define HAK_SECURE 0 /* 1 in the secure build (make secure): see "the secure build" below */
#endif
#ifndef HAK_VALGRIND
#define HAK_VALGRIND 0 /* 1 in the debug build: blocks annotated for memcheck (below) */
#endif
#ifndef HAK_PROF
#define HAK_PROF 0 /* 1 in the profiling library (libhakmem-prof.so): the heap profiler's countdown */
#endif

#if HAK_DEBUG
void hak_assert_fail(const char* expr, const char* file, int line);
#define hak_assert(x) ((x) ? (void)0 : hak_assert_fail(#x, __FILE__, __LINE__))
/* check.c: every invariant of a heap, after each slow-path step. */
struct hak_heap_s;
void hak_heap_check(struct hak_heap_s* heap);
#else
#define hak_assert(x) ((void)0)
#define hak_heap_check(heap) ((void)0)
#endif

/* ---- geometry ---------------------------------------------------------- */

#define HAK_SEG_SHIFT 21
#define HAK_SEG_SIZE ((size_t)1 << HAK_SEG_SHIFT)
#define HAK_SEG_MASK (HAK_SEG_SIZE - 1)
#define HAK_UNIT_SHIFT 16
#define HAK_UNIT_SIZE ((size_t)1 << HAK_UNIT_SHIFT)
#define HAK_UNITS (HAK_SEG_SIZE / HAK_UNIT_SIZE) /* 32 */
#define HAK_OS_PAGE 4096
#define HAK_SEG_HDR_SIZE 4096 /* segment header, in unit 0; pages use units 1-31 */
#define HAK_SEG_ALL_FREE 0xFFFFFFFEu /* free_units of an empty segment */
#define HAK_ALIGN 16          /* every block is at least this aligned */

/* Size classes: 16..256 bytes in steps of 16 (classes 0-15), then 4 classes
 * per doubling up to 1 KiB (16-23) and 5 above, to 128 KiB (24-58): 1088,
 * 1280, 1536, 1792, 2048, 2176...  A block above 256 bytes wastes at most
 * 1/5 of its size, one a little above a power of two past 1 KiB at most
 * 1/9 (classes.c).  Fewer classes mean fewer half-used pages: measured against
 * 8 per doubling, the peak RSS of random 16-1024 B blocks on 8192 slots
 * falls 7%, of 1-64 KiB blocks 12% (docs/BENCHMARKS.md). */
#define HAK_CLASS_STEP_MAX 256
#define HAK_CLASSES 59
#define HAK_CLASS_MAX_SIZE ((size_t)128 * 1024)
#define HAK_SMALL_MAX 1024                         /* sizes served by heap->direct */
/* The sizes asked of a class that heap->direct serves, one slot per 16
 * bytes: the small classes', and in the secure build one slot more, for a
 * request of 1024 bytes with its canary (served by the class above). */
#define HAK_DIRECT_MAX (HAK_SMALL_MAX + (HAK_SECURE ? 16 : 0))
#define HAK_DIRECT_SLOTS (HAK_DIRECT_MAX / 16 + 1)
#define HAK_CLASS_LARGE 255                        /* single-block pages */
/* Empty pages a heap keeps for reuse, in units (4 MiB), of which at most
 * 1 MiB in large blocks' pages (4 MiB of those raised the peak RSS of big,
 * where every page of a block is written, by 1%: docs/BENCHMARKS.md). */
#define HAK_EMPTY_UNITS_KEEP 64
#define HAK_EMPTY_LARGE_UNITS_KEEP 16
#define HAK_LARGE_RUNS 16 /* large blocks' runs given back lately, per heap (page.c) */
/* ... kept only by a heap of more segments than this: the headers of fewer
 * stay in the cache (they share its sets: segments are 2 MiB aligned), so a
 * walk of them costs less than the ring's own line. */
#define HAK_LARGE_RUNS_SEGMENTS 8
/* A class whose pages hold at most this many blocks keeps an emptied page as
 * its spare (heap.c, heap_keep_empty). */
#define HAK_SPARE_BLOCKS_MAX 16
/* The dormant heaps' sweep runs once a purge delay, and no more often than
 * this (remote.c). */
#define HAK_SWEEP_MIN_MS 10
/* A heap is dormant once its thread has made no refill and no collection for
 * this long while other threads' frees wait on it (a thread that waits a
 * moment for work is not: its pages would be faulted in again). */
#define HAK_DORMANT_MS 1000
/* The blocks a look at the dormant heaps reads at most (malloc_trim's: all),
 * 5-10 ms of the looking thread's time (~100 ns a block: remote.c), and a
 * quarter of that at looks this close, their interval while a look has left
 * blocks unread: a quarter of a thread's time at most (heap.c). */
#define HAK_SWEEP_WALK_MAX ((size_t)1 << 16)
#define HAK_SWEEP_STEP_MS 20
/* A thread's outbox flushes between two looks of its at the dormant heaps. */
#define HAK_SWEEP_FLUSHES 64
/* Remote frees (of blocks up to HAK_SMALL_MAX) a thread batches for one owner
 * before pushing them (remote.c). */
#define HAK_OUTBOX_MAX 32
/* The chains of a remote list its owner walks side by side (remote.c). */
#define HAK_COLLECT_WAYS 16
/* Free units a heap keeps backed at most, waiting for the purge delay: half
 * the units of its segments, and at least this many (16 MiB);
 * beyond, the oldest are purged. */
#define HAK_DIRTY_UNITS_MAX 256
/* Free units waiting for the purge delay (a heap's and the segment cache's)
 * from which each refill checks the delay (64 MiB; heap.c). */
#define HAK_PURGE_WATCH_UNITS 1024
/* Free units an exiting thread's heap may keep backed (128 KiB). */
#define HAK_EXIT_DIRTY_UNITS_KEEP 2
/* New threads whose first act freed a block of a live thread's heap and that
 * found it live after their wait, before that thread counts as one handing
 * work to new threads (heap.c, heap_free_first); larson starts 8 from one. */
#define HAK_DISPATCHER_HEIRS 16
/* Above this a block gets a mapping of its own (a huge segment). */
#define HAK_LARGE_MAX ((size_t)1 << 20)
#define HAK_REALLOC_HOMES 8 /* live one-unit realloc homes per heap (alloc.c) */
#define HAK_REALLOC_HOME_FROM ((size_t)16 << 10) /* a first growth from this size gets a home */
/* Requests above this can never be satisfied (and keep size arithmetic safe). */
#define HAK_SIZE_LIMIT ((size_t)PTRDIFF_MAX - 2 * HAK_SEG_SIZE)

/* ---- data structures --------------------------------------------------- */

/* A free block: its first word links the next one (hak_block_next). */
typedef struct hak_block_s {
  uintptr_t link;
} hak_block_t;

/* The end of a page's free list: NULL, or in the secure build the page's
 * own descriptor, an address of the segment like every link before it, so
 * that one mask tells a free block's first word (hak_block_linked). */
#if HAK_SECURE
#define hak_list_end(page) ((hak_block_t*)(page))
#else
#define hak_list_end(page) ((hak_block_t*)NULL)
#endif

typedef struct hak_heap_s hak_heap_t;
typedef struct hak_sweep_s hak_sweep_t;
typedef struct hak_segment_s hak_segment_t;
typedef struct hak_usage_s hak_usage_t;

/* A page descriptor: 64 bytes, one cache line, all the fast paths touch. */
typedef struct hak_page_s {
  hak_block_t* free;      /* blocks ready to hand out */
  uint32_t used;          /* blocks out (remote frees not yet collected count as out),
                             + HAK_USED_PINNED while current (hak_heap_use_page) */
  uint8_t in_full;        /* found with no free block: in no queue, div_magic 0 */
  uint8_t has_aligned;    /* holds blocks handed out at an inner aligned address */
  uint16_t head_off;      /* bytes back to the head descriptor of a multi-unit page */
  uint32_t block_size;
  uint16_t capacity;      /* blocks carved so far */
  uint16_t reserved;      /* blocks that fit (at most 4096: 16-byte blocks in a unit) */
  uint8_t cls;            /* size class, or HAK_CLASS_LARGE */
  uint8_t units;          /* units spanned; 0 in a descriptor that heads no page */
  uint8_t index;          /* unit index of the head within its segment */
  uint8_t home;           /* a large block realloc placed to grow in place (alloc.c) */
  uint32_t start_lo;      /* the low 32 bits of the first block's address (it lies in
                             the descriptor's segment, hak_page_start) */
  /* UINT64_MAX / block_size + 1: an offset d below 2^32 is a multiple of the
   * block size iff d * div_magic < div_magic (Lemire, Kaser and Kurz), so
   * free checks that p starts a block with one multiply.  0 in a descriptor
   * of no page and while the page is full (in_full): every free of it then
   * takes the slow path, which puts the page back in its queue. */
  uint64_t div_magic;
  /* The owner thread's id (hak_thread_id), else 0: free checks it on the
   * line it reads anyway, not the segment header's.  A page made takes its
   * heap's; a heap's thread stamps the others as it first uses or frees into
   * them (hak_page_claim), and clears them all as it ends
   * (hak_segment_clear_owner): so adopting a heap costs nothing per page. */
  _Atomic uintptr_t owner_tid;
  union {
    struct { /* in the class queue or the heap's empty pages */
      struct hak_page_s* next;
      struct hak_page_s* prev;
    };
    uint64_t full_magic; /* full (in no queue): its div_magic, so that the slow
                            path of its frees need not divide to find it */
  };
} hak_page_t;

/* The first block of a page: in the segment of its descriptor. */
HAK_INLINE uint8_t* hak_page_start(const hak_page_t* page) {
  return (uint8_t*)(((uintptr_t)page & ~(uintptr_t)HAK_SEG_MASK) | (page->start_lo & HAK_SEG_MASK));
}
HAK_INLINE void hak_page_set_start(hak_page_t* page, uint8_t* start) {
  page->start_lo = (uint32_t)(uintptr_t)start;
}

typedef struct hak_page_queue_s {
  hak_page_t* first;
  hak_page_t* last;
} hak_page_queue_t;

enum { HAK_SEG_NORMAL = 1, HAK_SEG_HUGE = 2 };

/* The header: 64 bytes, then the descriptors, each on a cache line of its own. */
struct hak_segment_s {
  _Atomic(hak_heap_t*) heap;   /* owner; NULL for huge segments and free ones */
  uint32_t kind;
  uint32_t free_units;         /* bit i set: unit i is free */
  uint32_t dirty_units;        /* free units still backed by memory (not purged); kept
                                  while the segment waits in the cache backed */
  uint32_t huge_spare_pages;   /* huge: pages of the mapping beyond the block's need */
  hak_segment_t* next;         /* in the owner's segment list or the free cache */
  hak_segment_t* prev;
  size_t map_size;             /* huge: the mapping, which starts at the header */
  uint32_t huge_off;           /* huge: the block's offset from the header (at most 2 MiB;
                                  not a pointer: memcheck would see the block reachable) */
  uint32_t stamped_units;      /* bit i set: the page at unit i carries its owner's id
                                  (hak_page_claim; hak_segment_clear_owner) */
  uint32_t free_count;         /* free units (counted as free_units changes) */
  uint32_t zero_units;         /* free units known to read as zero: not written since
                                  the system gave or purged them (MADV_DONTNEED) */
  _Alignas(64) hak_page_t pages[HAK_UNITS];
  uint32_t unit_freed_ms[HAK_UNITS]; /* when each dirty free unit was freed */
  uint32_t unit_purged_ms[HAK_UNITS]; /* when each clean free unit was given back for
                                         staying free the delay; 0 if not so (learn.c) */
  uint32_t huge_run;           /* huge: granules of the arena it holds; 0: a mapping of its own */
  uint32_t huge_chunk;         /* huge, in the arena: the index of its chunk */
  uint32_t huge_guard_page;    /* huge, secure build: the guard page after the block */
};

/* A heap's statistics, per class (index HAK_CLASSES: large blocks), written
 * by its owner thread only (hak_stat_add: relaxed atomics, so that a report
 * may read them meanwhile) and never reset (hak_stats_reset keeps a
 * baseline).  The first three are counted on slow paths in every build
 * (remote frees once per batch collected); the per-operation ones only in
 * the observing build (HAK_OBSERVE). */
#define HAK_STAT_CLASSES (HAK_CLASSES + 1)
typedef struct hak_heap_stats_s {
  size_t refills[HAK_STAT_CLASSES];   /* pages made or reused for the class */
  size_t retires[HAK_STAT_CLASSES];   /* pages given back to their segment */
  size_t remote_frees;                /* blocks freed by other threads, collected */
#if HAK_OBSERVE
  size_t remote_in[HAK_STAT_CLASSES]; /* the same per class */
  size_t alloc_current[HAK_STAT_CLASSES]; /* malloc: from the current page */
  size_t alloc_partial[HAK_STAT_CLASSES]; /* from another page of the queue (slow path) */
  size_t alloc_refill[HAK_STAT_CLASSES];  /* from a page just made or reused */
  size_t free_current[HAK_STAT_CLASSES];  /* free (local): to the current page */
  size_t free_partial[HAK_STAT_CLASSES];  /* to another page */
  size_t free_empty[HAK_STAT_CLASSES];    /* that emptied a page */
  size_t free_remote[HAK_STAT_CLASSES];   /* pushed to another thread's heap */
#endif
} hak_heap_stats_t;
#define hak_stat_add(ctr, n) __atomic_store_n(&(ctr), __atomic_load_n(&(ctr), __ATOMIC_RELAXED) + (n), __ATOMIC_RELAXED)
#define hak_stat_class(page) ((page)->cls == HAK_CLASS_LARGE ? HAK_CLASSES : (unsigned)(page)->cls)
#if HAK_OBSERVE
#define HAK_OBSERVE_ADD(ctr) hak_stat_add(ctr, 1)
#else
#define HAK_OBSERVE_ADD(ctr) ((void)0)
#endif

struct hak_heap_s {
  int64_t prof_left;                    /* bytes to hand out before the next sample (prof.c) */
  hak_page_t* direct[HAK_DIRECT_SLOTS]; /* size/16 -> current page (small sizes) */
  hak_page_t* current[HAK_CLASSES];     /* class -> current page, never NULL */
  hak_page_queue_t queue[HAK_CLASSES];  /* pages with (possibly) free blocks */
  hak_page_queue_t empty;               /* empty pages kept for reuse, newest first */
  hak_page_t* spare[HAK_CLASSES];       /* an empty page kept for the class's next refill */
  size_t empty_units;                   /* units they hold */
  size_t empty_large_units;             /* of those, in large blocks' pages */
  size_t dirty_units;                   /* free units of its segments not yet purged */
  uint32_t purge_due_ms;                /* when the oldest of them or of the empty pages is due */
  uint32_t purge_looked_ms;             /* when its page events last looked at the process's caches */
  hak_segment_t* segments;              /* segments with free units */
  hak_segment_t* full_segments;         /* segments without */
  /* No segment of the list has more free units than this (a bound: a search
   * that finds no room lowers it to the most it saw, and units given back
   * raise it), so that a page no segment can hold does not walk them all. */
  uint32_t segments_room;
  uint8_t refills;                      /* by 4, wraps every 64: a check of the purge delay (heap.c) */
  bool purge_watch;                     /* much waits for the delay: each refill checks it */
  size_t segment_count;                 /* its segments (both lists) */
  hak_heap_t* pool_next;                /* in the abandoned or the spare pool */
  hak_heap_t* heir_of;                  /* a live heap whose block this thread freed first, */
                                        /* absorbed on a refill once abandoned (heap.c) */
  hak_heap_t* served;                   /* the heap of the dispatcher whose block its thread */
                                        /* freed first, else NULL (heap_free_first) */
  uint32_t heirs_outlived;              /* new threads that freed its block first and found */
                                        /* its thread running after their wait (atomic) */
  uint32_t abandoned_ms;                /* when its thread ended (in the abandoned pool) */
  bool pool_trimmed;                    /* in the pool: its unused pages given back (heap.c) */
  int kind;                             /* HAK_HEAP_THREAD, _GLOBAL, or a sentinel */
  uintptr_t tid;                        /* the owner thread's id, 0 if none */
  hak_heap_t* all_next;                 /* every heap ever made (stats) */
  uint64_t prof_rng;                    /* the profiler's gaps between samples */
  uintptr_t realloc_last;               /* ~address of the block the last growing realloc moved to
                                           (inverted: no pointer for memcheck to see a leak through) */
  uintptr_t zeroed_last;                /* ~address of the last large block made on units known
                                           to read as zero (calloc clears no more), else 0 */
  uint32_t homes;                       /* live one-unit realloc homes (HAK_REALLOC_HOMES) */
  /* Its thread's frees of another heap's blocks wait here, chained, while
   * they go to one heap, and leave with one atomic push (remote.c). */
  hak_heap_t* outbox_to;
  hak_block_t* outbox_first;
  hak_block_t* outbox_last;
  uint32_t outbox_count;
  uint32_t outbox_flushes;              /* every HAK_SWEEP_FLUSHES, a look at the dormant heaps */
  /* Its thread's refills and remote collections (while the count stands
   * and frees wait, the heap is dormant: remote.c), and what the sweeper saw
   * of it (under the heaps lock). */
  _Atomic uint32_t slow_calls;
  uint32_t sweep_slow_calls;
  uint32_t sweep_armed_ms;
  bool sweep_armed;
  hak_sweep_t* sweep;       /* what the sweeper holds of its list (remote.c) */
  /* Written by other threads: kept on a line of its own. */
  _Alignas(64) _Atomic(hak_block_t*) remote;
  /* Full pages whose every block another thread found on remote, and purged
   * (remote.c), for the heap to retire when it collects. */
  _Atomic(hak_page_t*) reclaimed;
  /* What the sweeper held and had not read, given back (one list: linking it
   * to remote would walk one of the two); a block pushed onto remote after
   * it makes sure the owner collects. */
  _Atomic(hak_block_t*) remote_back;
  char pad_[64 - 3 * sizeof(void*)];
  hak_heap_stats_t stats;
  /* The runs of the large blocks' pages it gave back lately (a ring, newest
   * at large_run_next - 1), so that a new large block takes one of its size
   * again, still backed, without walking a big heap's segments (page.c).
   * Each is its segment's address | first unit << 5 | units (0: none): a
   * hint, checked against the segment's units, and cleared when the
   * segment leaves the heap.  Two lines, touched only by large pages. */
  _Alignas(64) uintptr_t large_runs[HAK_LARGE_RUNS];
  uint32_t large_run_next;               /* the ring's next slot */
};

enum { HAK_HEAP_EMPTY = 0, HAK_HEAP_DEAD = 1, HAK_HEAP_THREAD = 2, HAK_HEAP_GLOBAL = 3 };

_Static_assert(sizeof(hak_page_t) == 64, "page descriptors are 64 bytes");
_Static_assert(sizeof(hak_segment_t) <= HAK_SEG_HDR_SIZE, "segment header fits its page");
_Static_assert(offsetof(hak_segment_t, pages) == 64, "descriptors are cache-line aligned");

/* ---- configuration (policy.c) ------------------------------------------- */

/* The options (docs/CONFIG.md), read from the environment once, at start,
 * into an immutable snapshot; hak_option_set publishes a new one.  Slow paths
 * read the current snapshot through hak_policy(); no fast path reads it. */
enum { HAK_PURGE_DONTNEED = 0, HAK_PURGE_FREE = 1 };
enum { HAK_THP_SYSTEM = 0, HAK_THP_ON = 1, HAK_THP_OFF = 2 };
enum { HAK_STATS_OFF = 0, HAK_STATS_ON = 1, HAK_STATS_JSON = 2 };
extern char hak_stats_path[256]; /* HAKMEM_STATS=json:PATH */
enum { HAK_PROF_OFF = 0, HAK_PROF_ON = 1, HAK_PROF_FILE = 2 };
extern char hak_prof_path[256]; /* HAKMEM_PROF=file:PATH */
typedef struct hak_policy_s {
  /* A free unit's memory is given back (madvise) once it has stayed free this
   * long: units reused sooner cost no system call and no page fault.  0: at
   * once; -1: never (only malloc_trim). */
  int32_t purge_delay_ms;
  int32_t purge_mode; /* HAK_PURGE_* */
  int32_t thp;        /* HAK_THP_* */
  int32_t stats;      /* HAK_STATS_*: the report at exit */
  int32_t verbose;    /* print the configuration at start */
  int32_t learn;      /* the learner tunes purge_delay_ms (learn.c) */
  int32_t prof;       /* HAK_PROF_*: the sampling heap profiler (prof.c) */
  int32_t prof_rate;  /* its mean gap between samples, in bytes */
  int32_t prof_signal; /* a signal that writes the profile; 0: none */
} hak_policy_t;
extern _Atomic(const hak_policy_t*) hak_policy_now;
HAK_INLINE const hak_policy_t* hak_policy(void) {
  return atomic_load_explicit(&hak_policy_now, memory_order_acquire);
}
/* One field of the current snapshot.  Fields are read and written as relaxed
 * atomics: a snapshot's slot is reused after many publications (policy.c). */
#define HAK_POLICY(field) __atomic_load_n(&hak_policy()->field, __ATOMIC_RELAXED)
void hak_policy_init(void);
void hak_policy_print_table(int fd);
void hak_policy_lock(void);
void hak_policy_unlock(void);
/* Publishes a copy of the current snapshot with purge_delay_ms changed (the learner). */
void hak_policy_publish_delay(int32_t delay_ms);

/* ---- the learner (learn.c) ------------------------------------------------ */

/* The learner moves the purge delay within these bounds (docs/CONFIG.md). */
#define HAK_LEARN_DELAY_MIN_MS 10
#define HAK_LEARN_DELAY_MAX_MS 1000
void hak_learn_step(uint32_t now_ms);
void hak_learn_note_reuse(hak_segment_t* seg, uint32_t clean_units);
void hak_learn_lock(void);
void hak_learn_unlock(void);
void hak_stats_lock(void);
void hak_stats_unlock(void);

/* ---- globals ------------------------------------------------------------ */

extern __thread hak_heap_t* hak_tls_heap __attribute__((tls_model("initial-exec")));
extern hak_heap_t hak_heap_empty;  /* a thread that has not allocated yet */
extern hak_heap_t hak_heap_dead;   /* a thread whose heap was abandoned at exit */
extern hak_page_t hak_page_empty;  /* a page with no free block */
extern uint32_t hak_class_size[HAK_CLASSES];
extern uint8_t hak_class_units[HAK_CLASSES];
/* A class page starts this many cache-line offsets apart, 0 .. n-1 lines
 * into its first unit (page.c, page_format), within the tail its blocks
 * leave: the first lines of blocks whose size is a multiple of 1-4 KiB would
 * otherwise all fall in the same few cache sets.  A class with more than one
 * aligns its blocks to 64 bytes only (alloc.c, alloc_aligned). */
extern uint16_t hak_class_start_lines[HAK_CLASSES];
/* A class with one line (its blocks fill the page) starts its pages this
 * many bytes in, a multiple of its alignment (classes.c). */
extern uint16_t hak_class_start_off[HAK_CLASSES];

/* Segment map: one byte per 2 MiB of the 47-bit address space (64 MiB of
 * address space, of which only the pages covering hakmem's own segments are
 * ever touched), non-zero for every segment hakmem handed out.  free() checks
 * it before trusting a pointer.  A byte, not a bit: one compare on the path. */
#define HAK_SEGMAP_SIZE ((size_t)1 << (47 - HAK_SEG_SHIFT))
extern uint8_t hak_segmap[HAK_SEGMAP_SIZE];
enum {
  HAK_MAP_NONE = 0,
  HAK_MAP_SEGMENT = 1,    /* a segment header is here */
  HAK_MAP_HUGE_ABOVE = 2, /* a huge block aligned to 2 MiB or more starts here;
                             its header is one segment below */
};

/* ---- free-list links and the secure build (secure.c) --------------------
 *
 * The secure build (make secure: build/libhakmem-secure.so) stores each link
 * encoded with a secret and the link's own address, so that a use after free
 * cannot plant a pointer, and checks each link it follows: one that does not
 * decode to a 16-byte aligned block of the same segment (of some segment, on
 * a remote list) is reported as a corrupted heap.  Every block of a page
 * ends with a canary word, checked when the block is freed, and a free block
 * is known by the link in its first word (or, on another heap's remote list,
 * by a freed tag in place of its canary): freeing it again is a double free,
 * any other last word a write past its end (see hak_block_in).  Fresh blocks
 * are handed out in random order, and guard pages follow segment headers and
 * surround huge blocks.  The release build compiles all of it away. */
#if HAK_SECURE
#define HAK_CANARY_SIZE 8 /* the last word of every block of a page */
/* Blocks carved (and shuffled) at a time: at least an OS page's worth, and
 * at least MIN, or for blocks above 1 KiB as many as CARVE_BYTES holds, at
 * least FEW: carving writes a block's first and last words, so that many
 * big blocks carved ahead of use would be memory committed for nothing. */
#define HAK_SECURE_CARVE_MIN 16
#define HAK_SECURE_CARVE_FEW 4
#define HAK_SECURE_CARVE_BYTES 16384
#define HAK_SECURE_CARVE_MAX 256
/* Drawn at start (hak_secure_init): the key of free-list links, the canary
 * (one word for every block), and the key that turns the canary into the
 * freed tag.  (Hidden, so that each is read straight from its address, not
 * through the GOT.) */
extern __attribute__((visibility("hidden"))) uintptr_t hak_link_key, hak_canary, hak_freed_key;
HAK_COLD __attribute__((noreturn)) void hak_bad_link(const void* at);
#else
#define HAK_CANARY_SIZE 0
#endif

/* Memcheck (valgrind) sees hakmem's blocks in the debug build: a block is
 * registered (its usable bytes) when handed out and unregistered when freed,
 * so that memcheck reports uses after free and leaks; a free block stays
 * inaccessible but for the moments hakmem reads or writes its link.  The
 * other builds compile it all away. */
#if HAK_VALGRIND
#include <valgrind/memcheck.h>
size_t hak_usable(const void* p);
#define HAK_VG_ALLOC(p, zeroed) \
  do {                          \
    if ((p) != NULL) VALGRIND_MALLOCLIKE_BLOCK((p), hak_usable(p), 0, (zeroed)); \
  } while (0)
#define HAK_VG_FREE(p)                                    \
  do {                                                    \
    if ((p) != NULL) VALGRIND_FREELIKE_BLOCK((p), 0);     \
  } while (0)
/* Block p of old usable bytes is now q (p itself if resized in place). */
#define HAK_VG_RESIZED(p, q, old)                                           \
  do {                                                                      \
    size_t now_ = hak_usable(q);                                            \
    if ((q) == (p)) {                                                       \
      VALGRIND_RESIZEINPLACE_BLOCK((p), (old), now_, 0);                    \
    } else { /* moved by mremap: its contents came along */                 \
      VALGRIND_FREELIKE_BLOCK((p), 0);                                      \
      VALGRIND_MALLOCLIKE_BLOCK((q), now_, 0, 0);                           \
      VALGRIND_MAKE_MEM_DEFINED((q), (old) < now_ ? (old) : now_);          \
    }                                                                       \
  } while (0)
#define HAK_VG_UNDEFINED(p, n) ((void)VALGRIND_MAKE_MEM_UNDEFINED((p), (n)))
#define HAK_VG_DEFINED(p, n) ((void)VALGRIND_MAKE_MEM_DEFINED((p), (n)))
#define HAK_VG_LINK_OPEN(b) ((void)VALGRIND_MAKE_MEM_DEFINED((b), sizeof(uintptr_t)))
#define HAK_VG_LINK_CLOSE(b) ((void)VALGRIND_MAKE_MEM_NOACCESS((b), sizeof(uintptr_t)))
#else
#define HAK_VG_ALLOC(p, zeroed) ((void)0)
#define HAK_VG_FREE(p) ((void)0)
#define HAK_VG_RESIZED(p, q, old) ((void)0)
#define HAK_VG_UNDEFINED(p, n) ((void)0)
#define HAK_VG_DEFINED(p, n) ((void)0)
#define HAK_VG_LINK_OPEN(b) ((void)0)
#define HAK_VG_LINK_CLOSE(b) ((void)0)
#endif

HAK_INLINE void hak_block_set_next(hak_block_t* b, hak_block_t* next) {
  HAK_VG_LINK_OPEN(b);
#if HAK_SECURE
  b->link = __builtin_bswap64((uintptr_t)next ^ (uintptr_t)b) ^ hak_link_key;
#else
  b->link = (uintptr_t)next;
#endif
  HAK_VG_LINK_CLOSE(b);
}

#if HAK_SECURE
/* The link's distance: next ^ b (the page's descriptor ^ b at the end of a
 * page's list, b itself at the end of a remote list). */
HAK_INLINE uintptr_t hak_link_delta(const hak_block_t* b) {
  return __builtin_bswap64(b->link ^ hak_link_key);
}
#endif

/* The next block of a page's free list (all in one segment), as its link
 * says: the secure build checks each block a page's list names when it is
 * taken or visited (hak_free_entry_check), not the link when it is read, so
 * that malloc's pop has no branch waiting on that load. */
HAK_INLINE hak_block_t* hak_block_next(const hak_block_t* b) {
#if HAK_SECURE
  return (hak_block_t*)(hak_link_delta(b) ^ (uintptr_t)b);
#elif HAK_VALGRIND
  HAK_VG_LINK_OPEN(b);
  uintptr_t next = b->link;
  HAK_VG_LINK_CLOSE(b);
  return (hak_block_t*)next;
#else
  return (hak_block_t*)b->link;
#endif
}

/* ---- page queues (doubly linked; inline: the slow paths of mid-size
 * classes, whose pages fill and empty often, move pages at every turn) ---- */

HAK_INLINE void hak_queue_push_front(hak_page_queue_t* q, hak_page_t* page) {
  page->prev = NULL;
  page->next = q->first;
  if (q->first) q->first->prev = page; else q->last = page;
  q->first = page;
}

HAK_INLINE void hak_queue_push_back(hak_page_queue_t* q, hak_page_t* page) {
  page->next = NULL;
  page->prev = q->last;
  if (q->last) q->last->next = page; else q->first = page;
  q->last = page;
}

HAK_INLINE void hak_queue_remove(hak_page_queue_t* q, hak_page_t* page) {
  if (page->prev) page->prev->next = page->next; else q->first = page->next;
  if (page->next) page->next->prev = page->prev; else q->last = page->prev;
  page->next = page->prev = NULL;
}

/* The first page goes to the back; the queue holds another. */
HAK_INLINE void hak_queue_rotate(hak_page_queue_t* q) {
  hak_page_t* page = q->first;
  q->first = page->next;
  q->first->prev = NULL;
  page->next = NULL;
  page->prev = q->last;
  q->last->next = page;
  q->last = page;
}

/* Takes page off the heap's empty pages. */
HAK_INLINE void hak_heap_empty_remove(hak_heap_t* heap, hak_page_t* page) {
  hak_queue_remove(&heap->empty, page);
  heap->empty_units -= page->units;
  if (page->cls == HAK_CLASS_LARGE) heap->empty_large_units -= page->units;
}

/* The class's current page is the first of its queue; the direct slots of
 * the small classes (those up to HAK_DIRECT_MAX) point at it too.  Its used
 * count carries HAK_USED_PINNED while it is current, so that the free that
 * empties it finds the count above 0 and takes no branch: a class whose
 * program takes and gives back one block at a time would otherwise branch on
 * one free in two or four, which the processor mispredicts (string_builder
 * ran 15-20% faster without the branch).  The current page stays when it
 * empties anyway.  The page that stops being current is never empty here
 * (it ran out, or left the queue full) but where hak_trim retires it. */
#define HAK_DIRECT_CLASSES (24 + HAK_SECURE) /* hak_class_of(HAK_DIRECT_MAX) + 1 */
/* Each such class's direct slots: the first, and how many (classes.c). */
extern uint8_t hak_class_direct_first[HAK_DIRECT_CLASSES];
extern uint8_t hak_class_direct_slots[HAK_DIRECT_CLASSES];
#define HAK_USED_PINNED ((uint32_t)1 << 31)
void hak_heap_set_direct(hak_heap_t* heap, unsigned cls, hak_page_t* page);
/* The 2 MiB unit of p, which is p's segment if the map says HAK_MAP_SEGMENT. */
HAK_INLINE hak_segment_t* hak_segment_of(const void* p) {
  return (hak_segment_t*)((uintptr_t)p & ~(uintptr_t)HAK_SEG_MASK);
}

/* Stamps heap's thread id on page, one of heap's, if not there yet (see
 * owner_tid; a heap without a thread, id 0, stamps nothing). */
HAK_INLINE void hak_page_claim(hak_heap_t* heap, hak_page_t* page) {
  if (likely(atomic_load_explicit(&page->owner_tid, memory_order_relaxed) == heap->tid)) return;
  hak_segment_of(page)->stamped_units |= 1u << page->index;
  /* (Release: the bit is written first, so that a fork between the two
   * leaves no id its child's handler would not find.) */
  atomic_store_explicit(&page->owner_tid, heap->tid, memory_order_release);
}
HAK_INLINE void hak_heap_use_page(hak_heap_t* heap, unsigned cls, hak_page_t* page) {
  hak_page_t* old = heap->current[cls];
  if (old != &hak_page_empty) old->used -= HAK_USED_PINNED;
  if (page != &hak_page_empty) {
    page->used += HAK_USED_PINNED;
    hak_page_claim(heap, page);
  }
  heap->current[cls] = page;
  if (cls < HAK_DIRECT_CLASSES) hak_heap_set_direct(heap, cls, page);
}
/* Blocks out of page, without the pin. */
HAK_INLINE uint32_t hak_page_used(const hak_page_t* page) { return page->used & ~HAK_USED_PINNED; }
HAK_INLINE void hak_heap_set_current(hak_heap_t* heap, unsigned cls) {
  hak_heap_use_page(heap, cls, heap->queue[cls].first ? heap->queue[cls].first : &hak_page_empty);
}

/* ---- inline helpers ------------------------------------------------------ */

/* Size -> class, for 0 < size <= HAK_CLASS_MAX_SIZE.  Above the 16-byte
 * steps by a table of 64-byte steps (every class size there is a multiple
 * of 64): one load instead of a bit scan and five more instructions on the
 * fast path of malloc's mid sizes. */
extern uint8_t hak_class_by_64[HAK_CLASS_MAX_SIZE / 64 + 1];
HAK_INLINE unsigned hak_class_of(size_t size) {
  if (size <= HAK_CLASS_STEP_MAX) return size <= 16 ? 0 : (unsigned)((size - 1) >> 4);
  return hak_class_by_64[(size + 63) >> 6];
}

/* Bits idx .. idx+n-1 of a segment's unit bitmaps (idx + n <= 32). */
HAK_INLINE uint32_t hak_unit_mask(unsigned idx, unsigned n) {
  return (uint32_t)((((uint64_t)1 << n) - 1) << idx);
}

/* A page's div_magic for blocks of bs bytes (see hak_page_t). */
HAK_INLINE uint64_t hak_div_magic(uint32_t bs) { return UINT64_MAX / bs + 1; }

/* The segment-map entry covering p.  A plain load, which free compares in
 * memory (one instruction): the byte of a live block's segment was written
 * before the block was handed out, and is not written again until the
 * segment is given back, so a valid free never races with a write to it. */
HAK_INLINE unsigned hak_segmap_get(const void* p) {
  uintptr_t idx = (uintptr_t)p >> HAK_SEG_SHIFT;
  if (unlikely(idx >= HAK_SEGMAP_SIZE)) return HAK_MAP_NONE;
  return hak_segmap[idx];
}

/* The segment holding p, or NULL if hakmem does not own p. */
HAK_INLINE hak_segment_t* hak_segment_lookup(const void* p) {
  unsigned m = hak_segmap_get(p);
  if (likely(m == HAK_MAP_SEGMENT)) return hak_segment_of(p);
  if (m == HAK_MAP_HUGE_ABOVE) return (hak_segment_t*)((uintptr_t)hak_segment_of(p) - HAK_SEG_SIZE);
  return NULL;
}

/* The page holding p: the descriptor of p's unit (index * 64 straight from the
 * address bits), then back to the head of a multi-unit page.  Unit 0 holds the
 * header and never a page: its descriptor stays zero. */
HAK_INLINE hak_page_t* hak_page_of(hak_segment_t* seg, const void* p) {
  uintptr_t off = ((uintptr_t)p >> (HAK_UNIT_SHIFT - 6)) & ((HAK_UNITS - 1) << 6);
  hak_page_t* pg = (hak_page_t*)((uint8_t*)seg->pages + off);
  return (hak_page_t*)((uint8_t*)pg - pg->head_off);
}

/* A thread's id: its thread pointer, one instruction away, unique among the
 * live threads of a process.  A forked child's threads may reuse the ids of
 * parent threads whose heaps still own segments there: the child's fork
 * handler clears those (hak_segments_fork_child). */
HAK_INLINE uintptr_t hak_thread_id(void) { return (uintptr_t)__builtin_thread_pointer(); }

HAK_INLINE hak_heap_t* hak_segment_heap(hak_segment_t* seg) {
  return atomic_load_explicit(&seg->heap, memory_order_relaxed);
}

/* Whether p is the start of a block of page (false for a descriptor in no page). */
HAK_INLINE bool hak_is_block_start(const hak_page_t* page, const void* p) {
  uint32_t off = (uint32_t)(uintptr_t)p - page->start_lo;
  /* Relaxed atomic: a remote free reads it while the owner may move the page. */
  uint64_t magic = __atomic_load_n(&page->div_magic, __ATOMIC_RELAXED);
  return (uint64_t)off * magic < magic;
}

/* The same on free's hit path: on x86-64 both instructions read the magic
 * from memory (held in a register, it cost the path one instruction more;
 * an asm's operand, since a remote free reads it as the owner changes it). */
HAK_INLINE bool hak_is_block_start_hit(const hak_page_t* page, const void* p) {
#if defined(__x86_64__)
  uint64_t off = (uint32_t)((uint32_t)(uintptr_t)p - page->start_lo);
  bool below;
  __asm__("imulq %[m], %[off]\n\tcmpq %[m], %[off]" : [off] "+r"(off), "=@ccb"(below) : [m] "m"(page->div_magic));
  return below;
#else
  return hak_is_block_start(page, p);
#endif
}

/* The same test for a page found full, whose div_magic is 0 meanwhile. */
HAK_INLINE bool hak_is_block_start_full(const hak_page_t* page, const void* p) {
  uint32_t off = (uint32_t)(uintptr_t)p - page->start_lo;
  return (uint64_t)off * page->full_magic < page->full_magic;
}

/* The same test for a page of a size class, by its class's magic: what a
 * remote free reads of the page (start, class) does not change while the
 * block is out, whatever state the owner moves the page through. */
extern uint64_t hak_class_magic[HAK_CLASSES];
HAK_INLINE bool hak_is_class_block_start(const hak_page_t* page, const void* p) {
  uint32_t off = (uint32_t)(uintptr_t)p - page->start_lo;
  uint64_t magic = hak_class_magic[page->cls];
  return (uint64_t)off * magic < magic;
}

/* Secure build: b, named by page's free list (its head, or a link), must be
 * a 16-byte aligned address of the page's segment (one mask of b ^ page
 * tests both: the page's descriptor is in the segment's header), else a
 * freed block was written to.  Checked before b is read or handed out. */
#if HAK_SECURE
HAK_INLINE void hak_free_entry_check(const hak_page_t* page, const hak_block_t* b) {
  if (unlikely((((uintptr_t)b ^ (uintptr_t)page) & (~(uintptr_t)HAK_SEG_MASK | 15)) != 0)) hak_bad_link(b);
}
#else
#define hak_free_entry_check(page, b) ((void)0)
#endif

/* The start of the block holding p (p may point inside an aligned block). */
HAK_INLINE hak_block_t* hak_block_start(const hak_page_t* page, const void* p) {
  size_t off = (size_t)((const uint8_t*)p - hak_page_start(page));
  return (hak_block_t*)(hak_page_start(page) + off - off % page->block_size);
}

HAK_COLD __attribute__((noreturn)) void hak_double_free(const hak_page_t* page, const void* p);

/* The next block of a heap's remote list (blocks of any of its segments). */
HAK_INLINE hak_block_t* hak_block_next_remote(const hak_block_t* b) {
#if HAK_SECURE
  uintptr_t next = hak_link_delta(b) ^ (uintptr_t)b;
  if (unlikely(next != 0 && ((next & 15) != 0 || hak_segmap_get((void*)next) != HAK_MAP_SEGMENT)))
    hak_bad_link(b);
  return (hak_block_t*)next;
#else
  return hak_block_next(b);
#endif
}

#if HAK_SECURE
/* A block's two marks.  Its first word tells a free block: there, and only
 * there, is an encoded link, which decodes to a block of the same segment
 * or to the page's descriptor that ends the list (hak_list_end); malloc
 * clears it when it hands the block out.  (A
 * program cannot write such a word but by chance, 1 in 2^47, or by copying
 * one out of a freed block.)  Its last word is its canary, a secret
 * word drawn at start, laid when the block is carved (and when a large
 * block is handed out: its end moves with its page), and checked, not
 * rewritten, by every free: malloc thus touches only the block's first
 * line.  A block freed to another thread's heap
 * sits on a list whose links cross segments; its canary is turned into the
 * freed tag (the canary under a second secret) until its owner collects it
 * and lays the canary again. */
HAK_INLINE uintptr_t* hak_canary_at(const hak_page_t* page, const void* b) {
  return (uintptr_t*)((uint8_t*)b + page->block_size - HAK_CANARY_SIZE);
}
HAK_INLINE uintptr_t hak_freed_word(void) { return hak_canary ^ hak_freed_key; }
HAK_INLINE void hak_canary_set(const hak_page_t* page, void* b) { *hak_canary_at(page, b) = hak_canary; }
/* Whether b's first word is a link of a page's free list: one to a 16-byte
 * aligned address of b's segment (a block, or the page that ends the list).
 * (The mask is taken before the link's bytes are swapped back.) */
HAK_INLINE bool hak_block_linked(const hak_block_t* b) {
  return ((b->link ^ hak_link_key) & __builtin_bswap64(~(uintptr_t)HAK_SEG_MASK | 15)) == 0;
}
/* Handed out from a page's free list (its canary stands since it was
 * carved or last checked), and as a large block (whose end moves with its
 * page). */
#define hak_block_out(page, b) ((void)(page), (b)->link = 0)
HAK_INLINE void hak_block_out_slow(const hak_page_t* page, hak_block_t* b) {
  b->link = 0;
  hak_canary_set(page, b);
}
/* Reports a block freed that is linked or whose canary is not intact. */
HAK_COLD __attribute__((noreturn)) void hak_bad_free(const hak_page_t* page, const void* b);
/* A block the program frees: not linked (else it is free already), its
 * canary intact (else it was freed to another thread, or written past its
 * end).  (One report call for both: the fast path then needs no frame.) */
HAK_INLINE void hak_block_in(const hak_page_t* page, hak_block_t* b) {
  if (unlikely(hak_block_linked(b)) || unlikely(*hak_canary_at(page, b) != hak_canary)) hak_bad_free(page, b);
}
/* Freed to another thread's heap: tagged, until collected. */
#define hak_block_tag(page, b) ((void)(*hak_canary_at(page, b) = hak_freed_word()))
#define hak_block_collected(page, b) hak_canary_set(page, b)
#else
#define hak_canary_set(page, b) ((void)0)
#define hak_block_out(page, b) ((void)0)
#define hak_block_out_slow(page, b) ((void)0)
#define hak_block_in(page, b) ((void)0)
#define hak_block_tag(page, b) ((void)0)
#define hak_block_collected(page, b) ((void)0)
#endif

/* ---- slow paths (out of line) ------------------------------------------- */

/* (size as the program asked: the secure build adds its canary's bytes.) */
void* hak_alloc_slow(hak_heap_t* heap, size_t size);
void* hak_alloc_refill(hak_heap_t* heap, hak_page_t* page, size_t size);
void hak_free_slow(hak_segment_t* seg, hak_page_t* page, void* p);
void hak_heap_page_empty(hak_heap_t* heap, hak_page_t* page);
HAK_COLD void hak_free_special(void* p);

/* ---- the fast paths ------------------------------------------------------ */

/* malloc: size -> current page -> pop (and in the profiling library, count
 * the bytes down to the profiler's next sample: prof.c).  The empty
 * sentinel heap's pages have no free blocks, so a new thread falls into the
 * slow path, which sets it up.  (The secure build asks for room for the
 * canary.) */
#if HAK_PROF
#define HAK_PROF_COUNTDOWN(heap, size) (((heap)->prof_left -= (int64_t)(size)) >= 0)
#else
#define HAK_PROF_COUNTDOWN(heap, size) true
#endif
HAK_INLINE void* hak_alloc_inline(size_t size) {
  hak_heap_t* heap = hak_tls_heap;
  hak_page_t* page;
  /* The bytes asked of a class: with the canary's (the comparisons are on
   * size itself, so that a size near SIZE_MAX cannot wrap past them; the
   * slow path is given size and adds the canary itself). */
  size_t need = size + HAK_CANARY_SIZE;
  if (likely(size <= HAK_DIRECT_MAX - HAK_CANARY_SIZE)) {
    page = heap->direct[(need + 15) >> 4];
  } else if (size <= HAK_CLASS_MAX_SIZE - HAK_CANARY_SIZE) {
    page = heap->current[hak_class_of(need)];
  } else {
    return hak_alloc_slow(heap, size);
  }
  hak_block_t* b = page->free;
  if (likely(b != hak_list_end(page) && HAK_PROF_COUNTDOWN(heap, need))) {
    hak_free_entry_check(page, b);
    page->free = hak_block_next(b);
    page->used++;
    hak_block_out(page, b);
    HAK_VG_ALLOC(b, 0);
    HAK_OBSERVE_ADD(heap->stats.alloc_current[page->cls]);
    return b;
  }
  return hak_alloc_refill(heap, page, size);
}

/* free: check the segment map, mask to the segment, and if this thread owns
 * it and p starts a block of a page that is not full, push it (unless it is
 * the block at the head of the free list: a double free, the common one).
 * Everything else (NULL, foreign pointers, huge blocks, other threads' blocks,
 * aligned blocks) goes to the slow paths.  hit: free's entry points
 * (hak_is_block_start_hit); realloc, which frees the block it moved, keeps
 * the magic in a register: its growth ran 3.6% slower with the other
 * (fewer instructions: code placement). */
HAK_INLINE void hak_free_block(void* p, bool hit) {
  HAK_VG_FREE(p);
  if (unlikely(hak_segmap_get(p) != HAK_MAP_SEGMENT)) {
    hak_free_special(p);
    return;
  }
  /* The segment from its map index, not from p (p then needs one register
   * copy fewer; the empty asm keeps the compiler from masking p instead). */
  uintptr_t idx = (uintptr_t)p >> HAK_SEG_SHIFT;
  __asm__("" : "+r"(idx));
  hak_segment_t* seg = (hak_segment_t*)(idx << HAK_SEG_SHIFT);
  hak_page_t* page = hak_page_of(seg, p);
  if (likely(atomic_load_explicit(&page->owner_tid, memory_order_relaxed) == hak_thread_id() &&
             (hit ? hak_is_block_start_hit(page, p) : hak_is_block_start(page, p)))) {
    hak_block_t* b = (hak_block_t*)p;
    hak_block_t* head = page->free;
    /* The block freed last, again (the secure build's canary check, next,
     * finds every double free, this one included). */
    if (!HAK_SECURE && unlikely(b == head)) hak_double_free(page, p);
    hak_block_in(page, b);
    hak_block_set_next(b, head);
    page->free = b;
#if HAK_OBSERVE
    hak_heap_t* heap = hak_tls_heap;
    if (page->cls != HAK_CLASS_LARGE && heap->current[page->cls] == page)
      HAK_OBSERVE_ADD(heap->stats.free_current[page->cls]);
    else
      HAK_OBSERVE_ADD(heap->stats.free_partial[hak_stat_class(page)]);
#endif
    if (unlikely(--page->used == 0)) hak_heap_page_empty(hak_tls_heap, page);
    return;
  }
  hak_free_slow(seg, page, p);
}
HAK_INLINE void hak_free_inline(void* p) { hak_free_block(p, true); }

/* ---- internal interfaces between the parts ------------------------------- */

/* classes.c */
void hak_classes_init(void);

/* os.c: every system call that maps or unmaps memory. */
bool hak_os_space_limited(void); /* a limit of address space (RLIMIT_AS) */
void* hak_os_map(size_t size);
void* hak_os_map_aligned(size_t size, size_t align, size_t skew);
void hak_os_unmap(void* p, size_t size);
bool hak_os_purge(void* p, size_t size); /* true: the range reads as zero now */
void hak_os_zero(void* p, size_t size);   /* cleared, or its pages given back where few are resident */
void hak_os_thp(void* p, size_t size);
void* hak_os_remap(void* old, size_t old_size, size_t new_size, void* fixed);
bool hak_os_guard(void* p, size_t size);
int hak_os_move_pages(void* from, void* to, size_t size); /* 1 moved, 0 not, -1 to unmapped */
bool hak_os_unguard(void* p, size_t size);
bool hak_os_guard_marks(void);
bool hak_os_guard_mark(void* p, size_t size);
bool hak_os_guard_unmark(void* p, size_t size);
uint32_t hak_now_ms(void);
/* Whether memory freed at freed_ms is due for purging at now_ms (delay < 0: never). */
HAK_INLINE bool hak_purge_is_due(uint32_t freed_ms, uint32_t now_ms, int32_t delay) {
  return delay >= 0 && (int32_t)(now_ms - freed_ms - (uint32_t)delay) >= 0;
}

/* report.c */
HAK_COLD __attribute__((noreturn)) void hak_fatal(const char* what, const void* p);
/* The same with " (class N)" after the address (cls < 0: without). */
HAK_COLD __attribute__((noreturn)) void hak_fatal_class(const char* what, const void* p, int cls);
void hak_write_stderr(const char* s);
bool hak_write_fd(int fd, const char* s);

/* segment.c */
void hak_segmap_set(const void* at, unsigned value);
hak_segment_t* hak_segment_acquire(hak_heap_t* heap);
void hak_segment_clear_owner(hak_segment_t* seg);
void hak_segment_release(hak_segment_t* seg);
int hak_segment_find_units(hak_segment_t* seg, unsigned n, bool* backed);
void hak_segment_take_units(hak_segment_t* seg, unsigned idx, unsigned n);
void hak_segment_give_units(hak_segment_t* seg, unsigned idx, unsigned n);
void hak_segments_lock(void);
void hak_segments_unlock(void);
void hak_segment_cache_purge(uint32_t now_ms, bool all);
size_t hak_segment_cache_dirty(void);
bool hak_segment_cache_unmap(void);
void hak_segments_usage(hak_usage_t* usage);

/* page.c */
/* (zero, if not NULL: set to whether the page's memory reads as zero, a
 * large block's page made on units no one wrote since the system zeroed them.) */
hak_page_t* hak_page_new(hak_heap_t* heap, unsigned cls, size_t large_size, bool* zero);
hak_page_t* hak_page_new_home(hak_heap_t* heap, size_t size);
void hak_page_extend(hak_page_t* page);
/* An empty page gives its units back, as free units backed since freed_ms
 * (the caller then checks the purge). */
void hak_page_retire(hak_heap_t* heap, hak_page_t* page, uint32_t freed_ms);
/* The same for a page whose memory the sweep gave back already (remote.c). */
void hak_page_retire_purged(hak_heap_t* heap, hak_page_t* page);
void hak_page_mark_emptied(hak_page_t* page, uint32_t now_ms);
void hak_page_trim(hak_page_t* page);
bool hak_page_grow(hak_heap_t* heap, hak_page_t* page, size_t size);
void hak_segments_move(hak_heap_t* heap, hak_heap_t* from);
void hak_segments_clear_owner(hak_heap_t* heap);
void hak_heap_purge(hak_heap_t* heap, uint32_t now_ms, bool all);
void hak_heap_purge_if_due(hak_heap_t* heap, uint32_t now_ms);
void hak_heap_purge_by(hak_heap_t* heap, uint32_t due_ms);
void hak_segments_fork_child(hak_heap_t* survivor);

/* heap.c */
void* hak_heap_alloc(hak_heap_t* heap, size_t size);
void* hak_heap_alloc_home(hak_heap_t* heap, size_t size);
/* A realloc home freed, or grown past its unit: it counts no more (a heap
 * that took over another's pages did not count those). */
HAK_INLINE void hak_heap_home_gone(hak_heap_t* heap, hak_page_t* page) {
  page->home = 0;
  if (heap->homes > 0) heap->homes--;
}
void hak_heap_free_local(hak_heap_t* heap, hak_page_t* page, hak_block_t* b);
void hak_heap_page_empty(hak_heap_t* heap, hak_page_t* page);
void hak_heap_flush_empty(hak_heap_t* heap);
hak_heap_t* hak_thread_heap_init(void);
void hak_thread_heap_done(hak_heap_t* heap);
void* hak_alloc_on_dead_thread(size_t size);
void hak_heaps_lock(void);
void hak_heaps_unlock(void);
bool hak_heap_absorb_abandoned(hak_heap_t* heap);
void hak_heaps_collect_spare(hak_heap_t* heap);
void hak_heaps_sweep(hak_heap_t* self, uint32_t now_ms, bool all);
size_t hak_segments_held(hak_heap_t* heap);
void hak_thread_register(hak_heap_t* heap);

/* remote.c */
void hak_remote_push(hak_heap_t* heap, hak_block_t* b);
void hak_remote_push_chain(hak_heap_t* heap, hak_block_t* first, hak_block_t* last);
void hak_remote_free(hak_heap_t* self, hak_heap_t* owner, const hak_page_t* page, hak_block_t* b);
void hak_remote_flush(hak_heap_t* self);
void hak_remote_collect(hak_heap_t* heap);
void hak_remote_collect_from(hak_heap_t* heap, hak_heap_t* from);
void hak_remote_collect_list(hak_heap_t* heap, hak_block_t* list);
void hak_remote_collect_stack(hak_heap_t* heap, hak_block_t* stack);
void hak_remote_take_reclaimed(hak_heap_t* heap, hak_heap_t* from);
size_t hak_remote_sweep(hak_heap_t* heap, size_t budget);
void hak_remote_sweep_end(hak_heap_t* heap);
size_t hak_remote_swept_held(hak_heap_t* heap);
/* A slow path of heap's thread: it is not dormant. */
HAK_INLINE void hak_heap_note_slow(hak_heap_t* heap) {
  atomic_store_explicit(&heap->slow_calls, atomic_load_explicit(&heap->slow_calls, memory_order_relaxed) + 1,
                        memory_order_relaxed);
}
HAK_INLINE bool hak_remote_pending(hak_heap_t* heap) {
  return atomic_load_explicit(&heap->remote, memory_order_relaxed) != NULL ||
         atomic_load_explicit(&heap->reclaimed, memory_order_relaxed) != NULL;
}

/* huge.c */
/* Secure build: a free run of the huge-block arena keeps the guard pages at
 * its two ends and at most this many inside (blocks that start or end where
 * earlier ones did find theirs in place); beyond, they are lifted, so that
 * the guards of free granules do not multiply the kernel's mappings. */
#define HAK_ARENA_GUARDS_KEPT 8
void* hak_huge_alloc(size_t size, size_t align, bool zero);
void hak_huge_lock(void);
void hak_huge_unlock(void);
void hak_huge_free(hak_segment_t* seg);
bool hak_huge_cache_flush(void);
void hak_huge_purge_if_due(uint32_t now_ms);
void hak_caches_purge_if_due(uint32_t now_ms);
void hak_huge_purge_for_growth(void);
hak_segment_t* hak_huge_take_granule(void);
void hak_huge_arena_info(size_t* reserved, size_t* dirty_bytes, size_t* free_bytes);
bool hak_huge_arena_free_at(const void* p);
size_t hak_huge_usable(hak_segment_t* seg, const void* p);
void* hak_huge_realloc(hak_segment_t* seg, void* p, size_t size);

/* prof.c: the sampling heap profiler. */
extern _Atomic size_t hak_prof_live; /* samples live now */
extern __thread bool hak_prof_busy __attribute__((tls_model("initial-exec")));
void hak_prof_prepare(void);
void hak_prof_signal_update(void);
void hak_prof_arm(hak_heap_t* heap);
void* hak_prof_alloc(hak_heap_t* heap, size_t size);
void hak_prof_huge(void* p, size_t size);
void hak_prof_forget(const void* p);
void hak_prof_moved(const void* from, const void* to, size_t size);
void hak_prof_lock(void);
void hak_prof_unlock(void);
void hak_prof_at_exit(void);
/* Counts size down on a thread heap's countdown, unless the fast path did
 * (it leaves the countdown below zero when it finds a sample due); true if
 * a sample is due. */
HAK_INLINE bool hak_prof_due(hak_heap_t* heap, size_t size) {
  if (heap->prof_left >= 0) heap->prof_left -= size > HAK_SIZE_LIMIT ? 0 : (int64_t)size;
  return heap->prof_left < 0;
}
/* Whether a block's forget is needed: only while samples live. */
HAK_INLINE bool hak_prof_has_samples(void) {
  return atomic_load_explicit(&hak_prof_live, memory_order_relaxed) != 0;
}
/* Marks the page of a block handed out at an inner address (aligned or
 * sampled), so that its free finds the start. */
HAK_INLINE void hak_page_mark_inner(void* p) {
  hak_page_t* page = hak_page_of(hak_segment_of(p), p);
  __atomic_store_n(&page->has_aligned, 1, __ATOMIC_RELAXED);
}

/* Marks the page of a sampled large block: its div_magic of 0 (which large
 * pages otherwise never have) sends the block's free to the slow path. */
HAK_INLINE void hak_page_mark_sampled(void* p) {
  hak_page_t* page = hak_page_of(hak_segment_of(p), p);
  __atomic_store_n(&page->div_magic, 0, __ATOMIC_RELAXED);
}
HAK_INLINE bool hak_page_is_sampled(const hak_page_t* page) {
  return page->cls == HAK_CLASS_LARGE && __atomic_load_n(&page->div_magic, __ATOMIC_RELAXED) == 0;
}

/* alloc.c: the whole family, behind the public names. */
void* hak_alloc_aligned(size_t align, size_t size);
size_t hak_usable(const void* p);

/* init.c */
void hak_process_init(void);

/* Fork handlers (init.c) are registered as a process's first thread is
 * made, or as the program registers its own (override.c's stand-in for
 * __register_atfork: hakmem's go first), not at start: pthread_atfork maps
 * 64 KiB of libc text that a single-threaded program would not touch, and a
 * process with one thread needs no handler (no other thread can hold a lock
 * across its fork, and the child's thread keeps the parent's id).  glibc's
 * pthread_create clears __libc_single_threaded and then, before the thread
 * exists, callocs the new thread's TLS vector through us: calloc registers
 * them there, so no fork can find a lock taken by a thread that registered
 * too late (glibc skips handlers registered while a fork runs;
 * tests/test_fork_start.c). */
extern _Atomic bool hak_fork_handlers_on;
void hak_fork_handlers_register(void);
void hak_fork_watch_thread(void);
void* hak_drop_in_calloc(void);
int hak_libc_register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void));
#if HAK_LAZY_FORK_HANDLERS
HAK_INLINE void hak_fork_watch(void) {
  if (unlikely(!atomic_load_explicit(&hak_fork_handlers_on, memory_order_relaxed) && !__libc_single_threaded))
    hak_fork_handlers_register();
}
#else
#define hak_fork_watch() ((void)0)
#endif

/* secure.c (the secure build only) */
void hak_secure_init(void);
hak_block_t* hak_secure_carve(uint8_t* first, uint32_t bs, uint32_t n, hak_block_t* tail);

/* stats.c: slow-path and OS counters, always on (relaxed atomics). */
typedef struct hak_counters_s {
  _Atomic size_t mmap_calls, munmap_calls, madvise_calls, mremap_calls;
  _Atomic size_t mapped_bytes, purged_bytes;
  /* Units given back because they stayed free for the purge delay, and units
   * taken again soon after that (a longer delay would have kept them): what
   * the delay costs in memory and in page faults (learn.c). */
  _Atomic size_t idle_purged_units, refaulted_units, learner_changes;
  /* Memory of segments in use or kept backed: headers, units in pages and
   * free units not purged yet (huge blocks are counted apart).  An upper
   * bound of what is resident: pages are touched as they are carved. */
  _Atomic size_t committed_bytes, peak_committed_bytes;
  /* The same peak, restarted when the huge arena is flushed (malloc_trim, a
   * mapping refused), not by hak_stats_reset: the huge arena's budget
   * (hak_committed_headroom). */
  _Atomic size_t budget_peak_bytes;
  _Atomic size_t lookup_failures; /* pointers freed or sized that hakmem does not own */
  _Atomic size_t segments, pages, huge_allocs, heaps, heaps_adopted;
  _Atomic size_t huge_live, huge_live_bytes; /* huge blocks out now, and their mappings */
  _Atomic size_t reclaimed_pages; /* full pages of dormant heaps freed whole by others, purged */
  _Atomic size_t sweep_walked;    /* blocks of their lists the sweeps read */
} hak_counters_t;
extern hak_counters_t hak_counters;
#define hak_count(field, n) atomic_fetch_add_explicit(&hak_counters.field, (n), memory_order_relaxed)
#define hak_uncount(field, n) atomic_fetch_sub_explicit(&hak_counters.field, (n), memory_order_relaxed)
void hak_committed_add(size_t bytes);
void hak_committed_sub(size_t bytes);
size_t hak_committed_headroom(void);
void hak_committed_peak_restart(void);
void hak_stats_at_exit(int fd);
void hak_stats_report_fd(int fd);
void hak_heaps_each(void (*fn)(hak_heap_t* heap, void* arg), void* arg);
size_t hak_huge_cached_bytes(void);

/* What hakmem holds now (mallinfo, malloc_stats): a snapshot taken while
 * other threads may be allocating, so not exact under concurrency. */
struct hak_usage_s {
  size_t segments;        /* segments held by heaps */
  size_t cached_segments; /* free segments kept for reuse */
  size_t pages;           /* pages in those segments */
  size_t in_use_bytes;    /* bytes of the blocks handed out in them */
  size_t free_unit_bytes; /* bytes of their free units */
  size_t huge_blocks;     /* huge blocks handed out */
  size_t huge_bytes;      /* bytes mapped for them */
  size_t class_pages[HAK_STAT_CLASSES]; /* pages of each class (and of large blocks) */
  size_t class_live[HAK_STAT_CLASSES];  /* blocks of each handed out */
  size_t class_free[HAK_STAT_CLASSES];  /* blocks that fit in those pages and are not handed out */
  size_t class_free_bytes[HAK_STAT_CLASSES]; /* their bytes */
};
void hak_usage_get(hak_usage_t* usage);
bool hak_trim(void);

#endif
