/* test_learn: the learner (HAKMEM_LEARN).  Memory freed and never taken
 * again within the delay makes it shorten the purge delay; memory given back
 * and taken again soon after makes it lengthen it; whatever the program does,
 * every delay it publishes stays within [HAK_LEARN_DELAY_MIN_MS,
 * HAK_LEARN_DELAY_MAX_MS]; the slow paths follow the delay it published
 * (freed memory is given back sooner); switched off, it changes nothing.
 * Linked with hakmem_api (the hak_* API beside glibc) and src/internal.h. */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "harness.h"
#include "internal.h"
#include "test_util.h"

enum { BLOCK = 256 * 1024 - HAK_CANARY_SIZE, BLOCKS = 32 }; /* 8 MiB of large blocks, 4 units each */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long delay_now(void) {
  long v = -2;
  REQUIRE(hak_option_get("PURGE_DELAY_MS", &v) == 0);
  return v;
}

/* Every delay seen while the learner runs, checked against its bounds. */
static long seen_min = 1L << 30, seen_max = -1;
static void observe(void) {
  long d = delay_now();
  if (d < seen_min) seen_min = d;
  if (d > seen_max) seen_max = d;
}

/* The longest time between two allocator calls of burst and light since it
 * was last reset: a machine that stalled the test this long. */
static double last_call_s, max_gap_s;
static void note_call(void) {
  double t = now_s();
  if (t - last_call_s > max_gap_s) max_gap_s = t - last_call_s;
  last_call_s = t;
}

/* 8 MiB in large blocks, every page touched, then all freed. */
static void burst(void) {
  static void* b[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) {
    REQUIRE((b[i] = hak_malloc(BLOCK)) != NULL);
    memset(b[i], 7, BLOCK);
  }
  for (int i = 0; i < BLOCKS; i++) hak_free(b[i]);
  last_call_s = now_s();
}

/* ms milliseconds of light work: a page event every 2 ms (one large block
 * made and freed), so that purges and the learner's decisions can run. */
static void light(double ms) {
  double end = now_s() + ms / 1000.0;
  const struct timespec pause = {0, 2000000};
  while (now_s() < end) {
    void* p = hak_malloc(BLOCK);
    REQUIRE(p != NULL);
    ((volatile char*)p)[0] = 1;
    hak_free(p);
    note_call();
    observe();
    nanosleep(&pause, NULL);
  }
}

static size_t changes(void) {
  hak_stats_t st;
  hak_stats_get(&st);
  return st.learner_changes;
}

static size_t idle_purged(void) {
  hak_stats_t st;
  hak_stats_get(&st);
  return st.idle_purged_bytes;
}

/* Bursts whose memory is not wanted again for four delays: given back unused. */
static void test_shortens(void) {
  REQUIRE(hak_option_set("PURGE_DELAY_MS", 100) == 0);
  const hak_policy_t* snapshot = hak_policy();
  size_t before = changes();
  double start = now_s();
  unsigned stalls = 0;
  while (delay_now() > 40 && now_s() < start + 5.0 + 2.0 * stalls) {
    burst();
    max_gap_s = 0;
    /* Four delays, the delay in force at the end: one lengthened meanwhile
     * purges the burst's memory later, and a reuse four old delays on would
     * be a refault (2 new ones after the purge), lengthening it again. */
    long delay;
    do {
      delay = delay_now();
      light(4.0 * (double)delay);
    } while (delay_now() > delay);
    /* A stall of twice the delay between page events purges the burst's
     * memory that much later, and the next burst's reuse is then a refault,
     * which the learner rightly answers by lengthening: more time to come
     * back down (make test on two busy CPUs ended at 1000 ms, twice). */
    if (max_gap_s * 1000.0 >= 2.0 * (double)delay && stalls < 12) stalls++;
  }
  long d = delay_now();
  printf("  shortens: 100 ms -> %ld ms after %zu changes (%u stalls seen)\n", d, changes() - before, stalls);
  CHECK(d <= 40);
  CHECK(changes() > before);
  CHECK(hak_policy() != snapshot);        /* published as new snapshots */
  CHECK(snapshot->purge_delay_ms == 100); /* the old one as it was */
}

