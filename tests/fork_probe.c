/* fork_probe: a library between hakmem and libc (test_fork_start links it
 * after libhakmem) that sees every registration of fork handlers on its way
 * to libc's __register_atfork, hakmem's own among them, and keeps their
 * order: which object registered first, and how many hakmem made. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

typedef int register_fn(void (*)(void), void (*)(void), void (*)(void), void*);

static atomic_int hakmem_count, total;
static atomic_int hakmem_first_at = -1; /* the index of hakmem's first registration */

__attribute__((visibility("default"))) int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), void* dso) {
  static register_fn* libc_register;
  if (libc_register == NULL) libc_register = (register_fn*)dlsym(RTLD_NEXT, "__register_atfork");
  int index = atomic_fetch_add(&total, 1);
  Dl_info info;
  if (dladdr(dso, &info) && info.dli_fname != NULL && strstr(info.dli_fname, "libhakmem") != NULL) {
    int none = -1;
    atomic_compare_exchange_strong(&hakmem_first_at, &none, index);
    atomic_fetch_add(&hakmem_count, 1);
  }
  return libc_register(prepare, parent, child, dso);
}

__attribute__((visibility("default"))) int fork_probe_hakmem_registrations(void) { return atomic_load(&hakmem_count); }
__attribute__((visibility("default"))) int fork_probe_hakmem_first_at(void) { return atomic_load(&hakmem_first_at); }
