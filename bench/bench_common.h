/* Shared helpers for the hakmem benchmarks (header-only; plain libc).
 *
 * - bench_now():        CLOCK_MONOTONIC in seconds.
 * - bench_parse_num():  "20000000", "2e7", "4k", "1M" -> integer.
 * - bench_parse_size(): "65536", "64k", "8M" -> bytes (binary suffixes).
 * - bench_parse_seconds(): "0.5" -> seconds, for the --seconds flag that
 *                       every benchmark takes: run for (at least) that long,
 *                       looking at the clock every so many operations, and
 *                       report the operations done (instead of a fixed
 *                       --iters).
 * - bench_allocator():  which allocator this process runs on, from
 *                       /proc/self/maps (see the comment below).
 * - bench_malloc_from(): the object that actually defines the `malloc`
 *                       this process calls (dlsym + dladdr), a cross-check.
 * - bench_peak_rss_kib(): VmHWM of this process (see below).
 * - bench_rss_kib():    its resident set now, from /proc/self/statm.
 * - bench_option():     splits "--name value" / "--name=value" arguments.
 * - bench_touch_pages(): writes one byte in every page of a range.
 * - bench_report_tail(): the common end of every result line.
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
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* A duration in seconds for --seconds: a positive decimal number. */
static inline double bench_parse_seconds(const char *flag, const char *s)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno != 0 || !(v >= 0) || v > 1e7) {
        fprintf(stderr, "bad value for %s: '%s'\n", flag, s);
        exit(2);
    }
    return v;
}

/* A byte count: as bench_parse_num, but k/M/G are powers of 1024
 * (64k = 65536, 1M = 1048576). */
static inline uint64_t bench_parse_size(const char *flag, const char *s)
{
    size_t n = strlen(s);
    if (n > 0 && n < 64 && strchr("kKmMgG", s[n - 1])) {
        char num[64];
        memcpy(num, s, n - 1);
        num[n - 1] = '\0';
        uint64_t v = bench_parse_num(flag, num);
        int shift = (s[n - 1] | 32) == 'k' ? 10 : (s[n - 1] | 32) == 'm' ? 20 : 30;
        if (v > (UINT64_MAX >> shift)) {
            fprintf(stderr, "bad value for %s: '%s'\n", flag, s);
            exit(2);
        }
        return v << shift;
    }
    return bench_parse_num(flag, s);
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

/* Resident set of this process now in KiB (the second field of
 * /proc/self/statm, in pages); -1 if unavailable.  Read with open and read,
 * not stdio, so that it allocates nothing: a call between the benchmark's
 * own mallocs leaves the allocator as it was. */
static inline long bench_rss_kib(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    const char *p = strchr(buf, ' ');
    return p ? atol(p + 1) * (sysconf(_SC_PAGESIZE) / 1024) : -1;
}

/* Command-line helper: argv[*i] must be "--name=value" or "--name" followed
 * by a value.  Stores the name in name[] and the value in *val, advances *i
 * past a separate value.  Returns 1 on success, 0 for "-h"/"--help" (*val
 * is NULL), and exits with status 2 on anything else. */
static inline int bench_option(const char *prog, int argc, char **argv, int *i,
                               char *name, size_t namelen, const char **val)
{
    const char *arg = argv[*i];
    *val = NULL;
    if (!strcmp(arg, "-h") || !strcmp(arg, "--help"))
        return 0;
    if (strncmp(arg, "--", 2) != 0) {
        fprintf(stderr, "%s: unexpected argument '%s' (try --help)\n", prog, arg);
        exit(2);
    }
    const char *eq = strchr(arg, '=');
    if (eq) {
        snprintf(name, namelen, "%.*s", (int)(eq - arg), arg);
        *val = eq + 1;
    } else {
        snprintf(name, namelen, "%s", arg);
        if (*i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value\n", prog, name);
            exit(2);
        }
        *val = argv[++*i];
    }
    return 1;
}

static inline void bench_unknown_option(const char *prog, const char *name)
{
    fprintf(stderr, "%s: unknown option '%s' (try --help)\n", prog, name);
    exit(2);
}

/* Writes one byte in every 4 KiB page of [p + from, p + to) and the last
 * byte of the range, so that every page of it is really resident. */
static inline void bench_touch_pages(unsigned char *p, size_t from, size_t to, unsigned char v)
{
    if (to <= from)
        return;
    for (size_t off = from; off < to; off = (off | 4095) + 1)
        p[off] = v;
    p[to - 1] = v;
    BENCH_ESCAPE(p);
}

/* Prints " allocator=... malloc_from=... peak_rss_kib=...\n": the end of
 * every result line, which bench/compare.py checks. */
static inline void bench_report_tail(void)
{
    char alloc_name[256], malloc_from[256];
    bench_allocator(alloc_name, sizeof alloc_name);
    bench_malloc_from(malloc_from, sizeof malloc_from);
    printf(" allocator=%s malloc_from=%s peak_rss_kib=%ld\n", alloc_name, malloc_from,
           bench_peak_rss_kib());
    fflush(stdout);
}

#endif /* HAKMEM_BENCH_COMMON_H */
