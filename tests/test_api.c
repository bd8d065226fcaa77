/* test_api: the glibc-compatible entry points of hakmem (linked against
 * libhakmem.so, so malloc and friends resolve to hakmem; built again as
 * test_api_static with libhakmem.a linked in), with their edge cases: zero sizes, overflow, invalid alignments, usable sizes, realloc
 * across every size range, calloc zeroing of reused memory, C23 sized frees,
 * glibc's own names of the family (__libc_malloc ...) mixed with the others. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "test_util.h"

/* C23 names that glibc 2.36 does not declare; weak so that the file also
 * links against an allocator without them (the test then fails). */
void free_sized(void* ptr, size_t size) __attribute__((weak));
void free_aligned_sized(void* ptr, size_t alignment, size_t size) __attribute__((weak));
/* glibc's own names of the family, which its headers do not declare. */
void* __libc_malloc(size_t size);
void __libc_free(void* p);
void* __libc_calloc(size_t count, size_t size);
void* __libc_realloc(void* p, size_t size);
void* __libc_memalign(size_t align, size_t size);
void* __libc_valloc(size_t size);
void* __libc_pvalloc(size_t size);
int __posix_memalign(void** out, size_t align, size_t size);

#ifdef HAK_TEST_STATIC
#define TEST_NAME "test_api_static"
#else
#define TEST_NAME "test_api"
#endif

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static size_t page_size;

/* NULL with errno == ENOMEM, reported with the call's text. */
static void expect_enomem(void* p, int err, const char* what) {
  if (p != NULL || err != ENOMEM) {
    fprintf(stderr, "check failed: %s returned %p errno %d (%s), want NULL/ENOMEM\n", what, p,
            err, strerror(err));
    hak_test_failures++;
  }
  if (p) free(p);
}

#define EXPECT_ENOMEM(call)            \
  do {                                 \
    errno = 0;                         \
    void* r_ = (call);                 \
    int e_ = errno;                    \
    hak_escape(r_);                    \
    expect_enomem(r_, e_, #call);      \
  } while (0)

static size_t usable_size(void* p) { return malloc_usable_size(p); }
#define check_block(p, n, align, what) hak_check_block(p, n, align, what, usable_size)

static void test_symbols(void) {
  static const char* const syms[] = {
      "malloc",        "free",           "calloc",     "realloc",
      "reallocarray",  "posix_memalign", "aligned_alloc", "memalign",
      "valloc",        "pvalloc",        "malloc_usable_size", "free_sized",
      "free_aligned_sized", "__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc",
      "__libc_memalign", "__libc_valloc", "__libc_pvalloc", "__posix_memalign",
  };
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("malloc");
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) HAK_REQUIRE_SYMBOL_IN_HAKMEM(syms[i]);
}

static void test_malloc_edges(void) {
  void* p = malloc(hak_opaque(0));
  CHECK(p != NULL);
  hak_escape(p);
  free(p);
  /* Several zero-size blocks are distinct. */
  void* z[16];
  for (int i = 0; i < 16; i++) {
    z[i] = malloc(hak_opaque(0));
    CHECK(z[i] != NULL);
    for (int j = 0; j < i; j++) CHECK(z[i] != z[j]);
  }
  for (int i = 0; i < 16; i++) free(z[i]);

  free(NULL);
  CHECK(malloc_usable_size(NULL) == 0);

  EXPECT_ENOMEM(malloc(hak_opaque(SIZE_MAX)));
  EXPECT_ENOMEM(malloc(hak_opaque(SIZE_MAX - 1)));
  EXPECT_ENOMEM(malloc(hak_opaque(SIZE_MAX - 4096)));
  EXPECT_ENOMEM(malloc(hak_opaque(SIZE_MAX - 2 * MiB)));
  EXPECT_ENOMEM(malloc(hak_opaque((size_t)PTRDIFF_MAX + 1)));
  EXPECT_ENOMEM(malloc(hak_opaque((size_t)PTRDIFF_MAX)));
  EXPECT_ENOMEM(malloc(hak_opaque((size_t)1 << 62)));

  /* The allocator still works after the failures. */
  p = malloc(hak_opaque(100));
  check_block(p, 100, 16, "malloc");
  free(p);
}

