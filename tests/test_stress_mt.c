/* test_stress_mt: random allocation traffic from several threads with
 * content verification.  Every block is filled with a pattern derived from
 * its address, size and a seed, and checked before it is freed or resized.
 * About a third of the frees are cross-thread (blocks are sent to the next
 * thread's inbox, or swapped through shared atomic slots), and threads run in waves: each wave's blocks outlive
 * its threads and are inherited, checked and freed by the next wave and
 * finally by the main thread.
 *
 * Built twice: with STRESS_HAK_API through hak_malloc & co (hakmem_api, also
 * under ThreadSanitizer), otherwise through malloc & co (libhakmem.so).
 * Usage: test_stress_mt [total_ops] */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "test_util.h"

#ifdef STRESS_HAK_API
#include "hakmem.h"
#define A_MALLOC(n) hak_malloc(n)
#define A_CALLOC(c, n) hak_calloc(c, n)
#define A_REALLOC(p, n) hak_realloc(p, n)
#define A_FREE(p) hak_free(p)
#define A_USABLE(p) hak_usable_size(p)
#define A_NAME "test_stress_mt_hak"
static void* a_aligned(size_t align, size_t n, unsigned how) {
  (void)how;
  return hak_aligned_alloc(align, n);
}
#else
#define A_MALLOC(n) malloc(n)
#define A_CALLOC(c, n) calloc(c, n)
#define A_REALLOC(p, n) realloc(p, n)
#define A_FREE(p) free(p)
#define A_USABLE(p) malloc_usable_size(p)
#define A_NAME "test_stress_mt"
static void* a_aligned(size_t align, size_t n, unsigned how) {
  void* p = NULL;
  switch (how % 3) {
    case 0:
      if (posix_memalign(&p, align, n) != 0) p = NULL;
      return p;
    case 1:
      return aligned_alloc(align, n);
    default:
      return memalign(align, n);
  }
}
#endif

#if defined(__SANITIZE_THREAD__)
#define DEFAULT_OPS 480000
#else
#define DEFAULT_OPS 2400000
#endif

enum {
  NT = 4,        /* threads per wave */
  NW = 8,        /* waves */
  WS = 512,      /* local slots per thread index (inherited across waves) */
  XS = 128,      /* shared exchange slots */
  FULL = 65536,  /* blocks up to this size are filled and checked entirely */
  EDGE = 4096,   /* bigger blocks: both ends entirely, one word per EDGE between */
};

typedef struct rec {
  unsigned char* p;
  size_t size;
  size_t align;
  uint64_t key;
  long owner; /* id of the thread that allocated it (for the statistics) */
  struct rec* next; /* link in an inbox */
} rec;

static rec* slots[NT][WS];
static _Atomic(rec*) xch[XS];
/* Per thread index: blocks sent by the previous thread index (a lock-free
 * stack, drained whole).  Every block sent is freed by another thread. */
static _Atomic(rec*) inbox[NT];
static atomic_long failures;
static atomic_long cross_frees, local_frees;
static long ops_per_thread;

static void fail(const char* what, const rec* b, size_t off) {
  long n = atomic_fetch_add(&failures, 1);
  if (n < 20)
    fprintf(stderr, "check failed: %s: block %p size %zu align %zu offset %zu\n", what,
            (void*)b->p, b->size, b->align, off);
}

/* Pattern positions: all bytes of small blocks; for big ones, the first and
 * last EDGE bytes and one 8-byte word every EDGE bytes in between. */
static void fill(unsigned char* p, size_t n, uint64_t key) {
  if (n <= FULL) {
    hak_pattern_fill(p, n, key);
    return;
  }
  hak_pattern_fill(p, EDGE, key);
  for (size_t off = EDGE; off + 8 <= n - EDGE; off += EDGE) {
    uint64_t w = hak_mix64(key ^ off);
    memcpy(p + off, &w, 8);
  }
  hak_pattern_fill(p + n - EDGE, EDGE, key ^ 0xE1D);
}

/* Checks the pattern of a block of size n at positions below `limit`;
 * returns the first bad offset, or SIZE_MAX. */
