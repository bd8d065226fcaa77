/* The drop-in names: the glibc malloc family and C++ operator new/delete.
 * Only in build/libhakmem.so and .a; the hakmem_api test library leaves them
 * to the system.  The C++ operators are written in C with their mangled names
 * so that a C program preloading hakmem gains no libstdc++ dependency. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>

#include "internal.h"

HAK_ENTRY void* malloc(size_t size) { return hak_alloc_inline(size); }
HAK_ENTRY void free(void* p) { hak_free_inline(p); }
HAK_ENTRY void* calloc(size_t count, size_t size) {
  hak_fork_watch(); /* pthread_create's calloc, before the new thread runs (internal.h) */
  return hak_calloc(count, size);
}

#if !HAK_STATIC_ARCHIVE
/* This file's calloc, to compare with the process's (init.c): only where
 * __register_atfork below stands in front of libc's (not in the static
 * archive, which a program may link whole with a static libc that defines
 * it too), since the fork handlers wait for either. */
void* hak_drop_in_calloc(void) { return (void*)calloc; }

typedef int register_atfork_fn(void (*)(void), void (*)(void), void (*)(void), void*);
extern void* __dso_handle __attribute__((weak, visibility("hidden")));

/* libc's __register_atfork: the next definition after hakmem's, or, where
 * hakmem comes after libc in the search order (a library that links it,
 * loaded by a program that does not), libc's own. */
static register_atfork_fn* libc_register_atfork(void) {
  static register_atfork_fn* next;
  if (next == NULL) next = (register_atfork_fn*)dlsym(RTLD_NEXT, "__register_atfork");
  if (next == NULL) {
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (libc != NULL) {
      next = (register_atfork_fn*)dlsym(libc, "__register_atfork");
      dlclose(libc);
    }
  }
  return next;
}

static int libc_register(void (*prepare)(void), void (*parent)(void), void (*child)(void), void* dso) {
  register_atfork_fn* next = libc_register_atfork();
  return next != NULL ? next(prepare, parent, child, dso) : ENOMEM;
}

int hak_libc_register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void)) {
  return libc_register(prepare, parent, child, __dso_handle);
}

/* A program's fork handlers (pthread_atfork, linked into each program,
 * calls this): hakmem's go in first, as if registered at start, so that
 * the program's prepare handlers run before hakmem's takes its locks and
 * its parent and child handlers after hakmem's releases them (glibc runs
 * prepare handlers newest first, the others oldest first): they may
 * allocate. */
HAK_API int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), void* dso) {
  hak_fork_handlers_register();
  return libc_register(prepare, parent, child, dso);
}
#endif
HAK_ENTRY void* realloc(void* p, size_t size) { return hak_realloc(p, size); }

HAK_API void* reallocarray(void* p, size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return hak_realloc(p, total);
}

/* (Bodies shared with glibc's own names below, and called, not named:
 * a function called in the file it is defined in gets a local alias of the
 * same address, which profiles would then show.) */
HAK_NOINLINE static int checked_posix_memalign(void** out, size_t align, size_t size) {
  if (align < sizeof(void*) || (align & (align - 1)) != 0) return EINVAL;
  int saved = errno;
  void* p = hak_alloc_aligned(align, size);
  errno = saved;
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
}

HAK_API int posix_memalign(void** out, size_t align, size_t size) { return checked_posix_memalign(out, align, size); }

HAK_API void* aligned_alloc(size_t align, size_t size) { return hak_aligned_alloc(align, size); }

/* memalign rounds an alignment that is not a power of two up, as glibc does. */
HAK_NOINLINE static void* rounded_memalign(size_t align, size_t size) {
  if (align > SIZE_MAX / 2 + 1) {
    errno = EINVAL;
    return NULL;
  }
  if (align & (align - 1)) align = (size_t)1 << (64 - __builtin_clzl(align));
  return hak_alloc_aligned(align, size);
}

HAK_API void* memalign(size_t align, size_t size) { return rounded_memalign(align, size); }

HAK_API void* valloc(size_t size) { return hak_alloc_aligned(HAK_OS_PAGE, size); }

