/* test_options: hak_option_get and hak_option_set.  Names with and without
 * the HAKMEM_ prefix; unknown names and values out of range refused without
 * a change; each set publishes a new snapshot and leaves the old one as it
 * was; a change takes effect on the next slow path (the purge delay: 0 purges
 * freed pages at once, -1 never); threads allocating while another thread
 * publishes snapshots in a loop (run under TSan too).  Linked with
 * hakmem_api (the hak_* API beside glibc) and src/internal.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "internal.h"
#include "test_util.h"

#define C(f) atomic_load_explicit(&hak_counters.f, memory_order_relaxed)
#define MIB ((size_t)1 << 20)

static void test_get_set(void) {
  long v = -7;
  CHECK(hak_option_get("PURGE_DELAY_MS", &v) == 0);
  CHECK(v == HAK_POLICY(purge_delay_ms));
  long w = -7;
  CHECK(hak_option_get("HAKMEM_PURGE_DELAY_MS", &w) == 0 && w == v);
  CHECK(hak_option_get("NO_SUCH_OPTION", &w) == EINVAL);
  CHECK(hak_option_get(NULL, &w) == EINVAL);
  CHECK(hak_option_get("THP", NULL) == EINVAL);
  CHECK(hak_option_set("NO_SUCH_OPTION", 1) == EINVAL);
  CHECK(hak_option_set("HAKMEM_", 1) == EINVAL);

  const hak_policy_t* before = hak_policy();
  CHECK(hak_option_set("PURGE_DELAY_MS", 3600001) == ERANGE);
  CHECK(hak_option_set("PURGE_DELAY_MS", -2) == ERANGE);
  CHECK(hak_option_set("THP", 3) == ERANGE);
  CHECK(hak_option_set("PROF", 1) == ENOTSUP); /* the profiler is in libhakmem-prof.so only */
  CHECK(hak_policy() == before); /* nothing published */
  CHECK(hak_option_get("PURGE_DELAY_MS", &w) == 0 && w == v);

  CHECK(hak_option_set("HAKMEM_PURGE_DELAY_MS", 250) == 0);
  CHECK(hak_policy() != before);
  CHECK(before->purge_delay_ms == v); /* the old snapshot is unchanged */
  CHECK(HAK_POLICY(purge_delay_ms) == 250);
  CHECK(hak_option_get("PURGE_DELAY_MS", &w) == 0 && w == 250);
  CHECK(HAK_POLICY(thp) == before->thp); /* the other options carried over */
  CHECK(HAK_POLICY(purge_mode) == before->purge_mode);
  CHECK(hak_option_set("PURGE_DELAY_MS", v) == 0);
}

static void* shortened_delay(void* arg) {
  (void)arg;
  enum { N = 8 * 64 }; /* 8 MiB: below the 16 MiB a heap may keep backed */
  static void* b[N];
  CHECK(hak_option_set("PURGE_DELAY_MS", 3600000) == 0);
  for (int i = 0; i < N; i++) {
    REQUIRE((b[i] = hak_malloc(16 * 1024)) != NULL);
    memset(b[i], 1, 16 * 1024);
  }
  for (int i = 0; i < N; i++) hak_free(b[i]);
  hak_free(hak_malloc(300 * 1024)); /* a page event: nothing is due */
  size_t purged0 = C(purged_bytes);
  uint32_t freed_ms = hak_now_ms();
  CHECK(hak_option_set("PURGE_DELAY_MS", 1) == 0);
  /* Past the new delay by hakmem's clock (a coarse one: it may lag). */
  struct timespec ms1 = {0, 1000000};
  do nanosleep(&ms1, NULL);
  while (hak_now_ms() - freed_ms < 3);
  hak_free(hak_malloc(300 * 1024)); /* a page event */
  CHECK(hak_tls_heap->dirty_units == 0); /* (the segment cache purges apart) */
  CHECK(C(purged_bytes) > purged0);
  return NULL;
}

