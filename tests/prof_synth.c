/* prof_synth: writes a heap profile in gperftools' heap_v2 text format, as
 * hakmem's sampling profiler does, with made-up counts at real return
 * addresses of this program, for tests/check_hakmem_command.py (`hakmem
 * prof`).  Each stack, innermost first: a frame in a function named hak_*
 * of this program (the allocator's, when it is linked in statically), one in
 * libhakmem.so's malloc, a return address in alloc_site_X (after a call),
 * one in main.  Prints the rate and each site's sampled counts on stdout.
 * Usage: prof_synth PROFILE */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "hakmem.h"

#define RATE 524288

/* Not called: its address (plus one, as a return address) is the innermost frame. */
__attribute__((noinline, used)) static int hak_test_sampler(int x) { return x * 3 + 1; }

/* Its own return address: an address in its caller just after the call. */
__attribute__((noinline)) static void* return_here(void) { return __builtin_return_address(0); }

/* The allocation sites: where in themselves a call returns, and where in main. */
__attribute__((noinline)) void alloc_site_a(void** pcs) {
  pcs[0] = return_here();
  pcs[1] = __builtin_return_address(0);
}
__attribute__((noinline)) void alloc_site_b(void** pcs) {
  pcs[0] = return_here();
  pcs[1] = __builtin_return_address(0);
}
__attribute__((noinline)) void alloc_site_c(void** pcs) {
  pcs[0] = return_here();
  pcs[1] = __builtin_return_address(0);
}

typedef struct {
  const char* name;
  void (*fn)(void**);
  long live_objs, live_bytes, alloc_objs, alloc_bytes;
} site_t;

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: prof_synth PROFILE\n");
    return 2;
  }
  hak_free(hak_malloc(16)); /* libhakmem.so is needed (linkers may drop an unused library) */
  /* malloc as libhakmem.so defines it (not a PLT entry of this program). */
  void* lib = dlopen("libhakmem.so.0", RTLD_LAZY | RTLD_NOLOAD);
  void* malloc_addr = lib ? dlsym(lib, "malloc") : NULL;
  if (malloc_addr == NULL) {
    fprintf(stderr, "prof_synth: libhakmem.so.0 is not loaded\n");
    return 1;
  }
  /* Site a holds the most live; site c held nothing live but allocated the most. */
  site_t sites[] = {
      {"alloc_site_a", alloc_site_a, 20, 20 * 4096, 30, 30 * 4096},
      {"alloc_site_b", alloc_site_b, 5, 5 * 256, 9, 9 * 256},
      {"alloc_site_c", alloc_site_c, 0, 0, 50, 50 * 1024},
  };
  enum { SITES = sizeof sites / sizeof sites[0] };
  void* pcs[SITES][2];
  long total[4] = {0, 0, 0, 0};
  for (int i = 0; i < SITES; i++) {
    void (*volatile fn)(void**) = sites[i].fn; /* a real call from main, never inlined */
    fn(pcs[i]);
    total[0] += sites[i].live_objs;
    total[1] += sites[i].live_bytes;
    total[2] += sites[i].alloc_objs;
    total[3] += sites[i].alloc_bytes;
  }
  FILE* out = fopen(argv[1], "w");
  if (out == NULL) {
    perror(argv[1]);
    return 1;
  }
  fprintf(out, "heap profile: %6ld: %8ld [%6ld: %8ld] @ heap_v2/%d\n", total[0], total[1], total[2], total[3],
          RATE);
  for (int i = 0; i < SITES; i++)
    fprintf(out, "%6ld: %8ld [%6ld: %8ld] @ %p %p %p %p\n", sites[i].live_objs, sites[i].live_bytes,
            sites[i].alloc_objs, sites[i].alloc_bytes, (void*)((uintptr_t)hak_test_sampler + 1),
            (void*)((uintptr_t)malloc_addr + 1), pcs[i][0], pcs[i][1]);
  fprintf(out, "\nMAPPED_LIBRARIES:\n");
  FILE* maps = fopen("/proc/self/maps", "r");
  if (maps == NULL) return 1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, maps)) > 0) fwrite(buf, 1, n, out);
  fclose(maps);
  if (fclose(out) != 0) return 1;
  printf("rate %d\n", RATE);
  for (int i = 0; i < SITES; i++)
    printf("site %s %ld %ld %ld %ld\n", sites[i].name, sites[i].live_objs, sites[i].live_bytes, sites[i].alloc_objs,
           sites[i].alloc_bytes);
  return 0;
}