HAK_NOINLINE static void* page_rounded_alloc(size_t size) {
  size_t rounded = (size + HAK_OS_PAGE - 1) & ~(size_t)(HAK_OS_PAGE - 1);
  if (rounded < size) {
    errno = ENOMEM;
    return NULL;
  }
  return hak_alloc_aligned(HAK_OS_PAGE, rounded ? rounded : HAK_OS_PAGE);
}

HAK_API void* pvalloc(size_t size) { return page_rounded_alloc(size); }

HAK_API size_t malloc_usable_size(void* p) { return hak_usable(p); }

/* glibc's own names for these, which a program or library may call directly
 * (a tracing shim forwarding to them, older code): the same entry points, so
 * that a block from one is freed by the other and never a foreign pointer.
 * tcmalloc and mimalloc replace them too. */
HAK_API void* __libc_malloc(size_t size) { return hak_malloc(size); }
HAK_API void __libc_free(void* p) { hak_free(p); }
HAK_API void* __libc_calloc(size_t count, size_t size) { return hak_calloc(count, size); }
HAK_API void* __libc_realloc(void* p, size_t size) { return hak_realloc(p, size); }
HAK_API void* __libc_memalign(size_t align, size_t size) { return rounded_memalign(align, size); }
HAK_API void* __libc_valloc(size_t size) { return hak_alloc_aligned(HAK_OS_PAGE, size); }
HAK_API void* __libc_pvalloc(size_t size) { return page_rounded_alloc(size); }
HAK_API int __posix_memalign(void** out, size_t align, size_t size) { return checked_posix_memalign(out, align, size); }

/* ---- glibc's malloc inspection calls ------------------------------------- */

/* Purges everything purgeable now; pad is ignored (nothing is kept at a heap top). */
HAK_API int malloc_trim(size_t pad) { return hak_trim() ? 1 : 0; }

/* Fields as glibc fills them: arena = bytes of the segments the heaps hold,
 * ordblks = pages in them, uordblks = bytes of the blocks handed out there,
 * fordblks = the rest of arena, hblks/hblkhd = huge blocks and their bytes. */
HAK_API struct mallinfo2 mallinfo2(void) {
  hak_usage_t u;
  hak_usage_get(&u);
  struct mallinfo2 mi = {0};
  mi.arena = u.segments * HAK_SEG_SIZE;
  mi.ordblks = u.pages;
  mi.hblks = u.huge_blocks;
  mi.hblkhd = u.huge_bytes;
  mi.uordblks = u.in_use_bytes;
  mi.fordblks = mi.arena > mi.uordblks ? mi.arena - mi.uordblks : 0;
  return mi;
}

static int clamp_int(size_t v) { return v > INT_MAX ? INT_MAX : (int)v; }

HAK_API struct mallinfo mallinfo(void) {
  struct mallinfo2 m2 = mallinfo2();
  struct mallinfo mi = {0};
  mi.arena = clamp_int(m2.arena);
  mi.ordblks = clamp_int(m2.ordblks);
  mi.hblks = clamp_int(m2.hblks);
  mi.hblkhd = clamp_int(m2.hblkhd);
  mi.uordblks = clamp_int(m2.uordblks);
  mi.fordblks = clamp_int(m2.fordblks);
  return mi;
}

/* To stderr, like glibc's: the report HAKMEM_STATS prints at exit. */
HAK_API void malloc_stats(void) { hak_stats_report_fd(2); }

/* glibc's XML report, with hakmem's figures (docs/CONFIG.md, "glibc's mallopt
 * and malloc_info"): one heap, the segments of every thread; a <size> per
 * class holding pages, its free blocks as glibc counts free chunks (total,
 * count) and hakmem's blocks handed out (live); fast = free blocks of the
 * classes up to 1 KiB, rest = those of the larger classes and the segments'
 * free 64 KiB units; mmap = the huge blocks; system = committed bytes;
 * aspace = address space mapped.  The figures are gathered first, under the
 * locks of hak_usage_get and hak_stats_get, and printed after: fprintf may
 * allocate, through hakmem, and no hakmem lock is held then. */
