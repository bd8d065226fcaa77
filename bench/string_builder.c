/* string_builder: short-lived small strings.
 *
 * Each iteration allocates blocks of 8, 16, 32 and 64 bytes, fills each one
 * completely (a NUL-terminated string), then frees the four.  As in
 * random_mixed an operation is one malloc or one free, so ops = 8 * iters
 * (with --seconds S, iters is what was done in S seconds, the clock being
 * read every 1024 iterations).  Only the loop is timed (CLOCK_MONOTONIC).
 *
 * Output: one line on stdout, e.g.
 *   string_builder threads=1 iters=5000000 ops=40000000 seconds=0.2 mops=200.0
 *   allocator=glibc malloc_from=libc.so.6 peak_rss_kib=1900
 * (on one line).  The allocator is chosen at run time with LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

static const size_t sizes[4] = { 8, 16, 32, 64 };

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (__builtin_expect(p == NULL, 0)) {
        fprintf(stderr, "string_builder: malloc(%zu) failed\n", n);
        exit(1);
    }
    return p;
}

static void fill(char *p, size_t n, uint64_t i)
{
    memset(p, 'a' + (int)(i % 26), n - 1);
    p[n - 1] = '\0';
    BENCH_ESCAPE(p);
}

static void build(uint64_t from, uint64_t to)
{
    for (uint64_t i = from; i < to; i++) {
        char *a = xmalloc(sizes[0]);
        fill(a, sizes[0], i);
        char *b = xmalloc(sizes[1]);
        fill(b, sizes[1], i);
        char *c = xmalloc(sizes[2]);
        fill(c, sizes[2], i);
        char *d = xmalloc(sizes[3]);
        fill(d, sizes[3], i);
        free(a);
        free(b);
        free(c);
        free(d);
    }
}

int main(int argc, char **argv)
{
    uint64_t iters = 5000000;
    double run_for = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            printf("usage: string_builder [--iters N | --seconds S]\n"
                   "  --iters default 5e6, ops = 8 * iters; --seconds: run S seconds instead\n");
            return 0;
        } else if (!strncmp(arg, "--iters=", 8)) {
            iters = bench_parse_num("--iters", arg + 8);
        } else if (!strcmp(arg, "--iters") && i + 1 < argc) {
            iters = bench_parse_num("--iters", argv[++i]);
        } else if (!strncmp(arg, "--seconds=", 10)) {
            run_for = bench_parse_seconds("--seconds", arg + 10);
        } else if (!strcmp(arg, "--seconds") && i + 1 < argc) {
            run_for = bench_parse_seconds("--seconds", argv[++i]);
        } else {
            fprintf(stderr, "string_builder: unknown argument '%s'\n", arg);
            return 2;
        }
    }

    const double t0 = bench_now();
    if (run_for > 0) {
        /* Chunks of 1024 iterations until `run_for` seconds have passed. */
        const double deadline = t0 + run_for;
        uint64_t done = 0;
        do {
            build(done, done + 1024);
            done += 1024;
        } while (bench_now() < deadline);
        iters = done;
    } else {
        build(0, iters);
    }
    const double t1 = bench_now();

    const double seconds = t1 - t0;
    const uint64_t ops = iters * 8;
    const double mops = seconds > 0 ? (double)ops / seconds / 1e6 : 0.0;
    char alloc_name[256], malloc_from[256];
    bench_allocator(alloc_name, sizeof alloc_name);
    bench_malloc_from(malloc_from, sizeof malloc_from);
    printf("string_builder threads=1 iters=%llu ops=%llu seconds=%.6f mops=%.3f "
           "allocator=%s malloc_from=%s peak_rss_kib=%ld\n",
           (unsigned long long)iters, (unsigned long long)ops, seconds, mops,
           alloc_name, malloc_from, bench_peak_rss_kib());
    return 0;
}
