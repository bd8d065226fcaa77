/* maps_probe: a plain C program (not linked with hakmem, no sanitizer) that
 * allocates a little and then prints the object malloc resolves into and
 * every file mapped into the process, one basename a line. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
  char* p = malloc(1000);
  if (!p) return 1;
  memset(p, 1, 1000);
  free(p);
  Dl_info info;
  void* m = dlsym(RTLD_DEFAULT, "malloc");
  const char* obj = m && dladdr(m, &info) && info.dli_fname ? info.dli_fname : "?";
  const char* slash = strrchr(obj, '/');
  printf("malloc-object %s\n", slash ? slash + 1 : obj);
  FILE* f = fopen("/proc/self/maps", "r");
  if (!f) return 1;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    char* path = strchr(line, '/');
    if (!path) continue;
    path[strcspn(path, "\n")] = 0;
    const char* base = strrchr(path, '/');
    printf("mapped %s\n", base ? base + 1 : path);
  }
  fclose(f);
  return 0;
}
