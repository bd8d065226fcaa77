/* test_malloc_info: glibc's mallopt and malloc_info through libhakmem.so.
 * mallopt's answers are checked here; malloc_info's XML is written into the
 * file named by argv[1], with what this program holds at that moment printed
 * on stdout as key=value pairs, and tests/check_malloc_info.py parses the XML
 * and checks its figures against them.  Without an argument, only the checks
 * made here run. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "test_util.h"

#define BLOCKS 100
#define BLOCK_SIZE 20000             /* a class nothing else in the program uses */
#define HUGE_SIZE ((size_t)3 << 20)  /* above 1 MiB: a mapping of its own */

static void test_mallopt(void) {
  CHECK(strstr(hak_object_of((void*)mallopt), "libhakmem") != NULL);
  /* glibc's parameters are accepted (and have no effect in hakmem). */
  CHECK(mallopt(M_TRIM_THRESHOLD, 128 * 1024) == 1);
  CHECK(mallopt(M_TRIM_THRESHOLD, -1) == 1);
  CHECK(mallopt(M_TOP_PAD, 0) == 1);
  CHECK(mallopt(M_MMAP_THRESHOLD, 256 * 1024) == 1);
  CHECK(mallopt(M_MMAP_MAX, 0) == 1);
  CHECK(mallopt(M_CHECK_ACTION, 3) == 1);
  CHECK(mallopt(M_PERTURB, 0xa5) == 1);
  CHECK(mallopt(M_ARENA_TEST, 8) == 1);
  CHECK(mallopt(M_ARENA_MAX, 1) == 1);
  CHECK(mallopt(M_NLBLKS, 0) == 1);
  CHECK(mallopt(M_GRAIN, 0) == 1);
  CHECK(mallopt(M_KEEP, 0) == 1);
  /* M_MXFAST: glibc's range, 0 to 80 * sizeof(size_t) / 4 bytes. */
  CHECK(mallopt(M_MXFAST, 0) == 1);
  CHECK(mallopt(M_MXFAST, 64) == 1);
  CHECK(mallopt(M_MXFAST, (int)(80 * sizeof(size_t) / 4)) == 1);
  CHECK(mallopt(M_MXFAST, (int)(80 * sizeof(size_t) / 4) + 1) == 0);
  CHECK(mallopt(M_MXFAST, -1) == 0);
  /* An unknown parameter. */
  CHECK(mallopt(12345, 1) == 0);
  CHECK(mallopt(-100, 1) == 0);
  /* And allocation goes on as before. */
  void* p = malloc(100);
  CHECK(p != NULL);
  free(p);
}

static void test_malloc_info_errors(void) {
  CHECK(strstr(hak_object_of((void*)malloc_info), "libhakmem") != NULL);
  errno = 0;
  CHECK(malloc_info(1, stderr) == -1 && errno == EINVAL);
  errno = 0;
  CHECK(malloc_info(0, NULL) == -1 && errno == EINVAL);
}

/* Holds BLOCKS blocks of BLOCK_SIZE and one huge block while malloc_info
 * writes into path; prints what it held. */
static void write_info(const char* path) {
  static char stdio_buf[1 << 16]; /* the file's buffer: malloc_info's output allocates nothing */
  FILE* f = fopen(path, "w");
  REQUIRE(f != NULL);
  REQUIRE(setvbuf(f, stdio_buf, _IOFBF, sizeof stdio_buf) == 0);
  void* blocks[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) {
    blocks[i] = malloc(BLOCK_SIZE);
    REQUIRE(blocks[i] != NULL);
    memset(blocks[i], i, BLOCK_SIZE);
  }
  void* huge = malloc(HUGE_SIZE);
  REQUIRE(huge != NULL);
  memset(huge, 1, HUGE_SIZE);
  size_t usable = malloc_usable_size(blocks[0]);
  struct mallinfo2 mi = mallinfo2(); /* nothing allocates between this and malloc_info */
  CHECK(malloc_info(0, f) == 0);
  CHECK(fclose(f) == 0);
  printf("usable=%zu blocks=%d huge_size=%zu uordblks=%zu hblks=%zu hblkhd=%zu arena=%zu\n", usable, BLOCKS,
         HUGE_SIZE, mi.uordblks, mi.hblks, mi.hblkhd, mi.arena);
  fflush(stdout);
  for (int i = 0; i < BLOCKS; i++) free(blocks[i]);
  free(huge);
}

int main(int argc, char** argv) {
  test_mallopt();
  test_malloc_info_errors();
  if (argc > 1) write_info(argv[1]);
  return hak_test_result("test_malloc_info");
}
