/* test_api_hak: the prefixed API of include/hakmem.h, linked from the
 * hakmem_api static library beside glibc's malloc (which stays the process
 * allocator).  The same semantic checks as test_api, plus blocks passed
 * between threads (this test also runs under ThreadSanitizer). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hakmem.h"
#include "harness.h"
#include "test_util.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#if defined(__SANITIZE_THREAD__)
#define HAK_TSAN 1
#else
#define HAK_TSAN 0
#endif

static void expect_null(void* p, int err, int want, const char* what) {
  if (p != NULL || err != want) {
    fprintf(stderr, "check failed: %s returned %p errno %d (%s), want NULL/%s\n", what, p, err,
            strerror(err), strerror(want));
    hak_test_failures++;
  }
  if (p) hak_free(p);
}

#define EXPECT_NULL(call, want)           \
  do {                                    \
    errno = 0;                            \
    void* r_ = (call);                    \
    int e_ = errno;                       \
    hak_escape(r_);                       \
    expect_null(r_, e_, want, #call);     \
  } while (0)

static size_t usable_size(void* p) { return hak_usable_size(p); }
#define check_block(p, n, align, what) hak_check_block(p, n, align, what, usable_size)

/* hak_* come from the static library in this executable; malloc stays the
 * system allocator's. */
static void test_linkage(void) {
  Dl_info self, mine;
  REQUIRE(dladdr((void*)&test_linkage, &self) != 0);
  REQUIRE(dladdr((void*)&hak_malloc, &mine) != 0);
  REQUIRE(self.dli_fname && mine.dli_fname && strcmp(self.dli_fname, mine.dli_fname) == 0);
  const char* m = hak_symbol_object("malloc");
  if (hak_is_hakmem_object(m)) {
    fprintf(stderr, "check failed: malloc resolves into %s in a hakmem_api program\n", m);
    hak_test_failures++;
  }
  const char* slash = strrchr(self.dli_fname, '/');
  CHECK(strcmp(m, slash ? slash + 1 : self.dli_fname) != 0);
}

