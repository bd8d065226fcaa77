/* The sampling heap profiler (HAKMEM_PROF): what it writes, that freed
 * blocks leave the profile (also freed by another thread, also huge ones),
 * that its estimate of a leak is within 20% of the truth, that sampled blocks
 * behave as any other (contents, usable size, realloc, alignment), and that
 * the profile is written at exit and on HAKMEM_PROF_SIGNAL.  Through
 * libhakmem-prof.so, the profiling library; the program exports its symbols (-rdynamic) so that dladdr
 * names the frames. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hakmem.h"
#include "harness.h"
#include "test_util.h"

#define RATE 65536

/* One stack of a profile: its sampled live figures and the function that
 * made the allocation (the first frame outside the allocator). */
typedef struct {
  size_t live_count, live_bytes, alloc_count;
  char site[64];
} stack_t_;

typedef struct {
  long rate;
  size_t count;
  stack_t_ stacks[4096];
  int has_maps;
} profile_t;

static const char* frame_site(uintptr_t pc) {
  Dl_info info;
  if (dladdr((void*)(pc - 1), &info) == 0) return "?";
  if (info.dli_fname != NULL && strstr(info.dli_fname, "libhakmem") != NULL) return NULL; /* the allocator's */
  if (info.dli_sname == NULL) return "?";
  if (strcmp(info.dli_sname, "malloc") == 0 || strcmp(info.dli_sname, "calloc") == 0 ||
      strcmp(info.dli_sname, "realloc") == 0)
    return NULL;
  return info.dli_sname;
}

/* Reads a profile written in this process (its addresses are ours). */
static int profile_read(const char* path, profile_t* prof) {
  FILE* f = fopen(path, "r");
  if (f == NULL) return 0;
  memset(prof, 0, sizeof *prof);
  static char line[8192];
  size_t lc, lb, ac, ab;
  if (fgets(line, sizeof line, f) == NULL ||
      sscanf(line, "heap profile: %zu: %zu [%zu: %zu] @ heap_v2/%ld", &lc, &lb, &ac, &ab, &prof->rate) != 5) {
    fclose(f);
    return 0;
  }
  while (fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, "MAPPED_LIBRARIES:", 17) == 0) {
      prof->has_maps = 1;
      break;
    }
    stack_t_ s = {0};
    int used = 0;
    if (sscanf(line, "%zu: %zu [%zu: %zu] @%n", &s.live_count, &s.live_bytes, &s.alloc_count, &ab, &used) != 4)
      continue;
    strcpy(s.site, "?");
    for (char* at = line + used; *at != '\0' && *at != '\n';) {
      char* end;
      uintptr_t pc = (uintptr_t)strtoull(at, &end, 16);
      if (end == at) break;
      at = end;
      const char* site = frame_site(pc);
      if (site != NULL) {
        snprintf(s.site, sizeof s.site, "%s", site);
        break;
      }
    }
    if (prof->count < sizeof prof->stacks / sizeof prof->stacks[0]) prof->stacks[prof->count++] = s;
  }
  fclose(f);
  return 1;
}

/* The estimated live bytes made by site, unsampled as pprof does. */
static double profile_live_estimate(const profile_t* prof, const char* site, size_t* samples) {
  double total = 0;
  *samples = 0;
  for (size_t i = 0; i < prof->count; i++) {
    const stack_t_* s = &prof->stacks[i];
    if (strcmp(s->site, site) != 0 || s->live_count == 0) continue;
    double avg = (double)s->live_bytes / (double)s->live_count;
    total += (double)s->live_bytes / (1 - exp(-avg / (double)prof->rate));
    *samples += s->live_count;
  }
  return total;
}

static size_t profile_allocs_at(const profile_t* prof, const char* site) {
  size_t n = 0;
  for (size_t i = 0; i < prof->count; i++)
    if (strcmp(prof->stacks[i].site, site) == 0) n += prof->stacks[i].alloc_count;
  return n;
}

/* ---- the workload: every function here is a site the profile must name ---- */

#define LEAKS 12000
static void* leaked[LEAKS];
static size_t leaked_size[LEAKS];

__attribute__((noinline)) size_t leaky_function(void) {
  size_t total = 0;
  for (size_t i = 0; i < LEAKS; i++) {
    leaked_size[i] = 100 + (i * 37) % 4000;
    leaked[i] = malloc(leaked_size[i]);
    REQUIRE(leaked[i] != NULL);
    hak_pattern_fill(leaked[i], leaked_size[i], i);
    total += leaked_size[i];
  }
  return total;
}

__attribute__((noinline)) void churn_function(size_t bytes) {
  for (size_t done = 0, i = 0; done < bytes; i++) {
    size_t n = 16 + (i * 13) % 2000;
    void* volatile p = malloc(n);
    memset(p, 1, n);
    free(p);
    done += n;
  }
}