static void test_calloc_edges(void) {
  EXPECT_ENOMEM(calloc(hak_opaque(SIZE_MAX / 2 + 1), hak_opaque(2)));
  EXPECT_ENOMEM(calloc(hak_opaque((size_t)1 << 33), hak_opaque((size_t)1 << 33)));
  EXPECT_ENOMEM(calloc(hak_opaque(SIZE_MAX), hak_opaque(SIZE_MAX)));
  EXPECT_ENOMEM(calloc(hak_opaque(2), hak_opaque(SIZE_MAX / 2 + 1)));
  EXPECT_ENOMEM(calloc(hak_opaque(1), hak_opaque(SIZE_MAX)));
  EXPECT_ENOMEM(calloc(hak_opaque(65537), hak_opaque((size_t)1 << 48)));
  EXPECT_ENOMEM(calloc(hak_opaque((size_t)PTRDIFF_MAX / 8 + 1), hak_opaque(8)));

  /* Zero-size products give freeable blocks (non-NULL, as glibc). */
  void* p = calloc(hak_opaque(0), hak_opaque(SIZE_MAX));
  CHECK(p != NULL);
  free(p);
  p = calloc(hak_opaque(SIZE_MAX), hak_opaque(0));
  CHECK(p != NULL);
  free(p);
  p = calloc(hak_opaque(0), hak_opaque(0));
  CHECK(p != NULL);
  free(p);

  p = calloc(hak_opaque(1000), hak_opaque(3));
  CHECK(p != NULL);
  if (p) {
    CHECK(hak_all_bytes(p, 3000, 0));
    CHECK(malloc_usable_size(p) >= 3000);
  }
  free(p);
}

/* calloc must zero memory that was dirty when freed, for every size range. */
static void test_calloc_reuse(void) {
  static const size_t sizes[] = {
      1,      8,      16,      24,      32,      40,      48,      64,      80,
      96,     112,    128,     160,     200,     256,     320,     384,     512,
      640,    768,    1000,    1024,    1500,    2048,    3000,    4096,    5000,
      8192,   10000,  16384,   20000,   32768,   50000,   65536,   65537,   100000,
      131072, 200000, 262144,  500000,  MiB - 1, MiB,     MiB + 1, 3 * MiB / 2,
      2 * MiB, 3 * MiB, 4 * MiB, 6 * MiB, 8 * MiB,
  };
  enum { MAXN = 64 };
  void* blocks[MAXN];
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    size_t n = sizes[s];
    int count = n <= 4096 ? 64 : n <= 131072 ? 16 : 4;
    for (int round = 0; round < 2; round++) {
      for (int i = 0; i < count; i++) {
        blocks[i] = malloc(n);
        CHECK(blocks[i] != NULL);
        if (blocks[i]) memset(blocks[i], 0xAB, malloc_usable_size(blocks[i]));
      }
      /* Free in allocation order on the first round, reversed on the second. */
      for (int i = 0; i < count; i++) free(blocks[round == 0 ? i : count - 1 - i]);
      for (int i = 0; i < count; i++) {
        /* Alternate count/size shapes of the same byte count. */
        if (i & 1 && n % 8 == 0)
          blocks[i] = calloc(n / 8, 8);
        else
          blocks[i] = calloc(1, n);
        if (blocks[i] == NULL) {
          fprintf(stderr, "check failed: calloc(%zu) returned NULL\n", n);
          hak_test_failures++;
          continue;
        }
        if (!hak_all_bytes(blocks[i], n, 0)) {
          fprintf(stderr, "check failed: calloc(%zu) block %d (%p) not zeroed after reuse\n", n,
                  i, blocks[i]);
          hak_test_failures++;
        }
      }
      for (int i = 0; i < count; i++) free(blocks[i]);
    }
  }

  /* A mixed sequence: dirty blocks of random sizes are freed in random order
   * while calloc'd blocks of random sizes must come back zeroed. */
  hak_rng r;
  hak_rng_seed(&r, 42);
  enum { SLOTS = 256 };
  static void* slot[SLOTS];
  static size_t slot_size[SLOTS];
  static int slot_zero[SLOTS];
  for (int op = 0; op < 20000; op++) {
    int i = (int)hak_rng_range(&r, 0, SLOTS - 1);
    if (slot[i]) {
      if (slot_zero[i] && !hak_all_bytes(slot[i], slot_size[i], 0)) {
        fprintf(stderr, "check failed: calloc(%zu) block changed while live\n", slot_size[i]);
        hak_test_failures++;
      }
      memset(slot[i], 0xAB, slot_size[i]);
      free(slot[i]);
      slot[i] = NULL;
      continue;
    }
    int shift = (int)hak_rng_range(&r, 0, 17);
    size_t n = hak_rng_range(&r, 1, (size_t)1 << shift);
    if (hak_rng_next(&r) & 1) {
      slot[i] = calloc(1, n);
      CHECK(slot[i] != NULL);
      if (slot[i] && !hak_all_bytes(slot[i], n, 0)) {
        fprintf(stderr, "check failed: calloc(1, %zu) not zeroed (mixed sequence, op %d)\n", n,
                op);
        hak_test_failures++;
      }
      slot_zero[i] = 1;
    } else {
      slot[i] = malloc(n);
      CHECK(slot[i] != NULL);
      if (slot[i]) memset(slot[i], 0xAB, n);
      slot_zero[i] = 0;
    }
    slot_size[i] = n;
  }
  for (int i = 0; i < SLOTS; i++) free(slot[i]);
}