static void test_edges(void) {
  void* p = hak_malloc(hak_opaque(0));
  CHECK(p != NULL);
  hak_free(p);
  void* z[16];
  for (int i = 0; i < 16; i++) {
    z[i] = hak_malloc(hak_opaque(0));
    CHECK(z[i] != NULL);
    for (int j = 0; j < i; j++) CHECK(z[i] != z[j]);
  }
  for (int i = 0; i < 16; i++) hak_free(z[i]);
  hak_free(NULL);
  CHECK(hak_usable_size(NULL) == 0);

  EXPECT_NULL(hak_malloc(hak_opaque(SIZE_MAX)), ENOMEM);
  EXPECT_NULL(hak_malloc(hak_opaque(SIZE_MAX - 4096)), ENOMEM);
  EXPECT_NULL(hak_malloc(hak_opaque((size_t)PTRDIFF_MAX + 1)), ENOMEM);
  EXPECT_NULL(hak_malloc(hak_opaque((size_t)PTRDIFF_MAX)), ENOMEM);
  EXPECT_NULL(hak_malloc(hak_opaque((size_t)1 << 62)), ENOMEM);

  EXPECT_NULL(hak_calloc(hak_opaque(SIZE_MAX / 2 + 1), hak_opaque(2)), ENOMEM);
  EXPECT_NULL(hak_calloc(hak_opaque((size_t)1 << 33), hak_opaque((size_t)1 << 33)), ENOMEM);
  EXPECT_NULL(hak_calloc(hak_opaque(SIZE_MAX), hak_opaque(SIZE_MAX)), ENOMEM);
  EXPECT_NULL(hak_calloc(hak_opaque(1), hak_opaque(SIZE_MAX)), ENOMEM);
  p = hak_calloc(hak_opaque(0), hak_opaque(SIZE_MAX));
  CHECK(p != NULL);
  hak_free(p);
  p = hak_calloc(hak_opaque(0), hak_opaque(0));
  CHECK(p != NULL);
  hak_free(p);

  static const size_t bad[] = {0, 3, 5, 6, 12, 24, 48, 100, 1000, 4097, (size_t)3 << 20, SIZE_MAX};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    errno = 0;
    p = hak_aligned_alloc(hak_opaque(bad[i]), 64);
    int e = errno;
    if (p != NULL || e != EINVAL) {
      fprintf(stderr, "check failed: hak_aligned_alloc(%zu, 64) = %p errno %d, want NULL/EINVAL\n",
              bad[i], p, e);
      hak_test_failures++;
    }
    if (p) hak_free(p);
  }
  EXPECT_NULL(hak_aligned_alloc(16, hak_opaque(SIZE_MAX)), ENOMEM);
  EXPECT_NULL(hak_aligned_alloc(4096, hak_opaque(SIZE_MAX - 100)), ENOMEM);
  EXPECT_NULL(hak_aligned_alloc((size_t)1 << 22, hak_opaque(SIZE_MAX - ((size_t)1 << 21))), ENOMEM);
  EXPECT_NULL(hak_aligned_alloc(64, hak_opaque((size_t)PTRDIFF_MAX + 1)), ENOMEM);

  /* hak_realloc(NULL, n) is hak_malloc(n); hak_realloc(p, 0) frees and
   * returns NULL or returns a freeable block. */
  p = hak_realloc(NULL, 100);
  check_block(p, 100, 16, "hak_realloc(NULL)");
  hak_free(p);
  p = hak_realloc(NULL, hak_opaque(0));
  CHECK(p != NULL);
  hak_free(p);
  EXPECT_NULL(hak_realloc(NULL, hak_opaque(SIZE_MAX)), ENOMEM);
  static const size_t sizes[] = {1, 100, 5000, 100000, 3 * MiB};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    p = hak_malloc(sizes[i]);
    CHECK(p != NULL);
    void* q = hak_realloc(p, hak_opaque(0));
    if (q) hak_free(q);
  }
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    size_t n = sizes[i];
    p = hak_malloc(n);
    if (!p) {
      CHECK(p != NULL);
      continue;
    }
    hak_pattern_fill(p, n, n);
    EXPECT_NULL(hak_realloc(hak_launder(p), hak_opaque(SIZE_MAX)), ENOMEM);
    EXPECT_NULL(hak_realloc(hak_launder(p), hak_opaque((size_t)PTRDIFF_MAX + 1)), ENOMEM);
    CHECK(hak_pattern_check(p, n, n) == n);
    hak_free(p);
  }
}

static void test_calloc_reuse(void) {
  static const size_t sizes[] = {1,      16,     24,     48,     64,     100,     128,    256,
                                 500,    1024,   2048,   4096,   5000,   8192,    16384,  32768,
                                 65536,  65537,  100000, 262144, MiB - 1, MiB,    MiB + 1,
                                 2 * MiB, 3 * MiB, 4 * MiB, 8 * MiB};
  void* blocks[64];
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    size_t n = sizes[s];
    int count = n <= 4096 ? 64 : n <= 131072 ? 16 : 4;
    for (int i = 0; i < count; i++) {
      blocks[i] = hak_malloc(n);
      CHECK(blocks[i] != NULL);
      if (blocks[i]) memset(blocks[i], 0xAB, hak_usable_size(blocks[i]));
    }
    for (int i = 0; i < count; i++) hak_free(blocks[i]);
    for (int i = 0; i < count; i++) {
      blocks[i] = (i & 1) && n % 8 == 0 ? hak_calloc(n / 8, 8) : hak_calloc(1, n);
      if (!blocks[i]) {
        fprintf(stderr, "check failed: hak_calloc(%zu) returned NULL\n", n);
        hak_test_failures++;
      } else if (!hak_all_bytes(blocks[i], n, 0)) {
        fprintf(stderr, "check failed: hak_calloc(%zu) not zeroed after reuse\n", n);
        hak_test_failures++;
      }
    }
    for (int i = 0; i < count; i++) hak_free(blocks[i]);
  }
}

