/* big: large blocks whose every page is used.
 *
 * --mode mixed (default): random_mixed with big blocks.  `ws` slots
 *   (default 8); each operation picks a slot at random; a full slot is freed,
 *   an empty one gets a block of min..max bytes (default 64 KiB - 16 MiB) and
 *   one byte written in each of its 4 KiB pages.  Sizes are spread evenly
 *   over the octaves of the range (log-uniform: as many 64-128 KiB blocks as
 *   8-16 MiB ones), uniformly within an octave.
 * --mode fixed: each iteration mallocs one block of --size bytes (default
 *   8 MiB), writes a byte in each of its pages and frees it: what an
 *   allocator does with a big block that is freed and asked for again
 *   (cache it, or give it back and fault it in anew).
 *
 * One operation is one malloc or one free (ops = iters in mixed mode,
 * 2 * iters in fixed mode; with --seconds S, iters is what was done in S
 * seconds, the clock being read every 4 iterations).  Page writes are part of the timed work, so an
 * allocator that unmaps and remaps pays for the page faults.  Only the loop
 * is timed (CLOCK_MONOTONIC).
 *
 * Output: one line on stdout, e.g.
 *   big mode=mixed min=65536 max=16777216 ws=8 ops=... seconds=... mops=...
 *   mib_touched=... seed=1 allocator=... malloc_from=... peak_rss_kib=...
 * (on one line).  The allocator is chosen at run time with LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "bench_mixed.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: big [--mode mixed|fixed] [--iters N] [--min N] [--max N] [--ws N]\n"
        "           [--size N] [--seed N] [--seconds S]\n"
        "  mixed: --ws slots (8), sizes --min..--max log-uniform (64k..16M), ops = iters\n"
        "  fixed: malloc/touch/free of one --size block (8M), ops = 2 * iters\n"
        "  sizes take k/M/G as powers of 1024; default --iters 2000 (mixed), 1000 (fixed)\n"
        "  --seconds S: iterate for S seconds instead of --iters times\n");
}

static unsigned char *xmalloc(size_t size)
{
    unsigned char *p = malloc(size);
    if (__builtin_expect(p == NULL, 0)) {
        fprintf(stderr, "big: malloc(%zu) failed\n", size);
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    int fixed = 0, have_iters = 0;
    double run_for = 0;
    uint64_t iters = 0, min = 64 << 10, max = 16 << 20, ws = 8, size = 8 << 20, seed = 1;
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *val;
        if (!bench_option("big", argc, argv, &i, name, sizeof name, &val)) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(name, "--mode")) {
            if (!strcmp(val, "fixed")) fixed = 1;
            else if (!strcmp(val, "mixed")) fixed = 0;
            else {
                fprintf(stderr, "big: --mode is mixed or fixed\n");
                return 2;
            }
        }
        else if (!strcmp(name, "--iters")) { iters = bench_parse_num(name, val); have_iters = 1; }
        else if (!strcmp(name, "--min")) min = bench_parse_size(name, val);
        else if (!strcmp(name, "--max")) max = bench_parse_size(name, val);
        else if (!strcmp(name, "--ws")) ws = bench_parse_num(name, val);
        else if (!strcmp(name, "--size")) size = bench_parse_size(name, val);
        else if (!strcmp(name, "--seed")) seed = bench_parse_num(name, val);
        else if (!strcmp(name, "--seconds")) run_for = bench_parse_seconds(name, val);
        else bench_unknown_option("big", name);
    }
    if (!have_iters)
        iters = fixed ? 1000 : 2000;
    if (run_for > 0)
        iters = UINT64_MAX; /* until the deadline; the clock is read every 4 iterations */
    if (min < 1 || max < min || max > (1ULL << 34) || ws < 1 || ws > 0xFFFFFFFFULL
        || size < 1 || size > (1ULL << 34)) {
        fprintf(stderr, "big: need 1 <= min <= max <= 16G, 1 <= ws < 2^32, 1 <= size <= 16G\n");
        return 2;
    }

    uint64_t ops, touched = 0;
    double t0, t1;
    if (fixed) {
        t0 = bench_now();
        const double deadline = t0 + run_for;
        uint64_t it;
        for (it = 0; it < iters; it++) {
            if (run_for > 0 && (it & 3) == 0 && it > 0 && bench_now() >= deadline)
                break;
            unsigned char *p = xmalloc(size);
            bench_touch_pages(p, 0, size, (unsigned char)it);
            free(p);
        }
        t1 = bench_now();
        iters = it;
        ops = 2 * iters;
        touched = iters * size;
    } else {
        /* Octaves of [min, max]: sizes in [min << k, min << (k+1)), k < octaves. */
        unsigned octaves = 0;
        while (octaves < 40 && (min << (octaves + 1)) <= max)
            octaves++;
        if (octaves == 0)
            octaves = 1;
        unsigned char **slots = calloc(ws, sizeof *slots);
        if (!slots) {
            fprintf(stderr, "big: out of memory\n");
            return 1;
        }
        uint64_t s = bench_seed_state(seed, 0);
        t0 = bench_now();
        const double deadline = t0 + run_for;
        uint64_t it;
        for (it = 0; it < iters; it++) {
            if (run_for > 0 && (it & 3) == 0 && it > 0 && bench_now() >= deadline)
                break;
            const uint64_t r = xorshift64s(&s);
            const uint64_t idx = bench_below(r >> 32, ws);
            if (slots[idx]) {
                free(slots[idx]);
                slots[idx] = NULL;
                continue;
            }
            const uint64_t r2 = xorshift64s(&s);
            const uint64_t base = min << bench_below(r, octaves);
            uint64_t sz = base + bench_below(r2, base);
            if (sz > max)
                sz = max;
            unsigned char *p = xmalloc(sz);
            bench_touch_pages(p, 0, sz, (unsigned char)it);
            slots[idx] = p;
            touched += sz;
        }
        t1 = bench_now();
        iters = it;
        for (uint64_t k = 0; k < ws; k++)
            free(slots[k]);
        free(slots);
        ops = iters;
    }

    const double seconds = t1 - t0;
    printf("big mode=%s min=%llu max=%llu ws=%llu size=%llu iters=%llu ops=%llu seconds=%.6f "
           "mops=%.6f mib_touched=%.0f seed=%llu",
           fixed ? "fixed" : "mixed", (unsigned long long)min, (unsigned long long)max,
           (unsigned long long)ws, (unsigned long long)size, (unsigned long long)iters,
           (unsigned long long)ops, seconds, seconds > 0 ? (double)ops / seconds / 1e6 : 0.0,
           (double)touched / 1048576.0, (unsigned long long)seed);
    bench_report_tail();
    return 0;
}