/* 24 MiB of 16 KiB blocks freed: all purged at once with delay 0, none with -1. */
static void test_takes_effect(void) {
  enum { N = 24 * 64 };
  static void* b[N];
  long old;
  CHECK(hak_option_get("PURGE_DELAY_MS", &old) == 0);
  CHECK(hak_option_set("PURGE_DELAY_MS", 0) == 0);
  for (int i = 0; i < N; i++) {
    REQUIRE((b[i] = hak_malloc(16 * 1024)) != NULL);
    memset(b[i], 1, 16 * 1024);
  }
  size_t purged0 = C(purged_bytes);
  for (int i = 0; i < N; i++) hak_free(b[i]);
  CHECK(C(purged_bytes) - purged0 >= 20 * MIB);

  CHECK(hak_option_set("PURGE_DELAY_MS", -1) == 0);
  for (int i = 0; i < N; i++) {
    REQUIRE((b[i] = hak_malloc(16 * 1024)) != NULL);
    memset(b[i], 1, 16 * 1024);
  }
  purged0 = C(purged_bytes);
  for (int i = 0; i < N; i++) hak_free(b[i]);
  CHECK(C(purged_bytes) == purged0);

  /* Shortened while free units wait for an hour: the next page event
   * purges them (their due time was set under the hour).  In a thread of
   * its own: a fresh heap, with no free units left by the rounds above. */
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, shortened_delay, NULL) == 0);
  pthread_join(th, NULL);
  CHECK(hak_option_set("PURGE_DELAY_MS", old) == 0);
}

/* Threads churn pages (every page event reads the policy) while the main
 * thread publishes snapshots; every value a thread reads is in range. */
static atomic_int stop;
static atomic_long bad;
static atomic_long ops;

static void* churn(void* arg) {
  hak_rng r;
  hak_rng_seed(&r, (uint64_t)(uintptr_t)arg);
  void* slots[64] = {0};
  while (!atomic_load(&stop)) {
    unsigned i = (unsigned)(hak_rng_next(&r) % 64);
    if (slots[i]) {
      if (hak_pattern_check(slots[i], 64, (uintptr_t)slots[i]) != 64) atomic_fetch_add(&bad, 1);
      hak_free(slots[i]);
      slots[i] = NULL;
    } else {
      slots[i] = hak_malloc(hak_rng_range(&r, 4096, 200 * 1024));
      if (!slots[i]) {
        atomic_fetch_add(&bad, 1);
        continue;
      }
      hak_pattern_fill(slots[i], 64, (uintptr_t)slots[i]);
    }
    atomic_fetch_add_explicit(&ops, 1, memory_order_relaxed);
    int32_t d = HAK_POLICY(purge_delay_ms);
    if (d < -1 || d > 3600000) atomic_fetch_add(&bad, 1);
  }
  for (unsigned i = 0; i < 64; i++) hak_free(slots[i]);
  return NULL;
}

static void test_concurrent_publish(void) {
  long old;
  CHECK(hak_option_get("PURGE_DELAY_MS", &old) == 0);
  pthread_t th[2];
  for (long t = 0; t < 2; t++) REQUIRE(pthread_create(&th[t], NULL, churn, (void*)(t + 1)) == 0);
  static const long delays[] = {0, 5, -1, 100, 1};
  for (int i = 0; i < 2000 || atomic_load(&ops) < 100000; i++) {
    CHECK(hak_option_set("PURGE_DELAY_MS", delays[i % 5]) == 0);
    CHECK(hak_option_set("PURGE", i & 1) == 0);
  }
  atomic_store(&stop, 1);
  for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
  CHECK(atomic_load(&bad) == 0);
  CHECK(hak_option_set("PURGE_DELAY_MS", old) == 0);
  CHECK(hak_option_set("PURGE", HAK_PURGE_DONTNEED) == 0);
}

int main(void) {
  test_get_set();
  test_takes_effect();
  test_concurrent_publish();
  return hak_test_result("test_options");
}