static void test_alignment(void) {
  /* Every size 1..4096 live together: 16-byte aligned, disjoint. */
  static unsigned char* blk[4097];
  for (size_t n = 1; n <= 4096; n++) {
    blk[n] = hak_malloc(n);
    if (!blk[n] || !hak_is_aligned(blk[n], 16)) {
      fprintf(stderr, "check failed: hak_malloc(%zu) = %p not 16-byte aligned\n", n, (void*)blk[n]);
      hak_test_failures++;
      continue;
    }
    memset(blk[n], (int)(n * 29 & 0xff), n);
  }
  for (size_t n = 1; n <= 4096; n++) {
    if (blk[n] && !hak_all_bytes(blk[n], n, (unsigned char)(n * 29 & 0xff))) {
      fprintf(stderr, "check failed: hak_malloc(%zu) block overlaps another\n", n);
      hak_test_failures++;
    }
    hak_free(blk[n]);
  }

  static const size_t sizes[] = {0, 1, 100, 4096, MiB, 5 * MiB};
  enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
  for (size_t align = 1; align <= 4 * MiB; align <<= 1) {
    void* b[NS];
    size_t u[NS];
    for (int s = 0; s < NS; s++) {
      b[s] = hak_aligned_alloc(align, sizes[s]);
      u[s] = check_block(b[s], sizes[s], align, "hak_aligned_alloc") ? hak_usable_size(b[s]) : 0;
      if (b[s]) hak_pattern_fill(b[s], u[s], align + (size_t)s);
    }
    for (int s = 0; s < NS; s++) {
      if (b[s] && hak_pattern_check(b[s], u[s], align + (size_t)s) != u[s]) {
        fprintf(stderr, "check failed: aligned block (align %zu size %zu) overwritten\n", align,
                sizes[s]);
        hak_test_failures++;
      }
      hak_free(b[s]);
    }
  }
}

static void test_usable_size(void) {
  enum { RING = 16 };
  void* ring[RING] = {0};
  size_t use[RING] = {0};
  int k = 0;
  size_t limit = HAK_TSAN ? 20000 : 70000;
  for (size_t n = 0; n <= limit; n += n < 1100 ? 1 : 13) {
    if (ring[k]) {
      if (hak_pattern_check(ring[k], use[k], (uintptr_t)ring[k]) != use[k]) {
        fprintf(stderr, "check failed: block %p (usable %zu) overwritten\n", ring[k], use[k]);
        hak_test_failures++;
      }
      hak_free(ring[k]);
      ring[k] = NULL;
    }
    void* p = hak_malloc(n);
    size_t u = p ? hak_usable_size(p) : 0;
    if (!p || u < n) {
      fprintf(stderr, "check failed: hak_malloc(%zu) = %p usable %zu\n", n, p, u);
      hak_test_failures++;
      hak_free(p);
    } else {
      hak_pattern_fill(p, u, (uintptr_t)p);
      ring[k] = p;
      use[k] = u;
    }
    k = (k + 1) % RING;
  }
  for (int i = 0; i < RING; i++) hak_free(ring[i]);
  static const size_t big[] = {MiB, 2 * MiB - 1, 2 * MiB + 1, 4 * MiB + 17, 9 * MiB, 33 * MiB};
  for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
    void* p = hak_malloc(big[i]);
    check_block(p, big[i], 16, "hak_malloc");
    hak_free(p);
  }
}