HAK_API int malloc_info(int options, FILE* fp) {
  if (options != 0 || fp == NULL) {
    errno = EINVAL;
    return -1;
  }
  hak_usage_t u;
  hak_stats_t st;
  hak_usage_get(&u);
  hak_stats_get(&st);
  size_t fast = 0, fast_bytes = 0, rest = 0, rest_bytes = 0;
  for (unsigned k = 0; k < HAK_STAT_CLASSES; k++) {
    bool small = k < HAK_CLASSES && hak_class_size[k] <= HAK_SMALL_MAX;
    *(small ? &fast : &rest) += u.class_free[k];
    *(small ? &fast_bytes : &rest_bytes) += u.class_free_bytes[k];
  }
  rest += u.free_unit_bytes >> HAK_UNIT_SHIFT;
  rest_bytes += u.free_unit_bytes;
  /* The segments' share of what is committed: the rest is the huge blocks'. */
  size_t huge_committed = st.huge_live_bytes + hak_huge_cached_bytes();
  size_t seg_committed = st.committed_bytes > huge_committed ? st.committed_bytes - huge_committed : 0;
  size_t seg_space = (u.segments + u.cached_segments) * HAK_SEG_SIZE;

  fprintf(fp, "<malloc version=\"1\">\n<heap nr=\"0\">\n<sizes>\n");
  for (unsigned k = 0; k < HAK_STAT_CLASSES; k++) {
    if (u.class_pages[k] == 0) continue;
    size_t from = k == 0 ? 1 : hak_class_size[k - 1] + 1;
    size_t to = k < HAK_CLASSES ? hak_class_size[k] : HAK_LARGE_MAX;
    fprintf(fp, "  <size from=\"%zu\" to=\"%zu\" total=\"%zu\" count=\"%zu\" live=\"%zu\" pages=\"%zu\"/>\n",
            from, to, u.class_free_bytes[k], u.class_free[k], u.class_live[k], u.class_pages[k]);
  }
  fprintf(fp, "</sizes>\n");
  fprintf(fp, "<total type=\"fast\" count=\"%zu\" size=\"%zu\"/>\n", fast, fast_bytes);
  fprintf(fp, "<total type=\"rest\" count=\"%zu\" size=\"%zu\"/>\n", rest, rest_bytes);
  fprintf(fp, "<system type=\"current\" size=\"%zu\"/>\n", seg_committed);
  fprintf(fp, "<system type=\"max\" size=\"%zu\"/>\n", st.peak_committed_bytes);
  fprintf(fp, "<aspace type=\"total\" size=\"%zu\"/>\n", seg_space);
  fprintf(fp, "<aspace type=\"mprotect\" size=\"%zu\"/>\n", seg_space);
  fprintf(fp, "</heap>\n");
  fprintf(fp, "<total type=\"fast\" count=\"%zu\" size=\"%zu\"/>\n", fast, fast_bytes);
  fprintf(fp, "<total type=\"rest\" count=\"%zu\" size=\"%zu\"/>\n", rest, rest_bytes);
  fprintf(fp, "<total type=\"mmap\" count=\"%zu\" size=\"%zu\"/>\n", st.huge_live, st.huge_live_bytes);
  fprintf(fp, "<system type=\"current\" size=\"%zu\"/>\n", st.committed_bytes);
  fprintf(fp, "<system type=\"max\" size=\"%zu\"/>\n", st.peak_committed_bytes);
  fprintf(fp, "<aspace type=\"total\" size=\"%zu\"/>\n", st.reserved_bytes);
  fprintf(fp, "<aspace type=\"mprotect\" size=\"%zu\"/>\n", st.reserved_bytes);
  fprintf(fp, "</malloc>\n");
  return 0;
}

/* glibc's tuning calls: accepted and ignored (docs/CONFIG.md says why each
 * has no counterpart; hakmem's own options are set with hak_option_set).
 * M_MXFAST keeps glibc's range (0 to 80 * sizeof(size_t) / 4 bytes);
 * an unknown parameter gets 0. */