static void test_reallocarray(void) {
  EXPECT_ENOMEM(reallocarray(NULL, hak_opaque(SIZE_MAX / 2 + 1), hak_opaque(2)));
  EXPECT_ENOMEM(reallocarray(NULL, hak_opaque((size_t)1 << 32), hak_opaque((size_t)1 << 32)));

  unsigned char* p = reallocarray(NULL, 10, 10);
  check_block(p, 100, 16, "reallocarray(NULL)");
  if (!p) return;
  hak_pattern_fill(p, 100, 7);
  errno = 0;
  void* q = reallocarray(hak_launder(p), hak_opaque(SIZE_MAX / 4 + 1), hak_opaque(8));
  int e = errno;
  CHECK(q == NULL);
  CHECK(e == ENOMEM);
  /* On failure the old block is untouched. */
  CHECK(hak_pattern_check(p, 100, 7) == 100);
  q = reallocarray(p, 1000, 100);
  CHECK(q != NULL);
  if (q) {
    p = q;
    CHECK(hak_pattern_check(p, 100, 7) == 100);
    memset(p + 100, 1, 100000 - 100);
    CHECK(malloc_usable_size(p) >= 100000);
  }
  q = reallocarray(p, 3, 7);
  CHECK(q != NULL);
  if (q) {
    p = q;
    CHECK(hak_pattern_check(p, 21, 7) == 21);
  }
  free(p);
}

static void test_posix_memalign_errors(void) {
  static const size_t bad[] = {0, 1, 2, 3, 4, 5, 6, 7, 12, 24, 40, 48, 96, 100, 4097,
                               (size_t)3 << 20, SIZE_MAX, SIZE_MAX - 1, ((size_t)1 << 63) + 8};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    void* sentinel = (void*)(uintptr_t)0x1234;
    void* p = sentinel;
    int rc = posix_memalign(&p, hak_opaque(bad[i]), 64);
    if (rc != EINVAL) {
      fprintf(stderr, "check failed: posix_memalign(align %zu) returned %d, want EINVAL\n",
              bad[i], rc);
      hak_test_failures++;
    }
    /* POSIX: on failure *memptr is left unmodified or set to NULL. */
    CHECK(p == sentinel || p == NULL);
    if (rc == 0 && p && p != sentinel) free(p);
  }
  struct {
    size_t align, size;
  } huge[] = {
      {16, SIZE_MAX},
      {16, SIZE_MAX - 15},
      {64, (size_t)PTRDIFF_MAX + 1},
      {4096, SIZE_MAX - 100},
      {4096, SIZE_MAX - 4096},
      {(size_t)1 << 21, SIZE_MAX - MiB},
      {(size_t)1 << 21, SIZE_MAX - (((size_t)1 << 21) - 1)},
      {8, (size_t)1 << 62},
      {(size_t)1 << 63, 1},
      {(size_t)1 << 62, 1},
  };
  for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
    void* sentinel = (void*)(uintptr_t)0x1234;
    void* p = sentinel;
    int rc = posix_memalign(&p, hak_opaque(huge[i].align), hak_opaque(huge[i].size));
    if (rc != ENOMEM) {
      fprintf(stderr, "check failed: posix_memalign(align %zu, size %zu) returned %d, want ENOMEM\n",
              huge[i].align, huge[i].size, rc);
      hak_test_failures++;
    }
    CHECK(p == sentinel || p == NULL);
    if (rc == 0 && p && p != sentinel) free(p);
  }
}

