/* random_mixed: the hakmem headline benchmark.
 *
 * Each thread owns `ws` slots.  Each operation draws one 64-bit random number;
 * its high half picks a slot.  If the slot holds a block, the block is freed;
 * otherwise a block of size uniform in [min, max] (from the low half) is
 * malloc'ed into it and its first and last byte are written.  An operation is
 * therefore one malloc or one free; ops = iters * threads.
 *
 * Only the operation loop is timed (CLOCK_MONOTONIC); all threads start it
 * together behind a barrier and the clock stops when the last one finishes.
 * Blocks still held are freed afterwards, outside the timed region.
 *
 * Output: one line on stdout, e.g.
 *   random_mixed preset=mixed threads=1 ws=400 min=16 max=1024 ops=20000000
 *   seconds=0.1234 mops=162.1 allocator=glibc malloc_from=libc.so.6 seed=1
 *   peak_rss_kib=2048
 * (on one line).  `allocator` comes from /proc/self/maps, `malloc_from` names
 * the object whose malloc the program really calls; bench/compare.py checks
 * both.  peak_rss_kib is VmHWM of this process (set-up included).
 *
 * The allocator is chosen at run time with LD_PRELOAD; this program links
 * only libc.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

struct preset {
    const char *name;
    uint64_t min, max, ws;
};

static const struct preset presets[] = {
    { "mixed",     16,   1024,  400 },
    { "mixed-8k",  16,   1024,  8192 },
    { "c6-heavy",  257,  768,   400 },
    { "c7-only",   1024, 1024,  400 },
    { "tiny",      16,   64,    400 },
    { "mid_large", 1024, 65536, 400 },
};
#define NPRESETS (sizeof presets / sizeof presets[0])

struct config {
    uint64_t min, max, ws, iters, seed;
    unsigned threads;
};

/* Per-thread state, one cache line apart so threads do not share lines. */
struct worker {
    _Alignas(64) uint64_t rng;
    unsigned index;
    void **slots;
    pthread_t tid;
};

static struct config cfg;
static pthread_barrier_t start_barrier, stop_barrier;

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void run_ops(struct worker *w)
{
    void **const slots = w->slots;
    const uint64_t ws = cfg.ws;
    const uint64_t min = cfg.min;
    const uint64_t span = cfg.max - cfg.min + 1; /* < 2^32, checked */
    const uint64_t iters = cfg.iters;
    uint64_t s = w->rng;

    for (uint64_t i = 0; i < iters; i++) {
        /* xorshift64*: three shifts and one multiply. */
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        const uint64_t r = s * 0x2545F4914F6CDD1DULL;
        const uint64_t idx = ((r >> 32) * ws) >> 32;
        void *p = slots[idx];
        if (p) {
            free(p);
            slots[idx] = NULL;
        } else {
            const size_t size = (size_t)(min + (((r & 0xFFFFFFFFULL) * span) >> 32));
            unsigned char *q = malloc(size);
            if (__builtin_expect(q == NULL, 0)) {
                fprintf(stderr, "random_mixed: malloc(%zu) failed\n", size);
                exit(1);
            }
            q[0] = (unsigned char)i;
            q[size - 1] = (unsigned char)idx;
            BENCH_ESCAPE(q);
            slots[idx] = q;
        }
    }
    w->rng = s;
}

static void free_all(struct worker *w)
{
    for (uint64_t i = 0; i < cfg.ws; i++)
        free(w->slots[i]);
    free(w->slots);
    w->slots = NULL;
}

static void setup(struct worker *w)
{
    w->slots = calloc(cfg.ws, sizeof(void *));
    if (!w->slots) {
        fprintf(stderr, "random_mixed: cannot allocate %llu slots\n",
                (unsigned long long)cfg.ws);
        exit(1);
    }
}

static void *thread_main(void *arg)
{
    struct worker *w = arg;
    setup(w);
    pthread_barrier_wait(&start_barrier);
    run_ops(w);
    pthread_barrier_wait(&stop_barrier);
    free_all(w);
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: random_mixed [--preset NAME] [--min N] [--max N] [--ws N]\n"
        "                    [--iters N] [--threads N] [--seed N]\n"
        "  presets:");
    for (size_t i = 0; i < NPRESETS; i++)
        fprintf(f, " %s(%llu-%llu,ws=%llu)", presets[i].name,
                (unsigned long long)presets[i].min, (unsigned long long)presets[i].max,
                (unsigned long long)presets[i].ws);
    fprintf(f, "\n  defaults: --preset mixed --iters 2e7 (per thread) --threads 1 --seed 1\n"
               "  explicit flags override the preset; numbers accept 2e7, 4k, 1M\n");
}

