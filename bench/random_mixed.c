/* random_mixed: the hakmem headline benchmark.
 *
 * Each thread owns `ws` slots.  Each operation draws one 64-bit random number;
 * its high half picks a slot.  If the slot holds a block, the block is freed;
 * otherwise a block of size uniform in [min, max] (from the low half) is
 * malloc'ed into it and its first and last byte are written.  An operation is
 * therefore one malloc or one free; ops = iters * threads, or with
 * --seconds S the operations done in S seconds (the clock is read every
 * 4096 operations).
 *
 * Only the operation loop is timed (CLOCK_MONOTONIC); all threads start it
 * together behind a barrier (the clock starts when all are ready, just before
 * their release) and the clock stops when the last one finishes.
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
#include "bench_mixed.h"

struct config {
    uint64_t min, max, ws, iters, seed;
    double seconds; /* > 0: run this long instead of `iters` operations */
    unsigned threads;
};

/* With --seconds, the clock is read every CHUNK operations. */
#define CHUNK 4096

/* Per-thread state, one cache line apart so threads do not share lines. */
struct worker {
    _Alignas(64) uint64_t rng;
    unsigned index;
    void **slots;
    uint64_t done; /* operations done */
    pthread_t tid;
};

static struct config cfg;
static pthread_barrier_t ready_barrier, start_barrier, stop_barrier;
/* Taken by the main thread once every thread is ready, just before they are
 * released: the start of the timed region and of every --seconds window. */
static double t_start;

static void run_ops(struct worker *w, const uint64_t iters)
{
    void **const slots = w->slots;
    const uint64_t ws = cfg.ws;
    const uint64_t min = cfg.min;
    const uint64_t span = cfg.max - cfg.min + 1; /* < 2^32, checked */
    uint64_t s = w->rng;

    for (uint64_t i = 0; i < iters; i++)
        mixed_op(slots, xorshift64s(&s), i, ws, min, span, "random_mixed");
    w->rng = s;
}

/* The timed part of one thread: cfg.iters operations, or with --seconds
 * chunks of CHUNK operations until that much time has passed. */
static void run(struct worker *w)
{
    if (cfg.seconds > 0) {
        const double deadline = t_start + cfg.seconds;
        uint64_t done = 0;
        do {
            run_ops(w, CHUNK);
            done += CHUNK;
        } while (bench_now() < deadline);
        w->done = done;
    } else {
        run_ops(w, cfg.iters);
        w->done = cfg.iters;
    }
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
    pthread_barrier_wait(&ready_barrier);
    pthread_barrier_wait(&start_barrier);
    run(w);
    pthread_barrier_wait(&stop_barrier);
    free_all(w);
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: random_mixed [--preset NAME] [--min N] [--max N] [--ws N]\n"
        "                    [--iters N | --seconds S] [--threads N] [--seed N]\n"
        "  presets:");
    print_presets(f);
    fprintf(f, "\n  defaults: --preset mixed --iters 2e7 (per thread) --threads 1 --seed 1\n"
               "  --seconds S: each thread runs for S seconds instead of --iters operations\n"
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
            preset = find_preset(val);
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
        } else if (!strcmp(name, "--seconds")) {
            cfg.seconds = bench_parse_seconds(name, val);
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
        workers[t].index = t;
        workers[t].rng = bench_seed_state(cfg.seed, t); /* non-zero, as xorshift needs */
    }

    pthread_barrier_init(&ready_barrier, NULL, cfg.threads);
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
    pthread_barrier_wait(&ready_barrier);
    const double t0 = t_start = bench_now();
    pthread_barrier_wait(&start_barrier);
    run(w0);
    pthread_barrier_wait(&stop_barrier);
    const double t1 = bench_now();
    free_all(w0);
    uint64_t ops = w0->done;
    for (unsigned t = 1; t < cfg.threads; t++) {
        pthread_join(workers[t].tid, NULL);
        ops += workers[t].done;
    }
    pthread_barrier_destroy(&ready_barrier);
    pthread_barrier_destroy(&start_barrier);
    pthread_barrier_destroy(&stop_barrier);
    free(workers);

    const double seconds = t1 - t0;
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
