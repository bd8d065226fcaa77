/* install_probe: built against an installed hakmem (tests/check_install.py),
 * through pkg-config and through the CMake package, shared and static.
 * Fails unless malloc is hakmem's (its statistics count the block) and the
 * hak_* API works; prints the header's version and every libhakmem file
 * mapped into the process, full path, one a line. */
#include <hakmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
  const size_t n = (size_t)4 << 20;
  hak_stats_t before, after;
  hak_stats_get(&before);
  char* p = malloc(n);
  if (!p) {
    fprintf(stderr, "install_probe: malloc(%zu) failed\n", n);
    return 1;
  }
  memset(p, 0x5a, n);
  hak_stats_get(&after);
  if (after.live_bytes < before.live_bytes + n) {
    fprintf(stderr, "install_probe: malloc is not hakmem's (live bytes %zu, then %zu)\n",
            before.live_bytes, after.live_bytes);
    return 1;
  }
  if (hak_usable_size(p) < n) {
    fprintf(stderr, "install_probe: hak_usable_size of a %zu-byte block is %zu\n", n, hak_usable_size(p));
    return 1;
  }
  free(p);
  char* q = hak_malloc(100);
  if (!q || hak_usable_size(q) < 100) {
    fprintf(stderr, "install_probe: hak_malloc(100) gave %p\n", (void*)q);
    return 1;
  }
  hak_free(q);
  printf("version %d.%d\n", HAKMEM_VERSION_MAJOR, HAKMEM_VERSION_MINOR);
  FILE* f = fopen("/proc/self/maps", "r");
  if (!f) return 1;
  char line[4096], last[4096] = "";
  while (fgets(line, sizeof line, f)) {
    char* path = strchr(line, '/');
    if (!path) continue;
    path[strcspn(path, "\n")] = 0;
    const char* base = strrchr(path, '/') + 1;
    if (strncmp(base, "libhakmem", 9) == 0 && strcmp(path, last) != 0) {
      printf("mapped %s\n", path);
      snprintf(last, sizeof last, "%s", path);
    }
  }
  fclose(f);
  return 0;
}
