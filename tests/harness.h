/* A tiny test harness: CHECK records a failure and goes on; the test's main
 * returns hak_test_result(), non-zero if any check failed. */
#ifndef HAK_TEST_HARNESS_H
#define HAK_TEST_HARNESS_H

#include <stdio.h>
#include <stdlib.h>

static int hak_test_failures;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
      hak_test_failures++;                                                       \
    }                                                                            \
  } while (0)

#define REQUIRE(cond)                                                            \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: required check failed: %s\n", __FILE__, __LINE__,  \
              #cond);                                                            \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

static inline int hak_test_result(const char* name) {
  if (hak_test_failures) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, hak_test_failures);
    return 1;
  }
  printf("%s: ok\n", name);
  return 0;
}

#endif
