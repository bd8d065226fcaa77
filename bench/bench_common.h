/* Shared helpers for the hakmem benchmarks (header-only; plain libc).
 *
 * - bench_now():        CLOCK_MONOTONIC in seconds.
 * - bench_parse_num():  "20000000", "2e7", "4k", "1M" -> integer.
 * - bench_allocator():  which allocator this process runs on, from
 *                       /proc/self/maps (see the comment below).
 * - bench_malloc_from(): the object that actually defines the `malloc`
 *                       this process calls (dlsym + dladdr), a cross-check.
 * - bench_peak_rss_kib(): VmHWM of this process (see below).
 * - BENCH_ESCAPE(p):    makes the compiler treat *p as observed, so that a
 *                       malloc/write/free sequence cannot be optimised away.
 */
#ifndef HAKMEM_BENCH_COMMON_H
#define HAKMEM_BENCH_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_ESCAPE(p) __asm__ volatile("" : : "r"(p) : "memory")

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Parses a non-negative count; accepts scientific notation and k/M/G
 * suffixes (powers of 1000 for counts, as "2e7" is).  Exits on junk. */
static inline uint64_t bench_parse_num(const char *flag, const char *s)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || v < 0) {
        fprintf(stderr, "bad value for %s: '%s'\n", flag, s);
        exit(2);
    }
    switch (*end) {
    case 'k': case 'K': v *= 1e3; end++; break;
    case 'm': case 'M': v *= 1e6; end++; break;
    case 'g': case 'G': v *= 1e9; end++; break;
    default: break;
    }
    if (*end != '\0' || v > 1.8e19) {
        fprintf(stderr, "bad value for %s: '%s'\n", flag, s);
        exit(2);
    }
    return (uint64_t)(v + 0.5);
}

static inline const char *bench_basename(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The allocator in use, from /proc/self/maps: the basename of the first
 * mapped shared object whose name contains one of the known allocator
 * library names; "glibc" when there is none.  One refinement: TBB's
 * LD_PRELOAD shim libtbbmalloc_proxy.so loads libtbbmalloc.so beside it,
 * and libtbbmalloc.so preloaded alone replaces nothing, so the proxy is
 * reported whenever it is mapped (and plain libtbbmalloc.so otherwise, which
 * tells the runner that the preload was the wrong one). */
static inline void bench_allocator(char *out, size_t outlen)
{
    static const char *const names[] = {
        "libhakmem", "libmimalloc", "libjemalloc", "libtcmalloc", "libtbbmalloc",
    };
    char first[256] = "";
    char proxy[256] = "";
    FILE *f = fopen("/proc/self/maps", "r");
    if (f) {
        char line[4096];
        while (fgets(line, sizeof line, f)) {
            char *path = strchr(line, '/');
            if (!path)
                continue;
            path[strcspn(path, "\n")] = '\0';
            const char *base = bench_basename(path);
            if (!strstr(base, ".so"))
                continue;
            if (!proxy[0] && strstr(base, "libtbbmalloc_proxy"))
                snprintf(proxy, sizeof proxy, "%s", base);
            if (first[0])
                continue;
            for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
                if (strstr(base, names[i])) {
                    snprintf(first, sizeof first, "%s", base);
                    break;
                }
            }
        }
        fclose(f);
    }
    const char *pick = proxy[0] ? proxy : first[0] ? first : "glibc";
    snprintf(out, outlen, "%s", pick);
}

/* Basename of the object defining the `malloc` that symbol lookup from this
 * program resolves to (the first definition in global scope, so an
 * LD_PRELOADed allocator wins over libc). */
static inline void bench_malloc_from(char *out, size_t outlen)
{
    Dl_info info;
    void *sym = dlsym(RTLD_DEFAULT, "malloc");
    if (sym && dladdr(sym, &info) && info.dli_fname && info.dli_fname[0])
        snprintf(out, outlen, "%s", bench_basename(info.dli_fname));
    else
        snprintf(out, outlen, "unknown");
}

/* Peak resident set of this program in KiB: VmHWM from /proc/self/status.
 * Unlike ru_maxrss (getrusage or the parent's wait4), it does not include
 * the memory of the process that forked us before exec (for a child of
 * Python that is Python's own ~10-20 MiB).  0 if unavailable. */
static inline long bench_peak_rss_kib(void)
{
    long kib = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "VmHWM: %ld", &kib) == 1)
                break;
        fclose(f);
    }
    return kib;
}

#endif /* HAKMEM_BENCH_COMMON_H */
