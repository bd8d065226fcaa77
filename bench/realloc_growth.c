/* realloc_growth: a buffer grown by realloc, as a string or vector grows.
 *
 * Each cycle: p = malloc(start) (default 16 B); then, while the size is
 * below `max` (default 1 MiB), size += size / 2 (capped at max) and
 * p = realloc(p, size); finally free(p).  After the malloc and after every
 * realloc the new part of the buffer has one byte written in each of its
 * 4 KiB pages and its last byte written (as a growing buffer is filled, so
 * every page of it is really used), and the buffer's first byte is checked,
 * which catches a realloc that loses its contents.
 *
 * One operation is one call (malloc, realloc or free): with the defaults a
 * cycle is 1 + 28 + 1 = 30 operations (1 + 21 + 1 = 23 for --max 64k), and
 * ops = cycles * that.  With --seconds S, cycles go on until S seconds have
 * passed (the clock is read every 8 cycles).  Only the loop is timed
 * (CLOCK_MONOTONIC).
 *
 * Output: one line on stdout, e.g.
 *   realloc_growth start=16 max=1048576 steps=28 iters=... ops=... seconds=...
 *   mops=... allocator=... malloc_from=... peak_rss_kib=...
 * (on one line).  The allocator is chosen at run time with LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: realloc_growth [--iters N | --seconds S] [--start N] [--max N]\n"
        "  --iters  cycles (default 20000); --start first size (default 16);\n"
        "  --max    final size (default 1M = 1048576; sizes take k/M/G as powers of 1024)\n"
        "  --seconds S: cycles for S seconds instead of --iters cycles\n"
        "  each cycle: malloc(start), realloc by 1.5x up to max, free\n");
}

static void *xfail(const char *what, size_t size)
{
    fprintf(stderr, "realloc_growth: %s(%zu) failed\n", what, size);
    exit(1);
}

int main(int argc, char **argv)
{
    uint64_t iters = 20000, start = 16, max = 1 << 20;
    double run_for = 0;
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *val;
        if (!bench_option("realloc_growth", argc, argv, &i, name, sizeof name, &val)) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(name, "--iters")) iters = bench_parse_num(name, val);
        else if (!strcmp(name, "--start")) start = bench_parse_size(name, val);
        else if (!strcmp(name, "--max")) max = bench_parse_size(name, val);
        else if (!strcmp(name, "--seconds")) run_for = bench_parse_seconds(name, val);
        else bench_unknown_option("realloc_growth", name);
    }
    if (start < 2 || max < start || max > (1ULL << 34)) {
        fprintf(stderr, "realloc_growth: need 2 <= start <= max <= 16G\n");
        return 2;
    }
    uint64_t steps = 0;
    for (uint64_t s = start; s < max; steps++)
        s = (s + s / 2 < max) ? s + s / 2 : max;

    const double t0 = bench_now();
    const double deadline = t0 + run_for;
    if (run_for > 0)
        iters = UINT64_MAX;
    uint64_t it;
    for (it = 0; it < iters; it++) {
        /* With --seconds, the clock is read every 8 cycles. */
        if (run_for > 0 && (it & 7) == 0 && it > 0 && bench_now() >= deadline)
            break;
        const unsigned char mark = (unsigned char)(it * 0x9E + 1);
        size_t size = start;
        unsigned char *p = malloc(size);
        if (__builtin_expect(p == NULL, 0))
            xfail("malloc", size);
        p[0] = mark;
        bench_touch_pages(p, 1, size, (unsigned char)it);
        while (size < max) {
            const size_t old = size;
            size = (size + size / 2 < max) ? size + size / 2 : max;
            p = realloc(p, size);
            if (__builtin_expect(p == NULL, 0))
                xfail("realloc", size);
            if (__builtin_expect(p[0] != mark, 0)) {
                fprintf(stderr, "realloc_growth: realloc(%zu -> %zu) lost the contents\n",
                        old, size);
                return 1;
            }
            bench_touch_pages(p, old, size, (unsigned char)old);
        }
        free(p);
    }
    const double t1 = bench_now();
    iters = it;

    const double seconds = t1 - t0;
    const uint64_t ops = iters * (steps + 2);
    printf("realloc_growth start=%llu max=%llu steps=%llu iters=%llu ops=%llu seconds=%.6f "
           "mops=%.3f",
           (unsigned long long)start, (unsigned long long)max, (unsigned long long)steps,
           (unsigned long long)iters, (unsigned long long)ops, seconds,
           seconds > 0 ? (double)ops / seconds / 1e6 : 0.0);
    bench_report_tail();
    return 0;
}