static void test_aligned_alloc_errors(void) {
  static const size_t bad[] = {0, 3, 5, 6, 12, 24, 48, 100, 1000, 4097, (size_t)3 << 20,
                               SIZE_MAX, ((size_t)1 << 63) + 1};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    errno = 0;
    void* p = aligned_alloc(hak_opaque(bad[i]), 64);
    int e = errno;
    if (p != NULL || e != EINVAL) {
      fprintf(stderr, "check failed: aligned_alloc(align %zu, 64) returned %p errno %d, want NULL/EINVAL\n",
              bad[i], p, e);
      hak_test_failures++;
    }
    if (p) free(p);
  }
  EXPECT_ENOMEM(aligned_alloc(16, hak_opaque(SIZE_MAX)));
  EXPECT_ENOMEM(aligned_alloc(64, hak_opaque((size_t)PTRDIFF_MAX + 1)));
  EXPECT_ENOMEM(aligned_alloc(4096, hak_opaque(SIZE_MAX - 100)));
  EXPECT_ENOMEM(aligned_alloc((size_t)1 << 22, hak_opaque(SIZE_MAX - ((size_t)1 << 21))));
  /* A valid power of two that cannot be satisfied: either answer is clear. */
  errno = 0;
  void* p = aligned_alloc(hak_opaque((size_t)1 << 63), 1);
  int e = errno;
  CHECK(p == NULL);
  CHECK(e == ENOMEM || e == EINVAL);
  if (p) free(p);

  EXPECT_ENOMEM(memalign(16, hak_opaque(SIZE_MAX)));
  EXPECT_ENOMEM(memalign(4096, hak_opaque(SIZE_MAX - 4096)));
  EXPECT_ENOMEM(memalign(64, hak_opaque((size_t)PTRDIFF_MAX + 1)));
  /* Alignments whose power-of-two round-up overflows. */
  errno = 0;
  p = memalign(hak_opaque(SIZE_MAX), 1);
  e = errno;
  CHECK(p == NULL);
  CHECK(e == EINVAL || e == ENOMEM);
  if (p) free(p);
  errno = 0;
  p = memalign(hak_opaque(((size_t)1 << 63) + 1), 1);
  e = errno;
  CHECK(p == NULL);
  CHECK(e == EINVAL || e == ENOMEM);
  if (p) free(p);
}

static size_t next_pow2(size_t a) {
  size_t r = 1;
  while (r < a) r <<= 1;
  return r;
}

static void test_memalign_rounding(void) {
  static const size_t aligns[] = {0,   3,    5,    7,    9,    17,    24,   33,
                                  48,  100,  1000, 3000, 5000, 65537, 100000,
                                  MiB + 1, 3 * MiB};
  static const size_t sizes[] = {0, 1, 7, 100, 5000, 300000};
  for (size_t a = 0; a < sizeof(aligns) / sizeof(aligns[0]); a++) {
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
      size_t want = aligns[a] == 0 ? 1 : next_pow2(aligns[a]);
      void* p = memalign(hak_opaque(aligns[a]), sizes[s]);
      if (p && !hak_is_aligned(p, want))
        fprintf(stderr, "memalign(%zu, %zu) = %p, want alignment %zu\n", aligns[a], sizes[s], p,
                want);
      check_block(p, sizes[s], want, "memalign");
      free(p);
    }
  }
}

/* Every valid alignment with sizes from 0 to 5 MiB, through all three
 * aligned entry points; the blocks of one alignment are live together and
 * each keeps its own content (no overlap). */
static void test_alignment_matrix(void) {
  static const size_t sizes[] = {0, 1, 100, 4096, MiB, 5 * MiB};
  enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
  for (size_t align = 1; align <= 4 * MiB; align <<= 1) {
    void* blk[3][NS];
    size_t use[3][NS];
    memset(blk, 0, sizeof blk);
    for (int s = 0; s < NS; s++) {
      size_t n = sizes[s];
      if (align >= sizeof(void*)) {
        void* p = NULL;
        int rc = posix_memalign(&p, align, n);
        if (rc != 0) {
          fprintf(stderr, "check failed: posix_memalign(%zu, %zu) = %d\n", align, n, rc);
          hak_test_failures++;
          p = NULL;
        }
        blk[0][s] = p;
      }
      blk[1][s] = aligned_alloc(align, n);
      blk[2][s] = memalign(align, n);
      static const char* const names[] = {"posix_memalign", "aligned_alloc", "memalign"};
      for (int f = 0; f < 3; f++) {
        if (f == 0 && align < sizeof(void*)) continue;
        if (!check_block(blk[f][s], n, align, names[f])) {
          use[f][s] = 0;
          continue;
        }
        use[f][s] = malloc_usable_size(blk[f][s]);
        if (use[f][s] == 0) { /* (size 0 too: a block, as malloc(0) is) */
          fprintf(stderr, "check failed: %s(%zu, %zu) has no usable byte\n", names[f], align, n);
          hak_test_failures++;
        }
        hak_pattern_fill(blk[f][s], use[f][s], align * 131 + (size_t)s * 7 + (size_t)f);
      }
    }
    for (int s = 0; s < NS; s++)
      for (int f = 0; f < 3; f++) {
        if (!blk[f][s]) continue;
        size_t bad = hak_pattern_check(blk[f][s], use[f][s], align * 131 + (size_t)s * 7 + (size_t)f);
        if (bad != use[f][s]) {
          fprintf(stderr,
                  "check failed: aligned block (fn %d, align %zu, size %zu) overwritten at offset %zu\n",
                  f, align, sizes[s], bad);
          hak_test_failures++;
        }
      }
    for (int s = NS - 1; s >= 0; s--)
      for (int f = 0; f < 3; f++) free(blk[f][s]);
  }
}