HAK_API int mallopt(int param, int value) {
  switch (param) {
    case M_MXFAST:
      return value >= 0 && (size_t)value <= 80 * sizeof(size_t) / 4;
    case M_NLBLKS: case M_GRAIN: case M_KEEP:
    case M_TRIM_THRESHOLD: case M_TOP_PAD: case M_MMAP_THRESHOLD: case M_MMAP_MAX:
    case M_CHECK_ACTION: case M_PERTURB: case M_ARENA_TEST: case M_ARENA_MAX:
      return 1;
    default:
      return 0;
  }
}
HAK_API void free_sized(void* p, size_t size) { hak_free_inline(p); }
HAK_API void free_aligned_sized(void* p, size_t align, size_t size) { hak_free_inline(p); }
HAK_API void cfree(void* p) { hak_free_inline(p); }

/* ---- C++ ------------------------------------------------------------------ */

/* Bound at load time when the program came with libstdc++ (a C++ program). */
typedef void (*hak_new_handler_t)(void);
typedef hak_new_handler_t (*hak_get_new_handler_t)(void);
typedef void (*hak_throw_t)(void);
extern hak_new_handler_t _ZSt15get_new_handlerv(void) __attribute__((weak));
extern void _ZSt17__throw_bad_allocv(void) __attribute__((weak, noreturn));

/* The C++ library's function `name` where it came after hakmem was bound (a
 * C program that loads a C++ library, whose operator new is hakmem's): looked
 * up in the C++ library itself, which a library opened with RTLD_LOCAL
 * brings into its own scope only.  NULL if there is none. */
HAK_COLD static void* cxx_library_symbol(const char* name) {
  static const char* const libraries[] = {"libstdc++.so.6", "libc++.so.1"};
  for (unsigned i = 0; i < sizeof libraries / sizeof libraries[0]; i++) {
    void* lib = dlopen(libraries[i], RTLD_LAZY | RTLD_NOLOAD);
    if (lib == NULL) continue;
    void* f = dlsym(lib, name);
    dlclose(lib);
    if (f != NULL) return f;
  }
  return NULL;
}

/* The new_handler installed, if any. */
HAK_COLD static hak_new_handler_t cxx_new_handler(void) {
  hak_get_new_handler_t get = _ZSt15get_new_handlerv;
  if (get == NULL) get = (hak_get_new_handler_t)cxx_library_symbol("_ZSt15get_new_handlerv");
  return get != NULL ? get() : NULL;
}

/* operator new: on failure call the new_handler and retry; with no handler,
 * throw std::bad_alloc. */
HAK_COLD static void* cxx_new_failed(size_t align, size_t size) {
  for (;;) {
    hak_new_handler_t handler = cxx_new_handler();
    if (handler == NULL) {
      hak_throw_t throw_bad_alloc = _ZSt17__throw_bad_allocv;
      if (throw_bad_alloc == NULL) throw_bad_alloc = (hak_throw_t)cxx_library_symbol("_ZSt17__throw_bad_allocv");
      if (throw_bad_alloc != NULL) throw_bad_alloc();
      hak_fatal("operator new failed and std::bad_alloc is not available; size", (void*)size);
    }
    handler();
    void* p = align <= HAK_ALIGN ? hak_alloc_inline(size) : hak_alloc_aligned(align, size);
    if (p != NULL) return p;
  }
}

/* The nothrow forms must call the new_handler too, and return NULL if it
 * throws.  C cannot catch, so with a handler installed they defer to the C++
 * library's own nothrow operator (the next definition of the same name, or
 * the library's own where it is not in the global scope), which calls our
 * throwing operator new inside a try block. */
typedef void* (*hak_nothrow_new_t)(size_t, const void*);
typedef void* (*hak_nothrow_new_aligned_t)(size_t, size_t, const void*);