static void test_realloc(void) {
  static const size_t steps[] = {16,       1 * KiB, 64 * KiB, 1 * MiB, 64 * MiB, 128 * MiB,
                                 64 * MiB, 1 * MiB, 64 * KiB, 1 * KiB, 16,       1};
  for (int blockers = 0; blockers < 2; blockers++) {
    unsigned char* p = NULL;
    size_t cur = 0;
    void* bl[16];
    int nb = 0;
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
      size_t n = steps[i];
      unsigned char* q = hak_realloc(p, n);
      if (!q) {
        fprintf(stderr, "check failed: hak_realloc(%zu -> %zu) returned NULL\n", cur, n);
        hak_test_failures++;
        break;
      }
      size_t keep = cur < n ? cur : n;
      size_t bad = hak_pattern_check(q, keep, 21);
      if (bad != keep) {
        fprintf(stderr, "check failed: hak_realloc %zu -> %zu lost content at %zu\n", cur, n, bad);
        hak_test_failures++;
      }
      CHECK(hak_usable_size(q) >= n);
      if (n > keep) hak_pattern_fill(q, n, 21);
      p = q;
      cur = n;
      if (blockers && nb < 16) bl[nb++] = hak_malloc(n < 4096 ? n : 64);
    }
    hak_free(p);
    for (int i = 0; i < nb; i++) hak_free(bl[i]);
  }
  hak_rng r;
  hak_rng_seed(&r, 77);
  unsigned char* p = NULL;
  size_t cur = 0;
  for (int i = 0; i < (HAK_TSAN ? 500 : 3000); i++) {
    int shift = (int)hak_rng_range(&r, 0, 22);
    size_t n = hak_rng_range(&r, 1, (size_t)1 << shift);
    unsigned char* q = hak_realloc(p, n);
    if (!q) {
      fprintf(stderr, "check failed: hak_realloc(%zu) returned NULL\n", n);
      hak_test_failures++;
      break;
    }
    size_t keep = cur < n ? cur : n;
    if (hak_pattern_check(q, keep, 22) != keep) {
      fprintf(stderr, "check failed: random hak_realloc %zu -> %zu lost content\n", cur, n);
      hak_test_failures++;
    }
    hak_pattern_fill(q, n, 22);
    p = q;
    cur = n;
  }
  hak_free(p);
  /* Aligned blocks can be reallocated. */
  for (size_t align = 16; align <= 2 * MiB; align <<= 3) {
    void* a = hak_aligned_alloc(align, 300);
    if (!a) {
      CHECK(a != NULL);
      continue;
    }
    hak_pattern_fill(a, 300, align);
    void* b = hak_realloc(a, 3 * MiB);
    CHECK(b != NULL);
    if (b) {
      CHECK(hak_pattern_check(b, 300, align) == 300);
      a = b;
    }
    hak_free(a);
  }
}

/* glibc's heap and hakmem's live side by side without disturbing each other. */
static void test_side_by_side(void) {
  enum { N = 512 };
  void* sys[N];
  void* hak[N];
  hak_rng r;
  hak_rng_seed(&r, 5);
  size_t ns[N], nh[N];
  for (int i = 0; i < N; i++) {
    ns[i] = hak_rng_range(&r, 1, 3000);
    nh[i] = hak_rng_range(&r, 1, 3000);
    sys[i] = malloc(ns[i]);
    hak[i] = hak_malloc(nh[i]);
    REQUIRE(sys[i] && hak[i]);
    hak_pattern_fill(sys[i], ns[i], 1000 + (uint64_t)i);
    hak_pattern_fill(hak[i], nh[i], 2000 + (uint64_t)i);
  }
  for (int i = 0; i < N; i += 2) {
    hak_free(hak[i]);
    free(sys[i]);
    hak[i] = hak_calloc(1, nh[i]);
    sys[i] = calloc(1, ns[i]);
    REQUIRE(sys[i] && hak[i]);
    hak_pattern_fill(sys[i], ns[i], 1000 + (uint64_t)i);
    hak_pattern_fill(hak[i], nh[i], 2000 + (uint64_t)i);
  }
  for (int i = 0; i < N; i++) {
    CHECK(hak_pattern_check(sys[i], ns[i], 1000 + (uint64_t)i) == ns[i]);
    CHECK(hak_pattern_check(hak[i], nh[i], 2000 + (uint64_t)i) == nh[i]);
    free(sys[i]);
    hak_free(hak[i]);
  }
}