static void test_valloc_pvalloc(void) {
  static const size_t sizes[] = {0, 1, 100, 4095, 4096, 4097, 5000, 65536, 100000, MiB, 3 * MiB + 1};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    size_t n = sizes[i];
    void* p = valloc(n);
    check_block(p, n, page_size, "valloc");
    free(p);
    p = pvalloc(n);
    size_t rounded = (n + page_size - 1) & ~(page_size - 1);
    check_block(p, rounded, page_size, "pvalloc");
    free(p);
  }
  /* pvalloc(0) is a page-aligned, freeable block. */
  void* p = pvalloc(hak_opaque(0));
  CHECK(p != NULL);
  CHECK(hak_is_aligned(p, page_size));
  free(p);

  EXPECT_ENOMEM(valloc(hak_opaque(SIZE_MAX)));
  EXPECT_ENOMEM(valloc(hak_opaque(SIZE_MAX - 100)));
  EXPECT_ENOMEM(valloc(hak_opaque((size_t)PTRDIFF_MAX + 1)));
  EXPECT_ENOMEM(pvalloc(hak_opaque(SIZE_MAX)));
  /* Rounding up to a page overflows here. */
  EXPECT_ENOMEM(pvalloc(hak_opaque(SIZE_MAX - 100)));
  EXPECT_ENOMEM(pvalloc(hak_opaque(SIZE_MAX - page_size + 2)));
  EXPECT_ENOMEM(pvalloc(hak_opaque((size_t)PTRDIFF_MAX + 1)));
}

/* Every size 1..4096 live at once: 16-byte aligned and disjoint. */
static void test_min_alignment(void) {
  enum { N = 4096 };
  static unsigned char* blk[N + 1];
  for (size_t n = 1; n <= N; n++) {
    blk[n] = malloc(n);
    if (!blk[n] || !hak_is_aligned(blk[n], 16)) {
      fprintf(stderr, "check failed: malloc(%zu) = %p is not 16-byte aligned\n", n, (void*)blk[n]);
      hak_test_failures++;
      continue;
    }
    memset(blk[n], (int)(n * 31 & 0xff), n);
  }
  for (size_t n = 1; n <= N; n++) {
    if (blk[n] && !hak_all_bytes(blk[n], n, (unsigned char)(n * 31 & 0xff))) {
      fprintf(stderr, "check failed: malloc(%zu) block overlaps another\n", n);
      hak_test_failures++;
    }
  }
  for (size_t n = 1; n <= N; n++) free(blk[n]);

  static const size_t big[] = {4097,       8193,    65536 + 3, 100000,  262145,
                               MiB + 5,    2 * MiB, 3 * MiB + 7, 9 * MiB + 11, 33 * MiB};
  for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
    void* p = malloc(big[i]);
    check_block(p, big[i], 16, "malloc");
    free(p);
  }
  /* calloc, realloc results are 16-byte aligned too. */
  for (size_t n = 1; n <= 512; n += 3) {
    void* p = calloc(1, n);
    CHECK(p && hak_is_aligned(p, 16));
    void* q = realloc(p, n * 3);
    CHECK(q && hak_is_aligned(q, 16));
    free(q ? q : p);
  }
}

/* malloc_usable_size is at least the request, all of it writable, and the
 * slack of one block never reaches into another (a ring of live blocks keeps
 * its content while the next ones are written). */
static void test_usable_size(void) {
  enum { RING = 16 };
  void* ring[RING] = {0};
  size_t ring_use[RING] = {0};
  int k = 0;
  size_t n = 0;
  while (n <= 70000) {
    if (ring[k]) {
      size_t bad = hak_pattern_check(ring[k], ring_use[k], (uintptr_t)ring[k]);
      if (bad != ring_use[k]) {
        fprintf(stderr, "check failed: block %p (usable %zu) overwritten at %zu\n", ring[k],
                ring_use[k], bad);
        hak_test_failures++;
      }
      free(ring[k]);
    }
    void* p = malloc(n);
    size_t u = p ? malloc_usable_size(p) : 0;
    if (!p || u < n) {
      fprintf(stderr, "check failed: malloc(%zu) = %p usable %zu\n", n, p, u);
      hak_test_failures++;
      ring[k] = NULL;
    } else {
      CHECK(malloc_usable_size(p) == u);
      hak_pattern_fill(p, u, (uintptr_t)p);
      ring[k] = p;
      ring_use[k] = u;
    }
    k = (k + 1) % RING;
    n += n < 1100 ? 1 : 13;
  }
  for (int i = 0; i < RING; i++) {
    if (ring[i] && hak_pattern_check(ring[i], ring_use[i], (uintptr_t)ring[i]) != ring_use[i]) {
      fprintf(stderr, "check failed: block %p overwritten\n", ring[i]);
      hak_test_failures++;
    }
    free(ring[i]);
  }
  static const size_t big[] = {MiB,     MiB + 1,     2 * MiB - 1, 2 * MiB,  2 * MiB + 1,
                               3 * MiB, 4 * MiB + 17, 5 * MiB,     7 * MiB,  8 * MiB,
                               16 * MiB - 3, 31 * MiB, 64 * MiB + 1};
  void* prev = NULL;
  size_t prev_u = 0;
  for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
    void* p = malloc(big[i]);
    size_t u = p ? malloc_usable_size(p) : 0;
    if (!p || u < big[i]) {
      fprintf(stderr, "check failed: malloc(%zu) = %p usable %zu\n", big[i], p, u);
      hak_test_failures++;
      free(p);
      continue;
    }
    hak_pattern_fill(p, u, (uintptr_t)p);
    if (prev) {
      CHECK(hak_pattern_check(prev, prev_u, (uintptr_t)prev) == prev_u);
      free(prev);
    }
    prev = p;
    prev_u = u;
  }
  free(prev);
}