HAK_COLD static void* cxx_nothrow_failed(const char* name, size_t align, size_t size,
                                         const void* nt) {
  if (cxx_new_handler() == NULL) return NULL;
  void* next = dlsym(RTLD_NEXT, name);
  if (next == NULL) next = cxx_library_symbol(name);
  if (next == NULL) return NULL;
  if (align == 0) return ((hak_nothrow_new_t)next)(size, nt);
  return ((hak_nothrow_new_aligned_t)next)(size, align, nt);
}

HAK_INLINE void* cxx_new(size_t size) {
  void* p = hak_alloc_inline(size);
  return likely(p != NULL) ? p : cxx_new_failed(0, size);
}

HAK_INLINE void* cxx_new_aligned(size_t size, size_t align) {
  void* p = hak_alloc_aligned(align, size);
  return likely(p != NULL) ? p : cxx_new_failed(align, size);
}

#define CXX_NOTHROW(name, size, nt)            \
  do {                                         \
    void* p = hak_alloc_inline(size);          \
    if (likely(p != NULL)) return p;           \
    return cxx_nothrow_failed(name, 0, size, nt); \
  } while (0)

#define CXX_NOTHROW_ALIGNED(name, size, al, nt)  \
  do {                                           \
    void* p = hak_alloc_aligned(al, size);       \
    if (likely(p != NULL)) return p;             \
    return cxx_nothrow_failed(name, al, size, nt); \
  } while (0)

/* The nothrow forms, their names passed on as string literals (__func__
 * would be an array of its own, 32-byte aligned, in read-only data). */
#define CXX_NOTHROW_NEW(fn) \
  HAK_API void* fn(size_t n, const void* nt) { CXX_NOTHROW(#fn, n, nt); }
#define CXX_NOTHROW_NEW_ALIGNED(fn) \
  HAK_API void* fn(size_t n, size_t al, const void* nt) { CXX_NOTHROW_ALIGNED(#fn, n, al, nt); }

/* The mangled names: new(size_t), new[](size_t), and their nothrow_t and
 * align_val_t forms; delete(void*) with size and/or alignment. */
HAK_API void* _Znwm(size_t n) { return cxx_new(n); }
HAK_API void* _Znam(size_t n) { return cxx_new(n); }
CXX_NOTHROW_NEW(_ZnwmRKSt9nothrow_t)
CXX_NOTHROW_NEW(_ZnamRKSt9nothrow_t)
HAK_API void* _ZnwmSt11align_val_t(size_t n, size_t al) { return cxx_new_aligned(n, al); }
HAK_API void* _ZnamSt11align_val_t(size_t n, size_t al) { return cxx_new_aligned(n, al); }
CXX_NOTHROW_NEW_ALIGNED(_ZnwmSt11align_val_tRKSt9nothrow_t)
CXX_NOTHROW_NEW_ALIGNED(_ZnamSt11align_val_tRKSt9nothrow_t)

HAK_API void _ZdlPv(void* p) { hak_free_inline(p); }
HAK_API void _ZdaPv(void* p) { hak_free_inline(p); }
HAK_API void _ZdlPvm(void* p, size_t n) { hak_free_inline(p); }
HAK_API void _ZdaPvm(void* p, size_t n) { hak_free_inline(p); }
HAK_API void _ZdlPvRKSt9nothrow_t(void* p, const void* nt) { hak_free_inline(p); }
HAK_API void _ZdaPvRKSt9nothrow_t(void* p, const void* nt) { hak_free_inline(p); }
HAK_API void _ZdlPvSt11align_val_t(void* p, size_t al) { hak_free_inline(p); }
HAK_API void _ZdaPvSt11align_val_t(void* p, size_t al) { hak_free_inline(p); }
HAK_API void _ZdlPvmSt11align_val_t(void* p, size_t n, size_t al) { hak_free_inline(p); }
HAK_API void _ZdaPvmSt11align_val_t(void* p, size_t n, size_t al) { hak_free_inline(p); }
HAK_API void _ZdlPvSt11align_val_tRKSt9nothrow_t(void* p, size_t al, const void* nt) { hak_free_inline(p); }
HAK_API void _ZdaPvSt11align_val_tRKSt9nothrow_t(void* p, size_t al, const void* nt) { hak_free_inline(p); }