static size_t check(const unsigned char* p, size_t n, size_t limit, uint64_t key) {
  if (limit > n) limit = n;
  if (n <= FULL) {
    size_t bad = hak_pattern_check(p, limit, key);
    return bad == limit ? SIZE_MAX : bad;
  }
  size_t head = limit < EDGE ? limit : EDGE;
  size_t bad = hak_pattern_check(p, head, key);
  if (bad != head) return bad;
  for (size_t off = EDGE; off + 8 <= n - EDGE && off + 8 <= limit; off += EDGE) {
    uint64_t w = hak_mix64(key ^ off), v;
    memcpy(&v, p + off, 8);
    if (v != w) return off;
  }
  if (limit > n - EDGE) {
    size_t len = limit - (n - EDGE);
    bad = hak_pattern_check(p + n - EDGE, len, key ^ 0xE1D);
    if (bad != len) return n - EDGE + bad;
  }
  return SIZE_MAX;
}

static uint64_t key_of(const void* p, size_t n, uint64_t seed) {
  return hak_mix64((uintptr_t)p ^ (n * 0x9E3779B97F4A7C15ull) ^ seed);
}

static int verify(const rec* b) {
  if (!hak_is_aligned(b->p, b->align)) {
    fail("misaligned", b, 0);
    return 0;
  }
  if (A_USABLE(b->p) < b->size) {
    fail("usable size below the request", b, A_USABLE(b->p));
    return 0;
  }
  size_t bad = check(b->p, b->size, b->size, b->key);
  if (bad != SIZE_MAX) {
    fail("content corrupted", b, bad);
    return 0;
  }
  return 1;
}

static size_t pick_size(hak_rng* r) {
  unsigned u = (unsigned)(hak_rng_next(r) % 10000);
  if (u < 6000) return hak_rng_range(r, 1, 128);
  if (u < 8500) return hak_rng_range(r, 129, 1024);
  if (u < 9700) return hak_rng_range(r, 1025, 8192);
  if (u < 9985) return hak_rng_range(r, 8193, 65536);
  return hak_rng_range(r, 65537, (size_t)4 << 20);
}

static rec* make(hak_rng* r, long t, uint64_t seed) {
  rec* b = A_MALLOC(sizeof(rec));
  if (!b) {
    atomic_fetch_add(&failures, 1);
    return NULL;
  }
  size_t n = pick_size(r);
  unsigned how = (unsigned)(hak_rng_next(r) % 1000);
  b->align = 16;
  if (how < 20) {
    /* A few aligned allocations, 16 B to 64 KiB. */
    b->align = (size_t)16 << hak_rng_range(r, 0, 12);
    b->p = a_aligned(b->align, n, how);
  } else if (how < 120) {
    b->p = A_CALLOC(1, n);
    if (b->p && !hak_all_bytes(b->p, n, 0)) {
      b->size = n;
      fail("calloc block not zeroed", b, 0);
    }
  } else {
    b->p = A_MALLOC(n);
  }
  if (!b->p) {
    b->size = n;
    fail("allocation returned NULL", b, 0);
    A_FREE(b);
    return NULL;
  }
  b->size = n;
  b->owner = t;
  b->key = key_of(b->p, n, seed);
  fill(b->p, n, b->key);
  return b;
}

static void release(rec* b, long t) {
  verify(b);
  if (b->owner == t)
    atomic_fetch_add_explicit(&local_frees, 1, memory_order_relaxed);
  else
    atomic_fetch_add_explicit(&cross_frees, 1, memory_order_relaxed);
  A_FREE(b->p);
  A_FREE(b);
}

static void resize(rec* b, hak_rng* r, uint64_t seed) {
  if (!verify(b)) return;
  size_t n = pick_size(r);
  unsigned char* q = A_REALLOC(b->p, n);
  if (!q) {
    fail("realloc returned NULL", b, n);
    return;
  }
  size_t keep = n < b->size ? n : b->size;
  size_t bad = check(q, b->size, keep, b->key);
  if (bad != SIZE_MAX) fail("realloc lost content", b, bad);
  b->p = q;
  b->size = n;
  b->align = 16;
  b->key = key_of(q, n, seed);
  fill(q, n, b->key);
}

static void send(int to, rec* b) {
  rec* head = atomic_load_explicit(&inbox[to], memory_order_relaxed);
  do {
    b->next = head;
  } while (!atomic_compare_exchange_weak_explicit(&inbox[to], &head, b, memory_order_release,
                                                  memory_order_relaxed));
}

static void drain(int t, long id) {
  rec* b = atomic_exchange_explicit(&inbox[t], NULL, memory_order_acquire);
  while (b) {
    rec* next = b->next;
    release(b, id);
    b = next;
  }
}