#define HANDED 4000
static void* handed[HANDED];
__attribute__((noinline)) void* thread_function(void* arg) {
  for (int i = 0; i < HANDED; i++) handed[i] = malloc(64 + (size_t)(i % 50) * 40);
  return arg;
}

#define HUGE_KEPT 20
static void* huge_kept[HUGE_KEPT];
__attribute__((noinline)) size_t huge_function(void) {
  size_t total = 0;
  for (int i = 0; i < HUGE_KEPT; i++) {
    void* volatile c = calloc(1, 3 << 20); /* freed at once */
    free(c);
    void* p = malloc(2 << 20);
    REQUIRE(p != NULL);
    memset(p, 7, 2 << 20);
    huge_kept[i] = realloc(p, 5 << 20); /* moves, with its sample */
    REQUIRE(huge_kept[i] != NULL);
    total += 5 << 20;
  }
  return total;
}

/* Sizes about the class limit (128 KiB) and the huge threshold (1 MiB),
 * where a sampled block changes kind; every one is likely sampled. */
#define EDGES 64
static void* edge_blocks[EDGES];
static size_t edge_sizes[EDGES];
__attribute__((noinline)) void edge_function(void) {
  static const size_t bases[] = {128 << 10, 1 << 20};
  for (int i = 0; i < EDGES; i++) {
    edge_sizes[i] = bases[i % 2] - 24 + (size_t)(i / 2) % 48;
    edge_blocks[i] = malloc(edge_sizes[i]);
    REQUIRE(edge_blocks[i] != NULL);
    CHECK(malloc_usable_size(edge_blocks[i]) >= edge_sizes[i]);
    hak_pattern_fill(edge_blocks[i], edge_sizes[i], 1000 + (uint64_t)i);
  }
}

__attribute__((noinline)) void aligned_function(void) {
  static const size_t aligns[] = {32, 64, 256, 4096};
  for (int i = 0; i < 20000; i++) {
    size_t align = aligns[i % 4];
    void* p = NULL;
    REQUIRE(posix_memalign(&p, align, 100 + (size_t)i % 3000) == 0);
    CHECK(hak_is_aligned(p, align));
    free(p);
  }
}

/* ---- the tests ------------------------------------------------------------ */

static char tmpdir[] = "/tmp/hak-prof-XXXXXX";

static void test_off(void) {
  long v = -1;
  CHECK(hak_option_get("PROF", &v) == 0 && v == 0);
  churn_function(32 << 20);
  char path[256];
  snprintf(path, sizeof path, "%s/off.heap", tmpdir);
  CHECK(hak_prof_write(path) == 0);
  profile_t* prof = malloc(sizeof *prof);
  REQUIRE(prof != NULL && profile_read(path, prof));
  CHECK(prof->count == 0); /* off: nothing sampled */
  CHECK(prof->has_maps);
  CHECK(hak_prof_write("/nonexistent-dir/x.heap") == ENOENT);
  free(prof);
}

