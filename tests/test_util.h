/* Helpers shared by hakmem's tests: which object a symbol resolves to, a
 * small deterministic PRNG, content patterns, RSS, and a compiler barrier that
 * keeps allocations from being optimised away. */
#ifndef HAK_TEST_UTIL_H
#define HAK_TEST_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Makes the compiler believe p escapes and memory is read and written. */
static inline void hak_escape(const void* p) { __asm__ volatile("" : : "g"(p) : "memory"); }

/* Hides where a pointer came from (a failed realloc leaves it valid). */
static inline void* hak_launder(void* p) {
  __asm__ volatile("" : "+r"(p));
  return p;
}

/* Hides a constant from the optimiser (and from -Walloc-size warnings). */
static inline size_t hak_opaque(size_t v) {
  __asm__ volatile("" : "+r"(v));
  return v;
}

/* Basename of the object that defines `addr`, or "?" when unknown. */
static inline const char* hak_object_of(const void* addr) {
  Dl_info info;
  if (addr == NULL || dladdr(addr, &info) == 0 || info.dli_fname == NULL) return "?";
  const char* slash = strrchr(info.dli_fname, '/');
  return slash ? slash + 1 : info.dli_fname;
}

/* Basename of the object in which `sym` resolves for the whole process. */
static inline const char* hak_symbol_object(const char* sym) {
  return hak_object_of(dlsym(RTLD_DEFAULT, sym));
}

static inline int hak_is_hakmem_object(const char* base) {
  return strncmp(base, "libhakmem", 9) == 0;
}

/* Non-zero when the process-wide `sym` is hakmem's. */
static inline int hak_symbol_in_hakmem(const char* sym) {
  return hak_is_hakmem_object(hak_symbol_object(sym));
}

/* xorshift64*: deterministic per seed. */
typedef struct {
  uint64_t s;
} hak_rng;

static inline void hak_rng_seed(hak_rng* r, uint64_t seed) {
  r->s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  if (r->s == 0) r->s = 1;
}

static inline uint64_t hak_rng_next(hak_rng* r) {
  uint64_t x = r->s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  r->s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [lo, hi]. */
static inline size_t hak_rng_range(hak_rng* r, size_t lo, size_t hi) {
  return lo + (size_t)(hak_rng_next(r) % (uint64_t)(hi - lo + 1));
}

static inline uint64_t hak_mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

/* The byte at offset i of a block filled with pattern `key`. */
static inline unsigned char hak_pattern_byte(uint64_t key, size_t i) {
  return (unsigned char)(hak_mix64(key + (i >> 3)) >> ((i & 7) * 8));
}

/* Fills [p, p+n) with the pattern of `key` (word-wise where aligned). */
static inline void hak_pattern_fill(void* p, size_t n, uint64_t key) {
  unsigned char* b = (unsigned char*)p;
  size_t i = 0;
  for (; i < n && (i & 7); i++) b[i] = hak_pattern_byte(key, i);
  for (; i + 8 <= n; i += 8) {
    uint64_t w = hak_mix64(key + (i >> 3));
    memcpy(b + i, &w, 8);
  }
  for (; i < n; i++) b[i] = hak_pattern_byte(key, i);
}

/* Returns the first offset in [0, n) that differs from the pattern, or n. */
static inline size_t hak_pattern_check(const void* p, size_t n, uint64_t key) {
  const unsigned char* b = (const unsigned char*)p;
  size_t i = 0;
  for (; i < n && (i & 7); i++)
    if (b[i] != hak_pattern_byte(key, i)) return i;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = hak_mix64(key + (i >> 3)), v;
    memcpy(&v, b + i, 8);
    if (v != w) {
      for (size_t j = i; j < i + 8; j++)
        if (b[j] != hak_pattern_byte(key, j)) return j;
    }
  }
  for (; i < n; i++)
    if (b[i] != hak_pattern_byte(key, i)) return i;
  return n;
}

/* Non-zero when all n bytes at p are `v`. */
static inline int hak_all_bytes(const void* p, size_t n, unsigned char v) {
  const unsigned char* b = (const unsigned char*)p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != v) return 0;
  return 1;
}