typedef struct {
  int wave, t;
} targ;

static void* worker(void* arg) {
  targ* a = arg;
  int t = a->t;
  long id = (long)a->wave * NT + t + 1;
  uint64_t seed = (uint64_t)id * 1000003u;
  hak_rng r;
  hak_rng_seed(&r, seed);
  rec** mine = slots[t];
  for (long op = 0; op < ops_per_thread; op++) {
    int i = (int)(hak_rng_next(&r) % WS);
    rec* b = mine[i];
    if (!b) {
      mine[i] = make(&r, id, seed + (uint64_t)op);
      continue;
    }
    if ((op & 63) == 0) drain(t, id);
    unsigned u = (unsigned)(hak_rng_next(&r) % 100);
    if (u < 20) {
      /* Sent to the next thread index: freed there, by this wave's thread
       * or by a later one, or by the main thread. */
      send((t + 1) % NT, b);
      mine[i] = NULL;
    } else if (u < 42) {
      /* Swap with a shared slot: ours goes to whoever takes it next; the one
       * we get (allocated by another thread, often an exited one) is freed
       * now or kept and freed or resized later. */
      int j = (int)(hak_rng_next(&r) % XS);
      rec* got = atomic_exchange(&xch[j], b);
      mine[i] = NULL;
      if (got) {
        if (hak_rng_next(&r) % 4 != 0)
          release(got, id);
        else if (verify(got))
          mine[i] = got;
      }
    } else if (u < 50) {
      resize(b, &r, seed + (uint64_t)op);
    } else {
      release(b, id);
      mine[i] = NULL;
    }
  }
  return NULL;
}

int main(int argc, char** argv) {
#ifdef STRESS_HAK_API
  {
    Dl_info self, mine;
    REQUIRE(dladdr((void*)&main, &self) && dladdr((void*)&hak_malloc, &mine));
    REQUIRE(strcmp(self.dli_fname, mine.dli_fname) == 0);
  }
#else
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("malloc");
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("free");
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("realloc");
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("posix_memalign");
#endif
  long total = argc > 1 ? atol(argv[1]) : DEFAULT_OPS;
  ops_per_thread = total / (NT * NW);
  if (ops_per_thread < 1) ops_per_thread = 1;

  for (int w = 0; w < NW; w++) {
    pthread_t th[NT];
    targ args[NT];
    for (int t = 0; t < NT; t++) {
      args[t].wave = w;
      args[t].t = t;
      REQUIRE(pthread_create(&th[t], NULL, worker, &args[t]) == 0);
    }
    for (int t = 0; t < NT; t++) REQUIRE(pthread_join(th[t], NULL) == 0);
    /* Between waves: every surviving block is intact; the main thread frees
     * a quarter of them (blocks of threads that have exited). */
    for (int t = 0; t < NT; t++)
      for (int i = 0; i < WS; i++) {
        rec* b = slots[t][i];
        if (!b) continue;
        if ((i & 3) == (w & 3)) {
          release(b, -1);
          slots[t][i] = NULL;
        } else {
          verify(b);
        }
      }
    for (int j = w & 1; j < XS; j += 2) {
      rec* b = atomic_exchange(&xch[j], NULL);
      if (b) release(b, -1);
    }
    /* Inboxes are left to the next wave, except one drained here. */
    drain(w % NT, -1);
  }
  for (int t = 0; t < NT; t++)
    for (int i = 0; i < WS; i++)
      if (slots[t][i]) release(slots[t][i], -1);
  for (int j = 0; j < XS; j++) {
    rec* b = atomic_exchange(&xch[j], NULL);
    if (b) release(b, -1);
  }
  for (int t = 0; t < NT; t++) drain(t, -1);
  long cross = atomic_load(&cross_frees), local = atomic_load(&local_frees);
  printf("%s: %ld ops, %ld frees, %ld cross-thread (%.0f%%)\n", A_NAME, ops_per_thread * NT * NW,
         cross + local, cross, 100.0 * (double)cross / (double)(cross + local + 1));
  /* The traffic really is mixed: a good share of frees are cross-thread
   * (the blocks sent to inboxes alone make a quarter, whatever the
   * scheduling). */
  CHECK(cross * 5 > cross + local);
  if (atomic_load(&failures)) {
    fprintf(stderr, "%ld failed checks\n", atomic_load(&failures));
    hak_test_failures++;
  }
  return hak_test_result(A_NAME);
}
