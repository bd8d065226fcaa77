/* A program of the hak_* API for valgrind's memcheck (tests/check_memcheck.py):
 * "clean" uses every kind of block (small, mid, large, huge, calloc, realloc
 * chains, aligned, freed by another thread) correctly, so memcheck must report
 * nothing; "uaf" reads a block after freeing it; "leak" loses a block. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "hakmem.h"

static void* free_them(void* arg) {
  void** blocks = arg;
  for (int i = 0; i < 64; i++) hak_free(blocks[i]);
  return NULL;
}

static int clean(void) {
  size_t sizes[] = {1, 16, 24, 100, 1000, 5000, 40000, 200000, 900000, 3 << 20};
  unsigned sum = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    unsigned char* p = hak_malloc(sizes[i]);
    memset(p, (int)i, sizes[i]);
    unsigned char* z = hak_calloc(1, sizes[i]);
    for (size_t k = 0; k < sizes[i]; k += 97) sum += z[k] + p[k];
    p = hak_realloc(p, sizes[i] * 3 + 1);
    sum += p[sizes[i] - 1];
    p = hak_realloc(p, sizes[i] / 2 + 1);
    sum += p[0];
    hak_free(p);
    hak_free(z);
  }
  /* A realloc chain from 16 bytes to 2 MiB, reading what it kept each time. */
  unsigned char* r = hak_malloc(16);
  memset(r, 7, 16);
  for (size_t n = 16; n < (2u << 20); n = n * 3 / 2) {
    r = hak_realloc(r, n * 3 / 2);
    sum += r[n - 1];
    memset(r, 7, n * 3 / 2);
  }
  hak_free(r);
  for (size_t align = 32; align <= (1u << 16); align *= 8) {
    unsigned char* a = hak_aligned_alloc(align, 3 * align);
    if (((uintptr_t)a & (align - 1)) != 0) return 1;
    memset(a, 1, 3 * align);
    sum += a[align];
    hak_free(a);
  }
  /* Blocks freed by another thread (remote frees), then reused here. */
  void* blocks[64];
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 64; i++) {
      blocks[i] = hak_malloc(48 + 16 * (size_t)i);
      memset(blocks[i], i, 48);
    }
    pthread_t t;
    pthread_create(&t, NULL, free_them, blocks);
    pthread_join(t, NULL);
  }
  for (int i = 0; i < 2000; i++) {
    unsigned char* p = hak_malloc(48);
    p[0] = (unsigned char)i;
    sum += p[0];
    hak_free(p);
  }
  printf("clean %u\n", sum);
  return 0;
}

static int use_after_free(void) {
  volatile unsigned char* p = hak_malloc(64);
  p[8] = 1;
  hak_free((void*)p);
  return p[8]; /* memcheck: an invalid read inside a block freed */
}

static void* leaky_function(void) {
  unsigned char* p = hak_malloc(1000);
  memset(p, 3, 1000);
  return p;
}

static int leak(void) {
  void* volatile lost = leaky_function();
  lost = NULL; /* the only pointer to it, gone */
  (void)lost;
  return 0;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "clean";
  if (strcmp(mode, "uaf") == 0) return use_after_free() == 255;
  if (strcmp(mode, "leak") == 0) return leak();
  return clean();
}
