/* phases: a program whose use of memory changes with time, for the policy
 * learner (HAKMEM_LEARN) and for what an allocator keeps between phases.
 *
 * One round runs four phases in turn, each for --phase-ms milliseconds
 * (default 200) of wall time:
 *   tiny  random_mixed over 8192 slots of 16-64 B blocks;
 *   mid   random_mixed over 400 slots of 1-64 KiB blocks;
 *   large random_mixed over 16 slots of 128 KiB-1 MiB blocks (a byte written
 *         in every page);
 *   idle  a few operations every millisecond on 400 slots of 16-1024 B.
 * A phase frees its blocks when it ends.  --rounds (default 5) rounds.
 *
 * ops counts the operations of the three busy phases, mops = ops / their
 * time; idle_rss_kib is the mean RSS sampled at the end of each idle phase
 * (what the allocator keeps while the program rests), peak_rss_kib the
 * VmHWM.  Output: one line, e.g.
 *   phases rounds=5 phase_ms=200 ops=... seconds=... mops=... tiny_mops=...
 *   mid_mops=... large_mops=... idle_rss_kib=... seed=1 allocator=...
 *   malloc_from=... peak_rss_kib=...
 * The allocator is chosen at run time with LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "bench_mixed.h"

enum { TINY, MID, LARGE, NBUSY };
static const struct { const char *name; uint64_t min, max, ws; } busy[NBUSY] = {
    { "tiny", 16, 64, 8192 },
    { "mid", 1024, 65536, 400 },
    { "large", 128 * 1024, 1024 * 1024, 16 },
};

static void *slots[8192];

static void free_slots(uint64_t ws)
{
    for (uint64_t i = 0; i < ws; i++) {
        free(slots[i]);
        slots[i] = NULL;
    }
}

/* One operation of a large phase: random_mixed, every page of a new block written. */
static void large_op(uint64_t r, uint64_t ws, uint64_t min, uint64_t span)
{
    const uint64_t idx = ((r >> 32) * ws) >> 32;
    if (slots[idx]) {
        free(slots[idx]);
        slots[idx] = NULL;
        return;
    }
    const size_t size = (size_t)(min + bench_below(r, span));
    unsigned char *q = malloc(size);
    if (!q) {
        fprintf(stderr, "phases: malloc(%zu) failed\n", size);
        exit(1);
    }
    bench_touch_pages(q, 0, size, (unsigned char)r);
    slots[idx] = q;
}

int main(int argc, char **argv)
{
    uint64_t rounds = 5, seed = 1;
    double phase_s = 0.2;
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *val;
        if (!bench_option("phases", argc, argv, &i, name, sizeof name, &val)) {
            fprintf(stderr, "usage: phases [--rounds N] [--phase-ms MS] [--seed N]\n");
            return 2;
        }
        if (!strcmp(name, "--rounds"))
            rounds = bench_parse_num("--rounds", val);
        else if (!strcmp(name, "--phase-ms"))
            phase_s = (double)bench_parse_num("--phase-ms", val) / 1000.0;
        else if (!strcmp(name, "--seed"))
            seed = bench_parse_num("--seed", val);
        else
            bench_unknown_option("phases", name);
    }
    uint64_t s = bench_seed_state(seed, 0);
    uint64_t ops[NBUSY] = { 0 };
    double secs[NBUSY] = { 0 };
    long idle_rss_sum = 0;
    for (uint64_t round = 0; round < rounds; round++) {
        for (int p = 0; p < NBUSY; p++) {
            const uint64_t ws = busy[p].ws, min = busy[p].min, span = busy[p].max - busy[p].min + 1;
            const double t0 = bench_now(), deadline = t0 + phase_s;
            uint64_t n = 0;
            double t = t0;
            while (t < deadline) {
                for (int k = 0; k < 256; k++) {
                    if (p == LARGE)
                        large_op(xorshift64s(&s), ws, min, span);
                    else
                        mixed_op(slots, xorshift64s(&s), n + (uint64_t)k, ws, min, span, "phases");
                }
                n += 256;
                t = bench_now();
            }
            ops[p] += n;
            secs[p] += t - t0;
            free_slots(ws);
        }
        /* idle: 20 operations a millisecond */
        const double deadline = bench_now() + phase_s;
        const struct timespec ms = { 0, 1000000 };
        uint64_t n = 0;
        while (bench_now() < deadline) {
            for (int k = 0; k < 20; k++, n++)
                mixed_op(slots, xorshift64s(&s), n, 400, 16, 1009, "phases");
            nanosleep(&ms, NULL);
        }
        idle_rss_sum += bench_rss_kib();
        free_slots(400);
    }
    uint64_t total = ops[TINY] + ops[MID] + ops[LARGE];
    double seconds = secs[TINY] + secs[MID] + secs[LARGE];
    printf("phases rounds=%llu phase_ms=%.0f ops=%llu seconds=%.6f mops=%.3f tiny_mops=%.3f "
           "mid_mops=%.3f large_mops=%.3f idle_rss_kib=%ld seed=%llu",
           (unsigned long long)rounds, phase_s * 1000, (unsigned long long)total, seconds,
           (double)total / seconds / 1e6, (double)ops[TINY] / secs[TINY] / 1e6,
           (double)ops[MID] / secs[MID] / 1e6, (double)ops[LARGE] / secs[LARGE] / 1e6,
           rounds ? idle_rss_sum / (long)rounds : 0, (unsigned long long)seed);
    bench_report_tail();
    return 0;
}
