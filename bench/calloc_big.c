/* calloc_big: zeroed blocks a program may never write whole.
 *
 *   calloc_big [--size N] [--count N] [--rounds N] [--touch one|all]
 *
 * Each round callocs `count` blocks of `size` bytes (default 500 of
 * 512 KiB), checks that a byte of 8 of its pages reads zero and writes one
 * byte (with --touch all: writes it whole, as a program that uses the whole
 * block), then frees them all.  The first round's blocks
 * are new memory, which the system hands out zeroed: an allocator that
 * knows it clears nothing and faults in no page the program does not touch
 * (sparse tables, bitmaps, buffers sized for the worst case).  The later
 * rounds get memory that held the earlier blocks, which has to be cleared
 * unless it went back to the system in between.
 *
 * Output: one line on stdout, e.g.
 *   calloc_big size=524288 count=500 rounds=3 round_ms=...,...,...
 *   rss_first_kib=... allocator=... malloc_from=... peak_rss_kib=...
 * round_ms: each round's callocs, checks and writes; rss_first_kib: RSS once
 * the first round's blocks are all made and written.  The allocator is chosen at
 * run time with LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

int main(int argc, char **argv)
{
    uint64_t size = 512 << 10, count = 500, rounds = 3;
    int touch_all = 0;
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *val;
        if (!bench_option("calloc_big", argc, argv, &i, name, sizeof name, &val)) {
            printf("usage: calloc_big [--size N] [--count N] [--rounds N] [--touch one|all]\n");
            return 0;
        }
        if (!strcmp(name, "--size"))
            size = bench_parse_size(name, val);
        else if (!strcmp(name, "--count"))
            count = bench_parse_num(name, val);
        else if (!strcmp(name, "--rounds"))
            rounds = bench_parse_num(name, val);
        else if (!strcmp(name, "--touch") && (!strcmp(val, "one") || !strcmp(val, "all")))
            touch_all = !strcmp(val, "all");
        else
            bench_unknown_option("calloc_big", name);
    }
    if (size == 0 || count == 0 || rounds == 0) {
        fprintf(stderr, "calloc_big: --size, --count and --rounds must be at least 1\n");
        return 2;
    }
    unsigned char **blocks = malloc(count * sizeof *blocks);
    double *round_ms = malloc(rounds * sizeof *round_ms);
    if (blocks == NULL || round_ms == NULL) {
        fprintf(stderr, "calloc_big: out of memory\n");
        return 1;
    }
    long rss_first = 0;
    for (uint64_t r = 0; r < rounds; r++) {
        double t0 = bench_now();
        for (uint64_t k = 0; k < count; k++) {
            blocks[k] = calloc(1, size);
            if (__builtin_expect(blocks[k] == NULL, 0)) {
                fprintf(stderr, "calloc_big: calloc(1, %llu) failed\n", (unsigned long long)size);
                return 1;
            }
            /* (8 pages of the block checked, not all; with --touch all a byte
             * of each is written first: a page read before it is written
             * maps the system's zero page, and the write then faults it
             * again, where a program that uses a block whole writes it
             * first.) */
            for (uint64_t at = size / 16; at + 1 < size; at += size / 8 + 1) {
                if (touch_all)
                    blocks[k][at + 1] = 1;
                if (blocks[k][at] != 0) {
                    fprintf(stderr, "calloc_big: byte %llu of a block is not zero\n", (unsigned long long)at);
                    return 1;
                }
            }
            if (touch_all)
                memset(blocks[k], 1, size);
            blocks[k][size / 2] = 1;
            BENCH_ESCAPE(blocks[k]);
        }
        round_ms[r] = (bench_now() - t0) * 1e3;
        if (r == 0)
            rss_first = bench_rss_kib();
        for (uint64_t k = 0; k < count; k++)
            free(blocks[k]);
    }
    printf("calloc_big size=%llu count=%llu rounds=%llu round_ms=", (unsigned long long)size,
           (unsigned long long)count, (unsigned long long)rounds);
    for (uint64_t r = 0; r < rounds; r++)
        printf("%s%.1f", r ? "," : "", round_ms[r]);
    printf(" rss_first_kib=%ld", rss_first);
    bench_report_tail();
    free(round_ms);
    free(blocks);
    return 0;
}
