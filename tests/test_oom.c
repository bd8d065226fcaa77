/* test_oom: out of memory under an address-space limit (ulimit -v).  In a
 * child whose RLIMIT_AS leaves 192 MiB above what it has mapped, blocks of
 * every size range (small, mid, large, huge) are allocated until malloc
 * fails; each failure must be NULL with errno ENOMEM, never an abort.  Then
 * half the blocks are freed and allocation must succeed again, three times
 * over; the blocks kept must keep their contents; calloc and realloc fail
 * cleanly too (realloc leaving the block as it was); and once everything is
 * freed, a block as big as the most held at once fits again (nothing leaked
 * inside the allocator).  And nothing is reserved ahead of need under the
 * limit: beside a huge block, most of the room comes in small blocks; and
 * after the room was filled with blocks in segments and all freed, a huge
 * block fits.
 * Linked with hakmem. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "test_util.h"

enum { SLOTS = 65536 };
static unsigned char* blocks[SLOTS];
static size_t sizes[SLOTS];

static size_t mapped_bytes(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  unsigned long pages = 0;
  if (f != NULL) {
    if (fscanf(f, "%lu", &pages) != 1) pages = 0;
    fclose(f);
  }
  return pages * (size_t)sysconf(_SC_PAGESIZE);
}

static size_t pick(hak_rng* r) {
  unsigned u = (unsigned)(hak_rng_next(r) % 100);
  if (u < 60) return hak_rng_range(r, 1, 1024);
  if (u < 85) return hak_rng_range(r, 1025, 128 * 1024);
  if (u < 97) return hak_rng_range(r, 128 * 1024 + 1, 1 << 20);
  return hak_rng_range(r, (1 << 20) + 1, 8 << 20);
}

/* Fills free slots until malloc fails; returns how many it filled. */
static size_t fill(hak_rng* r, size_t* failures) {
  size_t got = 0;
  for (size_t i = 0; i < SLOTS; i++) {
    if (blocks[i] != NULL) continue;
    size_t n = pick(r);
    errno = 0;
    unsigned char* p = malloc(n);
    if (p == NULL) {
      CHECK(errno == ENOMEM);
      if (++*failures >= 64) break; /* the limit is reached for good */
      continue;
    }
    hak_pattern_fill(p, n, (uintptr_t)i);
    blocks[i] = p;
    sizes[i] = n;
    got++;
  }
  return got;
}

static void check_and_free(size_t i) {
  if (blocks[i] == NULL) return;
  CHECK(hak_pattern_check(blocks[i], sizes[i], (uintptr_t)i) == sizes[i]);
  free(blocks[i]);
  blocks[i] = NULL;
}

static int child(void) {
  struct rlimit lim;
  REQUIRE(getrlimit(RLIMIT_AS, &lim) == 0);
  size_t cap = mapped_bytes() + ((size_t)192 << 20);
  lim.rlim_cur = cap;
  REQUIRE(setrlimit(RLIMIT_AS, &lim) == 0);
  hak_rng r;
  hak_rng_seed(&r, 99);
  size_t most = 0;
  for (int round = 0; round < 3; round++) {
    size_t failures = 0;
    size_t got = fill(&r, &failures);
    printf("round %d: %zu blocks allocated, %zu failures\n", round, got, failures);
    CHECK(got > 0);
    CHECK(failures > 0); /* the limit was reached */
    size_t held = 0;
    for (size_t i = 0; i < SLOTS; i++) held += blocks[i] ? sizes[i] : 0;
    if (held > most) most = held;
    /* At the limit: calloc and realloc fail cleanly too. */
    errno = 0;
    CHECK(calloc(1, (size_t)512 << 20) == NULL && errno == ENOMEM);
    size_t k = 0;
    while (k < SLOTS && blocks[k] == NULL) k++;
    REQUIRE(k < SLOTS);
    errno = 0;
    CHECK(realloc(blocks[k], (size_t)512 << 20) == NULL && errno == ENOMEM);
    for (size_t i = 0; i < SLOTS; i += 2) check_and_free(i); /* also checks blocks[k] */
  }
  for (size_t i = 0; i < SLOTS; i++) check_and_free(i);
  /* Everything freed: the most held at once fits again, in one block. */
  size_t want = most / 2;
  unsigned char* big = malloc(want);
  printf("after freeing all: %zu MiB in one block %s\n", want >> 20, big ? "ok" : "failed");
  CHECK(big != NULL);
  if (big != NULL) {
    memset(big, 1, want);
    free(big);
  }
  /* And small blocks still come. */
  for (int i = 0; i < 1000; i++) {
    void* p = malloc(48);
    CHECK(p != NULL);
    free(p);
  }
  return hak_test_result("test_oom (child)");
}

