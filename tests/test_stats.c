/* test_stats: the statistics box.  Live blocks and pages per class as
 * allocated; refills, and remote frees counted when the owner collects them;
 * hak_stats_reset restarting the counters but not the gauges; committed
 * bytes between the live bytes and the reservation; foreign pointers counted;
 * the readable report and the JSON file; HAKMEM_STATS=on and json:PATH at
 * exit; in the observing build, every malloc and free of this thread counted
 * once.  Linked with hakmem_api (the hak_* API beside glibc). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "harness.h"
#include "internal.h"
#include "test_util.h"

enum { SMALL = 100, MID = 20000, NSMALL = 300, NMID = 24 };
static void* small[NSMALL];
static void* mid[NMID];

static void* free_half(void* arg) {
  (void)arg;
  for (int i = 0; i < NSMALL; i += 2) hak_free(small[i]); /* remote frees */
  return NULL;
}

static void test_counts(void) {
  unsigned cs = hak_class_of(SMALL), cm = hak_class_of(MID);
  hak_stats_reset();
  hak_stats_t st;
  for (int i = 0; i < NSMALL; i++) REQUIRE((small[i] = hak_malloc(SMALL)) != NULL);
  for (int i = 0; i < NMID; i++) REQUIRE((mid[i] = hak_malloc(MID)) != NULL);
  hak_stats_get(&st);
  CHECK(st.classes[cs].block_size == hak_class_size[cs]);
  CHECK(st.classes[cs].live_blocks >= NSMALL);
  CHECK(st.classes[cm].live_blocks >= NMID);
  CHECK(st.classes[cs].pages >= 1 && st.classes[cm].pages >= 2); /* 24 blocks of 20 KiB: 2 pages of 16 */
  CHECK(st.classes[cm].refills >= 2);
  CHECK(st.live_bytes >= NSMALL * hak_class_size[cs] + NMID * hak_class_size[cm]);
  CHECK(st.committed_bytes >= st.live_bytes);
  CHECK(st.peak_committed_bytes >= st.committed_bytes);
  CHECK(st.reserved_bytes >= st.committed_bytes);
  CHECK(st.segments >= 1 && st.heaps >= 1);
  CHECK(st.rss_bytes > 0 && st.peak_rss_bytes >= st.rss_bytes / 2);

  /* Another thread frees half the small blocks; the owner collects them on
   * its next slow path (the first malloc of a class it has not used). */
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, free_half, NULL) == 0);
  pthread_join(th, NULL);
  void* other = hak_malloc(3000);
  REQUIRE(other != NULL);
  hak_stats_get(&st);
  CHECK(st.remote_frees == NSMALL / 2);
  CHECK(st.classes[cs].remote_frees == (st.observed ? NSMALL / 2 : 0));
  CHECK(st.classes[cs].live_blocks >= NSMALL / 2 && st.classes[cs].live_blocks < NSMALL);

  /* A reset restarts the counters, not the gauges. */
  size_t live = st.classes[cs].live_blocks;
  hak_stats_reset();
  hak_stats_get(&st);
  CHECK(st.remote_frees == 0 && st.classes[cm].refills == 0);
  CHECK(st.classes[cs].live_blocks == live);
  CHECK(st.mmap_calls == 0);

  size_t before = st.lookup_failures;
  int on_stack;
  CHECK(hak_usable_size(&on_stack) == 0);
  hak_stats_get(&st);
  CHECK(st.lookup_failures == before + 1);

  hak_free(other);
  for (int i = 1; i < NSMALL; i += 2) hak_free(small[i]);
  for (int i = 0; i < NMID; i++) hak_free(mid[i]);
  hak_stats_get(&st);
  CHECK(st.classes[cm].live_blocks == 0);
}

/* The observing build counts each malloc and free of the thread once. */
static void test_observed(void) {
  hak_stats_t st;
  hak_stats_get(&st);
  CHECK(st.observed == HAK_OBSERVE);
  if (!st.observed) return;
  unsigned c = hak_class_of(48);
  hak_stats_reset();
  void* p[1000];
  for (int i = 0; i < 1000; i++) p[i] = hak_malloc(48);
  for (int i = 0; i < 1000; i++) hak_free(p[i]);
  hak_stats_get(&st);
  const hak_class_stats_t* s = &st.classes[c];
  CHECK(s->alloc_current + s->alloc_partial + s->alloc_refill == 1000);
  CHECK(s->free_current + s->free_partial == 1000);
  CHECK(s->alloc_current > 900);
}

static size_t count(const char* s, const char* what) {
  size_t n = 0;
  for (const char* p = s; (p = strstr(p, what)) != NULL; p++) n++;
  return n;
}

static void test_reports(void) {
  char path[] = "/tmp/hakmem-test-stats-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  void* keep = hak_malloc(700);
  CHECK(hak_stats_write_json(path) == 0);
  static char buf[65536];
  FILE* f = fopen(path, "r");
  REQUIRE(f != NULL);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  CHECK(buf[0] == '{' && strstr(buf, "\"classes\": [") != NULL && strstr(buf, "]}\n") != NULL);
  CHECK(count(buf, "{\"class\": ") == HAK_STATS_CLASSES);
  CHECK(strstr(buf, "\"committed_bytes\": ") != NULL && strstr(buf, "\"peak_rss_bytes\": ") != NULL);
  CHECK(hak_stats_write_json("/nonexistent-dir/x.json") == -1 && errno == ENOENT);

  f = tmpfile();
  REQUIRE(f != NULL);
  hak_stats_print(f);
  rewind(f);
  n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  CHECK(count(buf, "hakmem: stats segments=") == 1);
  CHECK(strstr(buf, "hakmem: class   block    live") != NULL);
  CHECK(strstr(buf, "committed / live") != NULL);
  hak_free(keep);

  /* At exit, as HAKMEM_STATS says. */
  static char out[65536];
  const char* on[] = {"HAKMEM_STATS=on", NULL};
  CHECK(hak_run_self("--exit", on, out, sizeof out) == 0);
  CHECK(count(out, "hakmem: stats segments=") == 1 && strstr(out, "hakmem: process RSS") != NULL);
  char env[300];
  snprintf(env, sizeof env, "HAKMEM_STATS=json:%s", path);
  unlink(path);
  const char* json[] = {env, NULL};
  CHECK(hak_run_self("--exit", json, out, sizeof out) == 0);
  CHECK(strstr(out, "hakmem:") == NULL);
  f = fopen(path, "r");
  CHECK(f != NULL);
  if (f) {
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    CHECK(count(buf, "{\"class\": ") == HAK_STATS_CLASSES);
  }
  const char* bad[] = {"HAKMEM_STATS=json", NULL};
  CHECK(hak_run_self("--exit", bad, out, sizeof out) == 0);
  CHECK(strstr(out, "hakmem: invalid value: HAKMEM_STATS=json") != NULL);
  unlink(path);
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--exit") == 0) { /* a child of test_reports */
    hak_free(hak_malloc(100));
    return 0;
  }
  test_counts();
  test_observed();
  test_reports();
  return hak_test_result("test_stats");
}