/* realloc up and down through every size range, keeping the content. */
static void realloc_ladder(const size_t* steps, size_t nsteps, int with_blockers, uint64_t key) {
  unsigned char* p = NULL;
  size_t cur = 0;
  void* blockers[64];
  int nb = 0;
  for (size_t i = 0; i < nsteps; i++) {
    size_t n = steps[i];
    unsigned char* q = realloc(p, n);
    if (!q) {
      fprintf(stderr, "check failed: realloc(%p, %zu) from %zu returned NULL\n", (void*)p, n, cur);
      hak_test_failures++;
      break;
    }
    size_t keep = cur < n ? cur : n;
    size_t bad = hak_pattern_check(q, keep, key);
    if (bad != keep) {
      fprintf(stderr, "check failed: realloc %zu -> %zu lost content at offset %zu\n", cur, n, bad);
      hak_test_failures++;
    }
    if (malloc_usable_size(q) < n) {
      fprintf(stderr, "check failed: realloc to %zu: usable %zu\n", n, malloc_usable_size(q));
      hak_test_failures++;
    }
    if (n > keep) hak_pattern_fill(q, n, key);
    p = q;
    cur = n;
    if (with_blockers && nb < 64) {
      /* A neighbour allocated right after, so that growing in place is not
       * always possible. */
      blockers[nb] = malloc(n < 4096 ? n : 64);
      if (blockers[nb]) memset(blockers[nb], 0x77, n < 4096 ? n : 64);
      nb++;
    }
  }
  if (p) CHECK(hak_pattern_check(p, cur, key) == cur);
  free(p);
  for (int i = 0; i < nb; i++) {
    size_t bn = steps[i] < 4096 ? steps[i] : 64;
    if (blockers[i]) CHECK(hak_all_bytes(blockers[i], bn, 0x77));
    free(blockers[i]);
  }
}

static void test_realloc(void) {
  static const size_t coarse[] = {16,      1 * KiB,  64 * KiB,  1 * MiB, 64 * MiB, 128 * MiB,
                                  64 * MiB, 1 * MiB, 64 * KiB,  1 * KiB, 16,      1};
  realloc_ladder(coarse, sizeof(coarse) / sizeof(coarse[0]), 0, 1);
  realloc_ladder(coarse, sizeof(coarse) / sizeof(coarse[0]), 1, 2);

  size_t fine[64];
  size_t nf = 0;
  for (size_t n = 16; n <= 32 * MiB; n *= 2, nf++) fine[nf] = n + (nf % 3);
  for (size_t n = 16 * MiB; n >= 8; n /= 2, nf++) fine[nf] = n - (nf % 5);
  realloc_ladder(fine, nf, 0, 3);
  realloc_ladder(fine, nf, 1, 4);

  /* Growth and shrinkage one byte at a time. */
  unsigned char* p = NULL;
  for (size_t n = 1; n <= 3000; n++) {
    unsigned char* q = realloc(p, n);
    CHECK(q != NULL);
    if (!q) break;
    if (n > 1 && hak_pattern_check(q, n - 1, 5) != n - 1) {
      fprintf(stderr, "check failed: realloc +1 to %zu lost content\n", n);
      hak_test_failures++;
    }
    hak_pattern_fill(q, n, 5);
    p = q;
  }
  for (size_t n = 2999; n >= 1 && p; n -= 7) {
    unsigned char* q = realloc(p, n);
    CHECK(q != NULL);
    if (!q) break;
    CHECK(hak_pattern_check(q, n, 5) == n);
    p = q;
    if (n <= 7) break;
  }
  free(p);

  /* A random walk of sizes up to 4 MiB. */
  hak_rng r;
  hak_rng_seed(&r, 9);
  p = NULL;
  size_t cur = 0;
  for (int i = 0; i < 3000; i++) {
    int shift = (int)hak_rng_range(&r, 0, 22);
    size_t n = hak_rng_range(&r, 1, (size_t)1 << shift);
    unsigned char* q = realloc(p, n);
    if (!q) {
      fprintf(stderr, "check failed: realloc(%zu) returned NULL\n", n);
      hak_test_failures++;
      break;
    }
    size_t keep = cur < n ? cur : n;
    if (hak_pattern_check(q, keep, 6) != keep) {
      fprintf(stderr, "check failed: random realloc %zu -> %zu lost content\n", cur, n);
      hak_test_failures++;
    }
    hak_pattern_fill(q, n, 6);
    p = q;
    cur = n;
  }
  free(p);
}