int main(int argc, char **argv)
{
    const struct preset *preset = &presets[0];
    int have_min = 0, have_max = 0, have_ws = 0;
    uint64_t opt_min = 0, opt_max = 0, opt_ws = 0;
    uint64_t threads = 1;
    cfg.iters = 20000000;
    cfg.seed = 1;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *val = NULL;
        char name[32];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            usage(stdout);
            return 0;
        }
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr, "random_mixed: unexpected argument '%s'\n", arg);
            usage(stderr);
            return 2;
        }
        const char *eq = strchr(arg, '=');
        if (eq) {
            snprintf(name, sizeof name, "%.*s", (int)(eq - arg), arg);
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
            if (i + 1 >= argc) {
                fprintf(stderr, "random_mixed: %s needs a value\n", name);
                return 2;
            }
            val = argv[++i];
        }
        if (!strcmp(name, "--preset")) {
            preset = NULL;
            for (size_t k = 0; k < NPRESETS; k++)
                if (!strcmp(val, presets[k].name))
                    preset = &presets[k];
            if (!preset) {
                fprintf(stderr, "random_mixed: unknown preset '%s'\n", val);
                usage(stderr);
                return 2;
            }
        } else if (!strcmp(name, "--min")) {
            opt_min = bench_parse_num(name, val); have_min = 1;
        } else if (!strcmp(name, "--max")) {
            opt_max = bench_parse_num(name, val); have_max = 1;
        } else if (!strcmp(name, "--ws")) {
            opt_ws = bench_parse_num(name, val); have_ws = 1;
        } else if (!strcmp(name, "--iters")) {
            cfg.iters = bench_parse_num(name, val);
        } else if (!strcmp(name, "--threads")) {
            threads = bench_parse_num(name, val);
        } else if (!strcmp(name, "--seed")) {
            cfg.seed = bench_parse_num(name, val);
        } else {
            fprintf(stderr, "random_mixed: unknown option '%s'\n", name);
            usage(stderr);
            return 2;
        }
    }
    cfg.min = have_min ? opt_min : preset->min;
    cfg.max = have_max ? opt_max : preset->max;
    cfg.ws = have_ws ? opt_ws : preset->ws;
    if (cfg.min < 1 || cfg.max < cfg.min || cfg.max - cfg.min >= 0xFFFFFFFFULL) {
        fprintf(stderr, "random_mixed: need 1 <= min <= max (span < 2^32)\n");
        return 2;
    }
    if (cfg.ws < 1 || cfg.ws > 0xFFFFFFFFULL) {
        fprintf(stderr, "random_mixed: ws must be in [1, 2^32)\n");
        return 2;
    }
    if (threads < 1 || threads > 4096) {
        fprintf(stderr, "random_mixed: threads must be in [1, 4096]\n");
        return 2;
    }
    cfg.threads = (unsigned)threads;

    struct worker *workers = aligned_alloc(64, sizeof(struct worker) * cfg.threads);
    if (!workers) {
        fprintf(stderr, "random_mixed: out of memory\n");
        return 1;
    }
    memset(workers, 0, sizeof(struct worker) * cfg.threads);
    for (unsigned t = 0; t < cfg.threads; t++) {
        uint64_t sm = cfg.seed * 0x100000001B3ULL + t;
        workers[t].index = t;
        workers[t].rng = splitmix64(&sm) | 1; /* xorshift state must be non-zero */
    }

    pthread_barrier_init(&start_barrier, NULL, cfg.threads);
    pthread_barrier_init(&stop_barrier, NULL, cfg.threads);

    /* Worker 0 is the main thread, so a one-thread run creates no thread. */
    for (unsigned t = 1; t < cfg.threads; t++) {
        int rc = pthread_create(&workers[t].tid, NULL, thread_main, &workers[t]);
        if (rc != 0) {
            fprintf(stderr, "random_mixed: pthread_create: %s\n", strerror(rc));
            return 1;
        }
    }
    struct worker *w0 = &workers[0];
    setup(w0);
    pthread_barrier_wait(&start_barrier);
    const double t0 = bench_now();
    run_ops(w0);
    pthread_barrier_wait(&stop_barrier);
    const double t1 = bench_now();
    free_all(w0);
    for (unsigned t = 1; t < cfg.threads; t++)
        pthread_join(workers[t].tid, NULL);
    pthread_barrier_destroy(&start_barrier);
    pthread_barrier_destroy(&stop_barrier);
    free(workers);

    const double seconds = t1 - t0;
    const uint64_t ops = cfg.iters * cfg.threads;
    const double mops = seconds > 0 ? (double)ops / seconds / 1e6 : 0.0;
    char alloc_name[256], malloc_from[256];
    bench_allocator(alloc_name, sizeof alloc_name);
    bench_malloc_from(malloc_from, sizeof malloc_from);
    printf("random_mixed preset=%s threads=%u ws=%llu min=%llu max=%llu ops=%llu "
           "seconds=%.6f mops=%.3f allocator=%s malloc_from=%s seed=%llu peak_rss_kib=%ld\n",
           preset->name, cfg.threads, (unsigned long long)cfg.ws,
           (unsigned long long)cfg.min, (unsigned long long)cfg.max,
           (unsigned long long)ops, seconds, mops, alloc_name, malloc_from,
           (unsigned long long)cfg.seed, bench_peak_rss_kib());
    return 0;
}
