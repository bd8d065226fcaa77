/* test_thread_churn: 10,000 short-lived threads, a few at a time.  Each
 * allocates a few hundred KB of small blocks, frees part of them, and leaves
 * some in a shared pool that later threads and the main thread verify and
 * free (blocks whose owning thread has exited).  Each thread also frees and
 * allocates from a pthread key destructor, after its own code has ended.
 * Memory must not grow with the number of threads: RSS at the end is at most
 * 1.5 times the most it held during the first 1,000 threads.  The peak RSS it prints is
 * compared with glibc's by bench/churn_rss.py, which runs a build of this
 * program that is not linked with hakmem (HAK_TEST_ALLOW_GLIBC) both ways. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "test_util.h"

enum {
  THREADS = 10000,
  BATCH = 4,
  BLOCKS = 400,      /* blocks allocated per thread */
  DEPOSIT = 32,      /* of which left in the pool */
  POOL = 4096,
  MAIN_FREES = 8,    /* pool entries the main thread frees per batch */
};

static _Atomic(uintptr_t) pool[POOL];
static atomic_long failures;
static atomic_long dtor_runs;
static pthread_key_t key;

/* Blocks hold their size in the first 8 bytes, then a pattern. */
static unsigned char* make(size_t n) {
  unsigned char* p = malloc(n);
  if (!p) {
    atomic_fetch_add(&failures, 1);
    return NULL;
  }
  memcpy(p, &n, sizeof n);
  hak_pattern_fill(p + 8, n - 8, (uintptr_t)p ^ n);
  return p;
}

static void check_free(unsigned char* p) {
  size_t n;
  memcpy(&n, p, sizeof n);
  if (n < 16 || n > 65536 || hak_pattern_check(p + 8, n - 8, (uintptr_t)p ^ n) != n - 8) {
    if (atomic_fetch_add(&failures, 1) < 10)
      fprintf(stderr, "check failed: pooled block %p (size %zu) corrupted\n", (void*)p, n);
  }
  free(p);
}

static void key_dtor(void* v) {
  atomic_fetch_add(&dtor_runs, 1);
  check_free(v);
  /* Allocation during thread teardown keeps working. */
  unsigned char* late = make(200);
  if (late) check_free(late);
}

static size_t pick(hak_rng* r) {
  unsigned u = (unsigned)(hak_rng_next(r) % 100);
  if (u < 70) return hak_rng_range(r, 16, 256);
  if (u < 95) return hak_rng_range(r, 257, 1024);
  return hak_rng_range(r, 1025, 8192);
}

static void* worker(void* arg) {
  long id = (long)(intptr_t)arg;
  hak_rng r;
  hak_rng_seed(&r, (uint64_t)id);
  unsigned char* mine[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) mine[i] = make(pick(&r));
  /* Free about half, in random order. */
  for (int k = 0; k < BLOCKS / 2; k++) {
    int i = (int)(hak_rng_next(&r) % BLOCKS);
    if (mine[i]) {
      check_free(mine[i]);
      mine[i] = NULL;
    }
  }
  /* Leave some in the pool, freeing whatever they displace. */
  int left = 0;
  for (int i = 0; i < BLOCKS && left < DEPOSIT; i++) {
    if (!mine[i]) continue;
    int s = (int)(hak_rng_next(&r) % POOL);
    uintptr_t old = atomic_exchange(&pool[s], (uintptr_t)mine[i]);
    if (old) check_free((unsigned char*)old);
    mine[i] = NULL;
    left++;
  }
  for (int i = 0; i < BLOCKS; i++)
    if (mine[i]) check_free(mine[i]);
  unsigned char* v = make(100);
  if (v) pthread_setspecific(key, v);
  return NULL;
}

int main(void) {
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("malloc");
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("free");
  REQUIRE(pthread_key_create(&key, key_dtor) == 0);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  hak_rng r;
  hak_rng_seed(&r, 12345);
  size_t rss_1000 = 0;
  long created = 0;
  while (created < THREADS) {
    pthread_t th[BATCH];
    int n = 0;
    for (; n < BATCH && created < THREADS; n++, created++) {
      int rc = pthread_create(&th[n], &attr, worker, (void*)(intptr_t)created);
      if (rc != 0) {
        fprintf(stderr, "pthread_create failed (%d) at thread %ld\n", rc, created);
        exit(1);
      }
    }
    for (int i = 0; i < n; i++) REQUIRE(pthread_join(th[i], NULL) == 0);
    for (int k = 0; k < MAIN_FREES; k++) {
      uintptr_t old = atomic_exchange(&pool[hak_rng_next(&r) % POOL], 0);
      if (old) check_free((unsigned char*)old);
    }
    /* The most it held up to 1,000 threads (sampled every 100): RSS moves
     * between two levels from run to run as threads overlap, so one
     * sample could catch the low one. */
    if (created <= 1000 && created % 100 == 0) {
      size_t rss = hak_rss_bytes();
      if (rss > rss_1000) rss_1000 = rss;
    }
  }
  size_t rss_end = hak_rss_bytes();
  for (int s = 0; s < POOL; s++) {
    uintptr_t old = atomic_exchange(&pool[s], 0);
    if (old) check_free((unsigned char*)old);
  }
  pthread_attr_destroy(&attr);
  printf("test_thread_churn: RSS up to 1000 threads at most %zu KiB, after %d threads %zu KiB, "
         "peak_rss_kib=%zu\n",
         rss_1000 >> 10, THREADS, rss_end >> 10, hak_peak_rss_bytes() >> 10);
  CHECK(rss_1000 > 0);
  /* The bound is hakmem's (glibc's RSS grows here: bench/churn_rss.py). */
  if (hak_symbol_in_hakmem("malloc") && (double)rss_end > 1.5 * (double)rss_1000) {
    fprintf(stderr, "check failed: RSS grew from %zu KiB to %zu KiB (more than 1.5x)\n",
            rss_1000 >> 10, rss_end >> 10);
    hak_test_failures++;
  }
  CHECK(atomic_load(&dtor_runs) == THREADS);
  if (atomic_load(&failures)) {
    fprintf(stderr, "%ld failed checks in threads\n", atomic_load(&failures));
    hak_test_failures++;
  }
  return hak_test_result("test_thread_churn");
}