static void test_on(void) {
  CHECK(hak_option_set("PROF_RATE", RATE) == 0);
  CHECK(hak_option_set("PROF", 1) == 0);
  churn_function(32 << 20); /* every thread notices within 16 MiB */

  size_t leak_truth = leaky_function();
  churn_function(64 << 20);
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, thread_function, NULL) == 0);
  pthread_join(t, NULL);
  for (int i = 0; i < HANDED; i++) free(handed[i]); /* remote frees of its samples */
  size_t huge_truth = huge_function();
  aligned_function();
  edge_function();
  for (int i = 0; i < EDGES; i++) {
    CHECK(hak_pattern_check(edge_blocks[i], edge_sizes[i], 1000 + (uint64_t)i) == edge_sizes[i]);
    free(edge_blocks[i]);
  }

  /* Sampled blocks are blocks like the others. */
  for (size_t i = 0; i < LEAKS; i++) {
    CHECK(hak_pattern_check(leaked[i], leaked_size[i], i) == leaked_size[i]);
    CHECK(malloc_usable_size(leaked[i]) >= leaked_size[i]);
    CHECK(hak_is_aligned(leaked[i], 16));
  }
  for (size_t i = 0; i < LEAKS; i += 7) {
    leaked[i] = realloc(leaked[i], leaked_size[i] + 1);
    REQUIRE(leaked[i] != NULL);
    CHECK(hak_pattern_check(leaked[i], leaked_size[i], i) == leaked_size[i]);
  }

  char path[256];
  snprintf(path, sizeof path, "%s/on.heap", tmpdir);
  CHECK(hak_prof_write(path) == 0);
  CHECK(hak_option_set("PROF", 0) == 0);
  profile_t* prof = malloc(sizeof *prof);
  REQUIRE(prof != NULL && profile_read(path, prof));
  CHECK(prof->rate == RATE);
  CHECK(prof->has_maps);

  size_t samples;
  double leak = profile_live_estimate(prof, "leaky_function", &samples);
  printf("leak: %zu bytes, estimated %.0f from %zu samples\n", leak_truth, leak, samples);
  CHECK(leak > 0.8 * (double)leak_truth && leak < 1.2 * (double)leak_truth);
  CHECK(samples > 50);
  double huge = profile_live_estimate(prof, "huge_function", &samples);
  printf("huge: %zu bytes, estimated %.0f from %zu samples\n", huge_truth, huge, samples);
  CHECK(huge > 0.95 * (double)huge_truth && huge < 1.05 * (double)huge_truth);
  /* Freed: sampled, and gone from the live heap. */
  CHECK(profile_allocs_at(prof, "churn_function") > 100);
  CHECK(profile_live_estimate(prof, "churn_function", &samples) == 0);
  CHECK(profile_allocs_at(prof, "thread_function") > 3);
  CHECK(profile_live_estimate(prof, "thread_function", &samples) == 0);
  CHECK(profile_allocs_at(prof, "aligned_function") == 0); /* aligned blocks are not sampled */
  CHECK(profile_allocs_at(prof, "edge_function") > EDGES / 2);
  CHECK(profile_live_estimate(prof, "edge_function", &samples) == 0);

  for (size_t i = 0; i < LEAKS; i++) free(leaked[i]);
  for (int i = 0; i < HUGE_KEPT; i++) free(huge_kept[i]);
  CHECK(hak_prof_write(path) == 0);
  CHECK(hak_prof_write("/dev/full") == ENOSPC); /* a write that fails is an error, not only the open */
  REQUIRE(profile_read(path, prof));
  CHECK(profile_live_estimate(prof, "leaky_function", &samples) == 0);
  CHECK(profile_live_estimate(prof, "huge_function", &samples) == 0);
  free(prof);
}

/* A child leaks and ends: its profile is written at exit, or on the signal.
 * The early child takes no sample (the rate is the largest) and raises the
 * signal, then another set at run time: each must write the profile, not
 * end the process (the handler came with the first sample: a review found
 * the signal killing such programs). */
static int child_main(const char* mode) {
  if (strcmp(mode, "signal-early-child") == 0) {
    raise(SIGUSR2);
    if (hak_option_set("PROF_SIGNAL", SIGUSR1) != 0) return 3;
    raise(SIGUSR1);
    fflush(stdout);
    _exit(0);
  }
  leaky_function();
  if (strcmp(mode, "signal-child") == 0) {
    raise(SIGUSR2);
    fflush(stdout);
    _exit(0); /* no exit handlers: only the signal wrote the profile */
  }
  return 0;
}

static void test_child(const char* mode) {
  char path[256], env_file[300], out[4096];
  bool early = strcmp(mode, "signal-early-child") == 0;
  snprintf(path, sizeof path, "%s/%s.heap", tmpdir, mode);
  snprintf(env_file, sizeof env_file, "HAKMEM_PROF=file:%s", path);
  const char* env[] = {env_file, early ? "HAKMEM_PROF_RATE=1073741824" : "HAKMEM_PROF_RATE=4096",
                       "HAKMEM_PROF_SIGNAL=12", NULL};
  CHECK(hak_run_self(mode, env, out, sizeof out) == 0);
  FILE* f = fopen(path, "r");
  CHECK(f != NULL);
  if (f == NULL) return;
  char line[256];
  size_t lc = 0, lb = 0, ac, ab;
  long rate = 0;
  CHECK(fgets(line, sizeof line, f) != NULL &&
        sscanf(line, "heap profile: %zu: %zu [%zu: %zu] @ heap_v2/%ld", &lc, &lb, &ac, &ab, &rate) == 5);
  if (early)
    CHECK(rate == 1073741824 && lc == 0);
  else
    CHECK(rate == 4096 && lc > 1000 && lb > 0);
  fclose(f);
}

int main(int argc, char** argv) {
  if (argc > 1) return child_main(argv[1]);
  REQUIRE(mkdtemp(tmpdir) != NULL);
  test_off();
  test_on();
  test_child("exit-child");
  test_child("signal-child");
  test_child("signal-early-child");
  char cmd[300]; /* KEEP=1: keep the profiles, and say where */
  snprintf(cmd, sizeof cmd, "%s %s", getenv("KEEP") ? "echo" : "rm -rf", tmpdir);
  CHECK(system(cmd) == 0);
  return hak_test_result("test_prof");
}