/* With 320 MiB of room: a huge block, then 4 KiB blocks until malloc
 * fails.  Nothing is reserved ahead of need under the limit (the huge-block
 * arena's 256 MiB chunk left 49 MiB for the rest: a review found it), so
 * most of the room is there for the blocks. */
static int child_reserve(void) {
  struct rlimit lim;
  REQUIRE(getrlimit(RLIMIT_AS, &lim) == 0);
  size_t room = (size_t)320 << 20;
  lim.rlim_cur = mapped_bytes() + room;
  REQUIRE(setrlimit(RLIMIT_AS, &lim) == 0);
  unsigned char* huge = malloc((size_t)3 << 20);
  REQUIRE(huge != NULL);
  memset(huge, 7, (size_t)3 << 20);
  size_t got = 0;
  void** list = NULL;
  for (;;) {
    errno = 0;
    void** p = malloc(4096);
    if (p == NULL) {
      CHECK(errno == ENOMEM);
      break;
    }
    *p = list; /* (a list through the blocks: no array to grow) */
    list = p;
    got += 4096;
  }
  printf("a huge block, then %zu MiB of 4 KiB blocks in %zu MiB of room\n", got >> 20, room >> 20);
  CHECK(got >= room / 2);
  while (list != NULL) {
    void** next = *list;
    free(list);
    list = next;
  }
  for (size_t i = 0; i < ((size_t)3 << 20); i += 4096) CHECK(huge[i] == 7);
  free(huge);
  return hak_test_result("test_oom (reserve)");
}

/* With 256 MiB of room: 200 KB blocks (large blocks, in segments) until
 * malloc fails, all freed, then a huge block must fit: the free segments,
 * kept mapped otherwise, are unmapped when its mapping is refused (a review
 * found huge blocks refused for good after such a phase, malloc_trim or
 * not). */
static int child_segments_then_huge(void) {
  struct rlimit lim;
  REQUIRE(getrlimit(RLIMIT_AS, &lim) == 0);
  lim.rlim_cur = mapped_bytes() + ((size_t)256 << 20);
  REQUIRE(setrlimit(RLIMIT_AS, &lim) == 0);
  void** list = NULL;
  size_t got = 0;
  for (;;) {
    void** p = malloc(200000);
    if (p == NULL) break;
    *p = list;
    list = p;
    got++;
  }
  CHECK(got >= 600); /* (most of the room) */
  while (list != NULL) {
    void** next = *list;
    free(list);
    list = next;
  }
  errno = 0;
  unsigned char* huge = malloc((size_t)3 << 20);
  if (huge == NULL) fprintf(stderr, "a 3 MiB block after %zu blocks of 200 KB freed: errno %d\n", got, errno);
  REQUIRE(huge != NULL);
  memset(huge, 7, (size_t)3 << 20);
  void* again = malloc(200000);
  CHECK(again != NULL);
  free(again);
  free(huge);
  return hak_test_result("test_oom (segments, then a huge block)");
}

static void in_child(int (*fn)(void)) {
  fflush(stdout);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int rc = fn();
    fflush(stdout);
    _exit(rc);
  }
  int status;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (WIFSIGNALED(status)) fprintf(stderr, "the child died of signal %d\n", WTERMSIG(status));
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void) {
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("malloc");
  in_child(child_reserve);
  in_child(child_segments_then_huge);
  in_child(child);
  return hak_test_result("test_oom");
}
