/* hakmem_probe: a plain C program (not linked with hakmem, no sanitizer) for
 * tests/check_hakmem_command.py to run under `hakmem run`.  It reports on
 * stdout the object malloc resolves into (its path), LD_PRELOAD and HAKMEM_LIBDIR as it
 * sees them, and hakmem's options (hak_option_get, found with dlsym); then
 * does what its arguments ask:
 *   --option NAME      report option NAME ("option NAME=VALUE", or "... unavailable")
 *   --hold N SIZE      allocate N blocks of SIZE bytes and keep them to the end
 *   --exit STATUS      exit with STATUS
 *   --kill SIGNAL      end by raising SIGNAL */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*option_get_t)(const char* name, long* value);

int main(int argc, char** argv) {
  Dl_info info;
  void* m = dlsym(RTLD_DEFAULT, "malloc");
  printf("malloc-object %s\n", m && dladdr(m, &info) && info.dli_fname ? info.dli_fname : "?");
  const char* pre = getenv("LD_PRELOAD");
  const char* libdir = getenv("HAKMEM_LIBDIR");
  printf("LD_PRELOAD=%s\n", pre ? pre : "(unset)");
  printf("HAKMEM_LIBDIR=%s\n", libdir ? libdir : "(unset)");
  option_get_t get = (option_get_t)dlsym(RTLD_DEFAULT, "hak_option_get");
  int status = 0, sig = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--option") == 0 && i + 1 < argc) {
      long v;
      const char* name = argv[++i];
      if (get != NULL && get(name, &v) == 0)
        printf("option %s=%ld\n", name, v);
      else
        printf("option %s unavailable\n", name);
    } else if (strcmp(argv[i], "--hold") == 0 && i + 2 < argc) {
      long n = atol(argv[i + 1]);
      size_t size = (size_t)atol(argv[i + 2]);
      i += 2;
      for (long k = 0; k < n; k++) {
        char* p = malloc(size);
        if (p == NULL) return 1;
        memset(p, 1, size); /* kept: the statistics at exit see them live */
      }
    } else if (strcmp(argv[i], "--exit") == 0 && i + 1 < argc) {
      status = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--kill") == 0 && i + 1 < argc) {
      sig = atoi(argv[++i]);
    } else {
      fprintf(stderr, "hakmem_probe: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  fflush(stdout);
  if (sig) raise(sig);
  return status;
}
