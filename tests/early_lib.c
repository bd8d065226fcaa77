/* early_lib: a shared library whose constructor, with a high priority,
 * allocates before the program (and possibly before the allocator's own
 * initialisation) runs.  It records what worked in early_lib_status and
 * leaves one block for the program to verify and free. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "early_lib.h"

int early_lib_status;
unsigned char* early_lib_block;
size_t early_lib_block_size;

static void* early_thread(void* arg) {
  (void)arg;
  int ok = 1;
  for (int i = 0; i < 1000; i++) {
    char* p = malloc((size_t)(i % 300) + 1);
    if (!p) ok = 0;
    else memset(p, i, (size_t)(i % 300) + 1);
    free(p);
  }
  return ok ? (void*)1 : NULL;
}

__attribute__((constructor(101))) static void early_lib_init(void) {
  int st = 0;
  void* p = malloc(24);
  if (p) {
    memset(p, 1, 24);
    st |= EARLY_MALLOC;
  }
  free(p);

  unsigned char* c = calloc(100, 10);
  if (c) {
    int zero = 1;
    for (int i = 0; i < 1000; i++) zero &= c[i] == 0;
    if (zero) st |= EARLY_CALLOC;
    memset(c, 7, 1000);
    unsigned char* r = realloc(c, 100000);
    if (r) {
      int kept = 1;
      for (int i = 0; i < 1000; i++) kept &= r[i] == 7;
      if (kept) st |= EARLY_REALLOC;
      c = r;
    }
  }
  free(c);

  char* s = strdup("allocated in a constructor before main");
  if (s && strcmp(s, "allocated in a constructor before main") == 0) st |= EARLY_STRDUP;
  free(s);

  void* a = NULL;
  if (posix_memalign(&a, 4096, 5000) == 0 && a && ((uintptr_t)a & 4095) == 0) {
    memset(a, 3, 5000);
    st |= EARLY_MEMALIGN;
  }
  free(a);

  /* Many small blocks and a big one. */
  void* many[256];
  int all = 1;
  for (int i = 0; i < 256; i++) {
    many[i] = malloc((size_t)i * 8 + 1);
    all &= many[i] != NULL;
  }
  for (int i = 0; i < 256; i++) free(many[i]);
  void* big = malloc(8 << 20);
  all &= big != NULL;
  if (big) memset(big, 9, 8 << 20);
  free(big);
  if (all) st |= EARLY_MANY;

  pthread_t t;
  void* res = NULL;
  if (pthread_create(&t, NULL, early_thread, NULL) == 0 && pthread_join(t, &res) == 0 && res)
    st |= EARLY_THREAD;

  /* One block outlives the constructor. */
  early_lib_block_size = 3000;
  early_lib_block = malloc(early_lib_block_size);
  if (early_lib_block) {
    for (size_t i = 0; i < early_lib_block_size; i++) early_lib_block[i] = (unsigned char)(i * 7);
    st |= EARLY_KEPT;
  }
  early_lib_status = st | EARLY_RAN;
}