static void test_realloc_edges(void) {
  /* realloc(NULL, n) is malloc(n). */
  void* p = realloc(NULL, 100);
  check_block(p, 100, 16, "realloc(NULL)");
  free(p);
  p = realloc(NULL, hak_opaque(0));
  CHECK(p != NULL);
  free(p);
  p = realloc(NULL, 5 * MiB);
  check_block(p, 5 * MiB, 16, "realloc(NULL)");
  free(p);
  EXPECT_ENOMEM(realloc(NULL, hak_opaque(SIZE_MAX)));

  /* realloc(p, 0): frees and returns NULL (glibc) or returns a freeable block. */
  static const size_t sizes[] = {1, 100, 5000, 100000, 3 * MiB};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    p = malloc(sizes[i]);
    CHECK(p != NULL);
    void* q = realloc(p, hak_opaque(0));
    if (q) free(q);
  }

  /* A failed realloc leaves the block untouched and usable. */
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    size_t n = sizes[i];
    p = malloc(n);
    if (!p) {
      CHECK(p != NULL);
      continue;
    }
    hak_pattern_fill(p, n, n);
    EXPECT_ENOMEM(realloc(hak_launder(p), hak_opaque(SIZE_MAX)));
    EXPECT_ENOMEM(realloc(hak_launder(p), hak_opaque(SIZE_MAX - 4096)));
    EXPECT_ENOMEM(realloc(hak_launder(p), hak_opaque((size_t)PTRDIFF_MAX + 1)));
    CHECK(hak_pattern_check(p, n, n) == n);
    void* q = realloc(p, n * 2);
    CHECK(q != NULL);
    if (q) {
      CHECK(hak_pattern_check(q, n, n) == n);
      p = q;
    }
    free(p);
  }

  /* realloc of aligned blocks keeps the content. */
  for (size_t align = 16; align <= 2 * MiB; align <<= 3) {
    void* a = NULL;
    CHECK(posix_memalign(&a, align, 300) == 0);
    if (!a) continue;
    hak_pattern_fill(a, 300, align);
    void* b = realloc(a, 3 * MiB);
    CHECK(b != NULL);
    if (!b) {
      free(a);
      continue;
    }
    CHECK(hak_pattern_check(b, 300, align) == 300);
    void* c = realloc(b, 10);
    CHECK(c != NULL);
    if (!c) {
      free(b);
      continue;
    }
    CHECK(hak_pattern_check(c, 10, align) == 10);
    free(c);
  }
  /* realloc to exactly the usable size, in place or not, keeps everything. */
  for (size_t n = 1; n < 200000; n = n * 3 + 1) {
    p = malloc(n);
    if (!p) continue;
    size_t u = malloc_usable_size(p);
    hak_pattern_fill(p, u, 11);
    void* q = realloc(p, u);
    CHECK(q != NULL);
    if (q) {
      CHECK(hak_pattern_check(q, u, 11) == u);
      p = q;
    }
    free(p);
  }
}

