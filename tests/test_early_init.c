/* test_early_init: allocations made before main, in another library's
 * high-priority constructor (early_lib) and in this program's
 * .preinit_array (which runs before any library constructor), work and give
 * blocks that the program can later use and free.  Built twice: linked to
 * libhakmem.so, and not linked to it but run with LD_PRELOAD. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "early_lib.h"
#include "harness.h"
#include "test_util.h"

static int preinit_status;
static char* preinit_block;

static void preinit_alloc(int argc, char** argv, char** envp) {
  (void)argc;
  (void)argv;
  (void)envp;
  int ok = 1;
  for (int i = 1; i <= 64; i++) {
    char* p = malloc((size_t)i * 16);
    if (!p) ok = 0;
    else memset(p, i, (size_t)i * 16);
    free(p);
  }
  char* c = calloc(10, 100);
  if (!c) ok = 0;
  else
    for (int i = 0; i < 1000; i++) ok &= c[i] == 0;
  c = realloc(c, 50000);
  if (!c) ok = 0;
  free(c);
  preinit_block = strdup("from .preinit_array");
  if (!preinit_block) ok = 0;
  preinit_status = ok ? 1 : 2;
}

__attribute__((section(".preinit_array"), used)) static void (*const preinit_entry)(int, char**, char**) =
    preinit_alloc;

int main(void) {
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("malloc");
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("free");
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("posix_memalign");

  if (early_lib_status != EARLY_ALL) {
    fprintf(stderr, "check failed: early_lib's constructor status 0x%x, want 0x%x (missing 0x%x)\n",
            (unsigned)early_lib_status, (unsigned)EARLY_ALL,
            (unsigned)(EARLY_ALL & ~early_lib_status));
    hak_test_failures++;
  }
  if (early_lib_block) {
    CHECK(malloc_usable_size(early_lib_block) >= early_lib_block_size);
    int kept = 1;
    for (size_t i = 0; i < early_lib_block_size; i++)
      kept &= early_lib_block[i] == (unsigned char)(i * 7);
    CHECK(kept);
    unsigned char* g = realloc(early_lib_block, 70000);
    CHECK(g != NULL);
    if (g) {
      for (size_t i = 0; i < early_lib_block_size; i++) kept &= g[i] == (unsigned char)(i * 7);
      CHECK(kept);
      free(g);
    }
  }

  CHECK(preinit_status == 1);
  if (preinit_block) {
    CHECK(strcmp(preinit_block, "from .preinit_array") == 0);
    CHECK(malloc_usable_size(preinit_block) >= 20);
    free(preinit_block);
  }
  /* The allocator works normally afterwards. */
  for (int i = 0; i < 10000; i++) {
    void* p = malloc((size_t)(i % 5000) + 1);
    CHECK(p != NULL);
    free(p);
  }
  return hak_test_result("test_early_init");
}
