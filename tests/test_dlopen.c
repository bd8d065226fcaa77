/* test_dlopen: a program that is not linked with hakmem loads libhakmem.so
 * at run time (RTLD_NOW | RTLD_LOCAL) and uses its prefixed API from two
 * threads, next to glibc's malloc which stays the process allocator.
 * Usage: test_dlopen path/to/libhakmem.so */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "test_util.h"

typedef void* (*malloc_fn)(size_t);
typedef void (*free_fn)(void*);
typedef void* (*realloc_fn)(void*, size_t);
typedef size_t (*usable_fn)(const void*);

static malloc_fn h_malloc;
static free_fn h_free;
static realloc_fn h_realloc;
static usable_fn h_usable;

enum { XS = 32 };
static _Atomic(uintptr_t) handoff[XS];
static atomic_long failures;

static void bad(const char* what, size_t n) {
  if (atomic_fetch_add(&failures, 1) < 10) fprintf(stderr, "check failed: %s (size %zu)\n", what, n);
}

/* Blocks carry their size and key in the first 16 bytes. */
static unsigned char* make(size_t n, uint64_t key) {
  if (n < 16) n = 16;
  unsigned char* p = h_malloc(n);
  if (!p) {
    bad("hak_malloc returned NULL", n);
    return NULL;
  }
  if (((uintptr_t)p & 15) != 0) bad("hak_malloc block not 16-byte aligned", n);
  if (h_usable(p) < n) bad("hak_usable_size below the request", n);
  memcpy(p, &n, 8);
  memcpy(p + 8, &key, 8);
  hak_pattern_fill(p + 16, n - 16, key);
  return p;
}

static size_t verify(const unsigned char* p) {
  size_t n;
  uint64_t key;
  memcpy(&n, p, 8);
  memcpy(&key, p + 8, 8);
  if (hak_pattern_check(p + 16, n - 16, key) != n - 16) bad("block content corrupted", n);
  return n;
}

static void* worker(void* arg) {
  int id = (int)(intptr_t)arg;
  hak_rng r;
  hak_rng_seed(&r, 7000 + (uint64_t)id);
  unsigned char* mine[128] = {0};
  for (int op = 0; op < 60000; op++) {
    int i = (int)(hak_rng_next(&r) % 128);
    if (!mine[i]) {
      int shift = (int)hak_rng_range(&r, 4, op % 1000 == 0 ? 22 : 16);
      mine[i] = make(hak_rng_range(&r, 16, (size_t)1 << shift), hak_rng_next(&r));
      continue;
    }
    unsigned u = (unsigned)(hak_rng_next(&r) % 10);
    if (u < 3) {
      size_t n = verify(mine[i]);
      uint64_t key;
      memcpy(&key, mine[i] + 8, 8);
      size_t m = hak_rng_range(&r, 16, 1 + (n * 3));
      unsigned char* q = h_realloc(mine[i], m);
      if (!q) {
        bad("hak_realloc returned NULL", m);
        continue;
      }
      size_t keep = (m < n ? m : n);
      if (memcmp(q, &n, 8) != 0 || hak_pattern_check(q + 16, keep - 16, key) != keep - 16)
        bad("hak_realloc lost content", m);
      memcpy(q, &m, 8);
      hak_pattern_fill(q + 16, m - 16, key);
      mine[i] = q;
    } else if (u < 6) {
      /* Hand to the other thread. */
      uintptr_t got = atomic_exchange(&handoff[hak_rng_next(&r) % XS], (uintptr_t)mine[i]);
      mine[i] = (unsigned char*)got;
      if (got) verify(mine[i]);
    } else {
      verify(mine[i]);
      h_free(mine[i]);
      mine[i] = NULL;
    }
  }
  for (int i = 0; i < 128; i++)
    if (mine[i]) {
      verify(mine[i]);
      h_free(mine[i]);
    }
  return NULL;
}

static pthread_mutex_t late_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int late_allocated;

static void* late_exiter(void* arg) {
  void* p = h_malloc(100); /* this thread now has a hakmem heap */
  h_free(p);
  atomic_store(&late_allocated, 1);
  pthread_mutex_lock(&late_lock); /* held by main until after dlclose */
  pthread_mutex_unlock(&late_lock);
  return NULL;
}

int main(int argc, char** argv) {
  REQUIRE(argc == 2);
  /* Not linked with hakmem: malloc is the system's before and after. */
  CHECK(!hak_symbol_in_hakmem("malloc"));
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "dlopen(%s) failed: %s\n", argv[1], dlerror());
    return 1;
  }
  h_malloc = (malloc_fn)dlsym(h, "hak_malloc");
  h_free = (free_fn)dlsym(h, "hak_free");
  h_realloc = (realloc_fn)dlsym(h, "hak_realloc");
  h_usable = (usable_fn)dlsym(h, "hak_usable_size");
  REQUIRE(h_malloc && h_free && h_realloc && h_usable);
  REQUIRE(hak_is_hakmem_object(hak_object_of((void*)h_malloc)));
  CHECK(!hak_symbol_in_hakmem("malloc"));

  /* Single-threaded: many sizes, content checks. */
  for (size_t n = 0; n <= 70000; n += n < 2048 ? 1 : 97) {
    unsigned char* p = h_malloc(n);
    if (!p || h_usable(p) < n) {
      fprintf(stderr, "check failed: hak_malloc(%zu) = %p\n", n, (void*)p);
      hak_test_failures++;
      h_free(p);
      continue;
    }
    hak_pattern_fill(p, n, n);
    unsigned char* q = h_realloc(p, n * 2 + 1);
    CHECK(q != NULL);
    if (q) {
      CHECK(hak_pattern_check(q, n, n) == n);
      p = q;
    }
    h_free(p);
  }
  static const size_t big[] = {(size_t)1 << 20, (size_t)3 << 20, (size_t)9 << 20, (size_t)40 << 20};
  for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
    unsigned char* p = make(big[i], i);
    if (p) {
      verify(p);
      h_free(p);
    }
  }
  h_free(NULL);
  CHECK(h_usable(NULL) == 0);
  /* glibc's heap is unaffected. */
  char* s = malloc(1000);
  REQUIRE(s);
  memset(s, 'x', 1000);
  free(s);

  pthread_t t[2];
  for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&t[i], NULL, worker, (void*)(intptr_t)i) == 0);
  for (int i = 0; i < 2; i++) REQUIRE(pthread_join(t[i], NULL) == 0);
  for (int s2 = 0; s2 < XS; s2++) {
    unsigned char* p = (unsigned char*)atomic_exchange(&handoff[s2], 0);
    if (p) {
      verify(p);
      h_free(p);
    }
  }
  if (atomic_load(&failures)) {
    fprintf(stderr, "%ld failed checks\n", atomic_load(&failures));
    hak_test_failures++;
  }

  /* A thread that allocated through the library exits after the library was
   * dlclose'd: its exit hook must still be there (the library stays loaded). */
  pthread_mutex_lock(&late_lock);
  pthread_t late;
  REQUIRE(pthread_create(&late, NULL, late_exiter, NULL) == 0);
  while (!atomic_load(&late_allocated)) usleep(1000);
  CHECK(dlclose(h) == 0);
  pthread_mutex_unlock(&late_lock);
  REQUIRE(pthread_join(late, NULL) == 0);
  return hak_test_result("test_dlopen");
}