static inline int hak_is_aligned(const void* p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* Resident set size in bytes, from /proc/self/statm. */
static inline size_t hak_rss_bytes(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  unsigned long size = 0, resident = 0;
  if (f) {
    if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
    fclose(f);
  }
  return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* Reads fd to its end into out (at most cap - 1 bytes, then a NUL); closes it. */
static inline void hak_read_all(int fd, char* out, size_t cap) {
  size_t len = 0;
  ssize_t got;
  while (len + 1 < cap && (got = read(fd, out + len, cap - 1 - len)) > 0) len += (size_t)got;
  out[len] = '\0';
  close(fd);
}

/* Runs this program again (/proc/self/exe) with argument arg and the
 * environment entries env (NULL-terminated) added; its stdout and stderr
 * together go into out (NUL-terminated).  Returns its exit status, or -1. */
static inline int hak_run_self(const char* arg, const char* const* env, char* out, size_t cap) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    for (; env != NULL && *env != NULL; env++) putenv((char*)*env);
    execl("/proc/self/exe", "self", arg, (char*)NULL);
    _exit(127);
  }
  close(fds[1]);
  hak_read_all(fds[0], out, cap);
  int status;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

/* Runs fn in a forked child with its stderr captured into out; returns the
 * child's wait status (fn returning: exit 0), or -1 if it could not run. */
static inline int hak_run_child(void (*fn)(void), char* out, size_t cap) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    fn();
    _exit(0);
  }
  close(fds[1]);
  hak_read_all(fds[0], out, cap);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

/* The peak resident set of the process (VmHWM), in bytes; 0 if unknown. */
static inline size_t hak_peak_rss_bytes(void) {
  FILE* f = fopen("/proc/self/status", "r");
  char line[256];
  unsigned long kib = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lu kB", &kib) == 1) break;
  if (f) fclose(f);
  return (size_t)kib << 10;
}

/* Every test runs on hakmem; a throwaway build against glibc (to check the
 * tests themselves) defines HAK_TEST_ALLOW_GLIBC to turn this into a note.
 * With HAK_TEST_STATIC (libhakmem.a linked into the program) the symbols
 * must resolve into the executable itself. */
#if defined(HAK_TEST_STATIC)
static inline const char* hak_main_object(void) {
  static char marker;
  return hak_object_of(&marker);
}
/* A name that libc also defines must resolve into the executable for the
 * whole process; one that libc lacks (free_sized in older glibc) is only
 * exported when something references it, and binds to the program's copy. */
static inline int hak_static_symbol_ok(const char* sym) {
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  void* in_libc = libc ? dlsym(libc, sym) : NULL;
  void* global = dlsym(RTLD_DEFAULT, sym);
  if (global == NULL) return in_libc == NULL;
  return strcmp(hak_object_of(global), hak_main_object()) == 0;
}
#define HAK_REQUIRE_SYMBOL_IN_HAKMEM(sym)                                             \
  do {                                                                                \
    if (!hak_static_symbol_ok(sym)) {                                                 \
      fprintf(stderr, "%s:%d: %s resolves into %s, not into %s (static hakmem)\n",    \
              __FILE__, __LINE__, sym, hak_symbol_object(sym), hak_main_object());    \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)
#elif defined(HAK_TEST_ALLOW_GLIBC)
#define HAK_REQUIRE_SYMBOL_IN_HAKMEM(sym)                                             \
  do {                                                                                \
    if (!hak_symbol_in_hakmem(sym))                                                   \
      fprintf(stderr, "note: %s resolves into %s, not hakmem\n", sym,                 \
              hak_symbol_object(sym));                                                \
  } while (0)
#else
#define HAK_REQUIRE_SYMBOL_IN_HAKMEM(sym)                                             \
  do {                                                                                \
    if (!hak_symbol_in_hakmem(sym)) {                                                 \
      fprintf(stderr, "%s:%d: %s resolves into %s, not libhakmem\n", __FILE__,        \
              __LINE__, sym, hak_symbol_object(sym));                                 \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)
#endif

#ifdef HAK_TEST_HARNESS_H
/* A usable block: non-NULL, aligned, usable size (as the API under test
 * reports it) >= n, all of it writable (the pattern is written and read back).
 * Needs harness.h. */
static inline int hak_check_block(void* p, size_t n, size_t align, const char* what,
                                  size_t (*usable)(void*)) {
  if (p == NULL) {
    fprintf(stderr, "check failed: %s(size %zu, align %zu) returned NULL\n", what, n, align);
    hak_test_failures++;
    return 0;
  }
  int ok = 1;
  if (!hak_is_aligned(p, align)) {
    fprintf(stderr, "check failed: %s(size %zu): %p not aligned to %zu\n", what, n, p, align);
    ok = 0;
  }
  size_t u = usable(p);
  if (u < n) {
    fprintf(stderr, "check failed: %s(size %zu): usable size %zu too small\n", what, n, u);
    ok = 0;
    u = n;
  }
  hak_pattern_fill(p, u, (uintptr_t)p ^ n);
  if (hak_pattern_check(p, u, (uintptr_t)p ^ n) != u) {
    fprintf(stderr, "check failed: %s(size %zu): block does not hold its content\n", what, n);
    ok = 0;
  }
  if (!ok) hak_test_failures++;
  return ok;
}
#endif

#endif