static void test_free_sized(void) {
  REQUIRE(free_sized != NULL);
  REQUIRE(free_aligned_sized != NULL);
  free_sized(NULL, 0);
  free_sized(NULL, 100);
  free_aligned_sized(NULL, 64, 0);
  free_aligned_sized(NULL, 4096, 4096);

  static const size_t sizes[] = {0, 1, 8, 16, 17, 100, 1000, 4096, 5000, 65536, 100000, MiB, 5 * MiB};
  for (int round = 0; round < 3; round++) {
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
      size_t n = sizes[i];
      void* p = malloc(n);
      check_block(p, n, 16, "malloc");
      free_sized(p, n);
      p = calloc(n, 1);
      CHECK(p != NULL);
      free_sized(p, n);
      p = malloc(n + 1);
      void* q = realloc(p, n * 2 + 3);
      CHECK(q != NULL);
      free_sized(q ? q : p, q ? n * 2 + 3 : n + 1);
    }
    for (size_t align = 1; align <= MiB; align <<= 1) {
      static const size_t asz[] = {1, 100, 5000, MiB + 3};
      for (size_t i = 0; i < sizeof(asz) / sizeof(asz[0]); i++) {
        size_t n = (asz[i] + align - 1) & ~(align - 1);
        void* p = aligned_alloc(align, n);
        check_block(p, n, align, "aligned_alloc");
        free_aligned_sized(p, align, n);
      }
    }
  }

  /* The sized frees really free: repeated big blocks do not accumulate. */
  size_t rss0 = hak_rss_bytes();
  for (int i = 0; i < 100; i++) {
    unsigned char* p = malloc(8 * MiB);
    if (!p) {
      CHECK(p != NULL);
      break;
    }
    for (size_t off = 0; off < 8 * MiB; off += 4096) p[off] = (unsigned char)i;
    free_sized(p, 8 * MiB);
    p = aligned_alloc(64 * KiB, 8 * MiB);
    if (!p) {
      CHECK(p != NULL);
      break;
    }
    for (size_t off = 0; off < 8 * MiB; off += 4096) p[off] = (unsigned char)i;
    free_aligned_sized(p, 64 * KiB, 8 * MiB);
    for (int j = 0; j < 64; j++) {
      void* s = malloc(64 * KiB);
      if (s) memset(s, 1, 64 * KiB);
      free_sized(s, 64 * KiB);
    }
  }
  size_t rss1 = hak_rss_bytes();
  if (rss1 > rss0 + 256 * MiB) {
    fprintf(stderr, "check failed: RSS grew from %zu to %zu over sized free loops\n", rss0, rss1);
    hak_test_failures++;
  }
}

/* free() leaves errno alone (POSIX.1-2024; glibc since 2.33), whatever it
 * has to do to release the block. */
static void test_free_keeps_errno(void) {
  static const size_t sizes[] = {1, 100, 5000, 100000, MiB, 3 * MiB, 64 * MiB};
  for (int round = 0; round < 4; round++) {
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
      void* p = malloc(sizes[i]);
      CHECK(p != NULL);
      if (p) memset(p, 1, sizes[i]);
      errno = EINTR;
      free(p);
      if (errno != EINTR) {
        fprintf(stderr, "check failed: free of a %zu-byte block changed errno to %d\n", sizes[i],
                errno);
        hak_test_failures++;
      }
    }
    void* a = aligned_alloc(2 * MiB, 5 * MiB);
    errno = EILSEQ;
    free(a);
    CHECK(errno == EILSEQ);
  }
}

/* Blocks of glibc's own names and of the standard ones are one kind: each
 * frees, reallocates and sizes the other's (a foreign pointer would abort). */
static void test_libc_names(void) {
  char* a = __libc_malloc(hak_opaque(100));
  check_block(a, 100, 16, "__libc_malloc");
  a = realloc(a, 5000);
  check_block(a, 5000, 16, "realloc of __libc_malloc's");
  free(a);
  char* b = malloc(hak_opaque(300));
  b = __libc_realloc(b, 2 * MiB);
  check_block(b, 2 * MiB, 16, "__libc_realloc of malloc's");
  __libc_free(b);
  unsigned char* c = __libc_calloc(hak_opaque(1000), 3);
  REQUIRE(c != NULL);
  for (size_t i = 0; i < 3000; i++) CHECK(c[i] == 0);
  CHECK(malloc_usable_size(c) >= 3000);
  __libc_free(c);
  void* d = __libc_memalign(4096, hak_opaque(10));
  check_block(d, 10, 4096, "__libc_memalign");
  free(d);
  void* e = __libc_valloc(hak_opaque(10));
  check_block(e, 10, page_size, "__libc_valloc");
  __libc_free(e);
  void* f = __libc_pvalloc(hak_opaque(10));
  check_block(f, page_size, page_size, "__libc_pvalloc");
  free(f);
  void* g = NULL;
  CHECK(__posix_memalign(&g, 256, hak_opaque(700)) == 0);
  check_block(g, 700, 256, "__posix_memalign");
  __libc_free(g);
  CHECK(__posix_memalign(&g, 24, 10) == EINVAL);
}

int main(void) {
  page_size = (size_t)sysconf(_SC_PAGESIZE);
  test_symbols();
  test_malloc_edges();
  test_calloc_edges();
  test_calloc_reuse();
  test_reallocarray();
  test_posix_memalign_errors();
  test_aligned_alloc_errors();
  test_memalign_rounding();
  test_alignment_matrix();
  test_valloc_pvalloc();
  test_min_alignment();
  test_usable_size();
  test_realloc();
  test_realloc_edges();
  test_free_sized();
  test_libc_names();
  test_free_keeps_errno();
  return hak_test_result(TEST_NAME);
}