/* Right after the learner shortened the delay, the slow paths purge on the
 * new one: 8 MiB freed is given back well before the old 100 ms. */
static void test_followed(void) {
  long d = delay_now();
  REQUIRE(d <= 40);
  size_t purged = 0;
  double waited_ms = 0;
  /* Measured again if this machine stalled the test past the old delay: the
   * last page event then came too late to tell the new delay from the old. */
  for (int attempt = 0; attempt < 4; attempt++) {
    light(3.0 * (double)d); /* what earlier bursts left is purged first */
    size_t before = idle_purged();
    burst();
    double freed_s = now_s();
    light(2.0 * (double)d + 10);
    /* A page event at the end, whatever a stall did to light's last ones
     * (it may have made none after the memory came due). */
    hak_free(hak_malloc(BLOCK));
    purged = idle_purged() - before;
    waited_ms = (now_s() - freed_s) * 1000.0;
    if (waited_ms < 100.0) break;
  }
  printf("  followed: %zu KiB given back within %.0f ms at a delay of %ld ms\n", purged >> 10, waited_ms, d);
  CHECK(purged >= (size_t)4 << 20);
}

/* Bursts whose memory is taken again soon after the delay gave it back. */
static void test_lengthens(void) {
  REQUIRE(hak_option_set("PURGE_DELAY_MS", 100) == 0);
  size_t before = changes();
  double end = now_s() + 8.0;
  while (delay_now() < 400 && now_s() < end) {
    burst();
    light(1.5 * (double)delay_now());
  }
  long d = delay_now();
  printf("  lengthens: 100 ms -> %ld ms after %zu changes\n", d, changes() - before);
  CHECK(d >= 400);
  CHECK(changes() > before);
}

/* A start below the bounds, then bursts with random pauses: every delay
 * seen within them once the learner has decided. */
static void test_stays_in_range(void) {
  REQUIRE(hak_option_set("PURGE_DELAY_MS", 5) == 0);
  size_t before = changes();
  double end = now_s() + 5.0;
  while (changes() == before && now_s() < end) { /* the first decision brings it into range */
    burst();
    light(50);
  }
  CHECK(changes() > before);
  seen_min = 1L << 30;
  seen_max = -1;
  hak_rng r;
  hak_rng_seed(&r, 7);
  end = now_s() + 3.0;
  while (now_s() < end) { /* pauses of half the delay to four times it: both ways */
    burst();
    light((double)delay_now() * (double)hak_rng_range(&r, 1, 8) / 2.0);
  }
  printf("  range: delays seen %ld..%ld ms\n", seen_min, seen_max);
  CHECK(seen_min >= HAK_LEARN_DELAY_MIN_MS);
  CHECK(seen_max <= HAK_LEARN_DELAY_MAX_MS);
}

/* Off, the same bursts change nothing. */
static void test_off(void) {
  REQUIRE(hak_option_set("LEARN", 0) == 0);
  REQUIRE(hak_option_set("PURGE_DELAY_MS", 100) == 0);
  size_t before = changes();
  for (int i = 0; i < 3; i++) {
    burst();
    light(400);
  }
  CHECK(delay_now() == 100);
  CHECK(changes() == before);
}

int main(void) {
  long learn = -1;
  REQUIRE(hak_option_get("LEARN", &learn) == 0);
  CHECK(learn == 0); /* off by default */
  REQUIRE(hak_option_set("LEARN", 1) == 0);
  test_shortens();
  test_followed();
  test_lengthens();
  test_stays_in_range();
  test_off();
  return hak_test_result("test_learn");
}