/* Threads hand blocks to each other through atomic slots; each block is
 * verified and freed (or reallocated) by whichever thread takes it. */
enum { XT = 4, XSLOTS = 64 };
static _Atomic(uintptr_t) xslot[XSLOTS];
static atomic_int xfail;

/* Blocks carry their size and key in the first 16 bytes (sizes >= 16). */
typedef struct {
  size_t size;
  uint64_t key;
} xhdr;

static void* xmake(hak_rng* r, uint64_t key) {
  size_t n = hak_rng_range(r, 16, hak_rng_range(r, 0, 7) == 0 ? 70000 : 1024);
  unsigned char* p = (hak_rng_next(r) & 7) == 0 ? hak_aligned_alloc(64, n) : hak_malloc(n);
  if (!p) {
    atomic_fetch_add(&xfail, 1);
    return NULL;
  }
  xhdr h = {n, key};
  memcpy(p, &h, sizeof h);
  hak_pattern_fill(p + 16, n - 16, key);
  return p;
}

static int xverify(unsigned char* p) {
  xhdr h;
  memcpy(&h, p, sizeof h);
  if (hak_usable_size(p) < h.size || hak_pattern_check(p + 16, h.size - 16, h.key) != h.size - 16) {
    fprintf(stderr, "check failed: block %p (size %zu) handed between threads is corrupt\n",
            (void*)p, h.size);
    atomic_fetch_add(&xfail, 1);
    return 0;
  }
  return 1;
}

static void* xthread(void* arg) {
  int id = (int)(intptr_t)arg;
  hak_rng r;
  hak_rng_seed(&r, 100 + (uint64_t)id);
  int ops = HAK_TSAN ? 4000 : 40000;
  for (int i = 0; i < ops; i++) {
    unsigned char* mine = xmake(&r, ((uint64_t)id << 32) | (uint64_t)i);
    if (!mine) continue;
    int s = (int)hak_rng_range(&r, 0, XSLOTS - 1);
    unsigned char* got = (unsigned char*)atomic_exchange(&xslot[s], (uintptr_t)mine);
    if (!got) continue;
    if (!xverify(got)) continue;
    if (hak_rng_next(&r) & 1) {
      hak_free(got);
    } else {
      /* Grow or shrink a block another thread allocated, then free it. */
      xhdr h;
      memcpy(&h, got, sizeof h);
      size_t n = hak_rng_range(&r, 16, 5000);
      unsigned char* q = hak_realloc(got, n);
      if (!q) {
        atomic_fetch_add(&xfail, 1);
        hak_free(got);
        continue;
      }
      size_t keep = (n < h.size ? n : h.size) - 16;
      if (hak_pattern_check(q + 16, keep, h.key) != keep) {
        fprintf(stderr, "check failed: cross-thread hak_realloc lost content\n");
        atomic_fetch_add(&xfail, 1);
      }
      hak_free(q);
    }
  }
  return NULL;
}

static void test_threads(void) {
  pthread_t t[XT];
  for (int i = 0; i < XT; i++) REQUIRE(pthread_create(&t[i], NULL, xthread, (void*)(intptr_t)i) == 0);
  for (int i = 0; i < XT; i++) pthread_join(t[i], NULL);
  for (int s = 0; s < XSLOTS; s++) {
    unsigned char* p = (unsigned char*)atomic_exchange(&xslot[s], 0);
    if (p) {
      xverify(p);
      hak_free(p);
    }
  }
  if (atomic_load(&xfail)) {
    fprintf(stderr, "check failed: %d failures in the cross-thread section\n", atomic_load(&xfail));
    hak_test_failures++;
  }
}

int main(void) {
  test_linkage();
  test_edges();
  test_calloc_reuse();
  test_alignment();
  test_usable_size();
  test_realloc();
  test_side_by_side();
  test_threads();
  return hak_test_result("test_api_hak");
}
