/* test_cxx_late: a C program linked with hakmem loads a C++ library with
 * dlopen (RTLD_LOCAL), so libstdc++ comes after hakmem's operator new was
 * bound, and into the library's scope only.  A failing operator new there
 * must still throw std::bad_alloc (it stopped the program: hakmem's weak
 * references to libstdc++ had been bound to nothing), and the nothrow form
 * must still call the new_handler before it returns NULL.
 * Usage: test_cxx_late path/to/cxx_late_plugin.so */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "test_util.h"

int main(int argc, char** argv) {
  REQUIRE(argc == 2);
  free(malloc(hak_opaque(1)));
  /* (Sanitizer builds bring libstdc++ at start: the late case is not made there.) */
  void* early = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD);
  if (early != NULL) {
    fprintf(stderr, "note: libstdc++ already loaded at start\n");
    dlclose(early);
  }
  void* plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (plugin == NULL) fprintf(stderr, "dlopen: %s\n", dlerror());
  REQUIRE(plugin != NULL);
  int (*new_throws)(size_t) = (int (*)(size_t))dlsym(plugin, "plugin_new_throws");
  int (*nothrow_calls)(size_t) = (int (*)(size_t))dlsym(plugin, "plugin_nothrow_handler_calls");
  REQUIRE(new_throws != NULL && nothrow_calls != NULL);
  size_t too_big = hak_opaque((size_t)1 << 62);
  CHECK(new_throws(too_big) == 1);
  CHECK(new_throws(hak_opaque(100)) == 0);
  CHECK(nothrow_calls(too_big) == 1);
  CHECK(nothrow_calls(hak_opaque(100)) == -1);
  dlclose(plugin);
  return hak_test_result("test_cxx_late");
}
