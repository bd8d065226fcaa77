/* soak: random_mixed for a set duration, sampling RSS and throughput.
 *
 * The operation is random_mixed's (same presets and flags, see
 * random_mixed.c): each worker thread owns `ws` slots; an operation frees
 * the block of a random slot, or mallocs a block of uniform[min, max] bytes
 * into an empty one and writes its first and last byte.  Workers run until
 * --duration seconds (default 600) have passed.  The main thread does no
 * allocation: every --interval seconds (default 1) it prints one sample
 *   soak_sample t=12.000 ops=... mops=... rss_kib=... minflt=...
 * (mops over the interval just ended; rss_kib = VmRSS now; minflt = minor
 * page faults of the process so far), then at the end
 * one result line
 *   soak preset=mixed threads=1 ws=400 min=16 max=1024 duration=600 samples=600
 *   ops=... seconds=... mops=... mops_first=... mops_last=... mops_drift_pct=...
 *   rss_first_kib=... rss_last_kib=... rss_max_kib=... rss_drift_pct=...
 *   faults_first=... faults_last=... allocator=... malloc_from=... peak_rss_kib=...
 * (faults_first/last: minor faults during those two tenths: once warm, the
 * last should be no more than the first),
 * (on one line).  Drift compares the mean of the last tenth of the samples
 * with the mean of the tenth after the first (the first tenth is warm-up):
 * hakmem's targets are under 5% for both over a long soak.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "bench_mixed.h"

#define CHUNK 65536 /* operations between two looks at the clock flag */

struct worker {
    _Alignas(64) _Atomic uint64_t ops;
    uint64_t rng;
    void **slots;
    pthread_t tid;
};

static uint64_t cfg_min, cfg_max, cfg_ws;
static _Atomic int stop;

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    void **const slots = w->slots;
    const uint64_t ws = cfg_ws, min = cfg_min, span = cfg_max - cfg_min + 1;
    uint64_t s = w->rng, done = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (unsigned i = 0; i < CHUNK; i++)
            mixed_op(slots, xorshift64s(&s), i, ws, min, span, "soak");
        done += CHUNK;
        atomic_store_explicit(&w->ops, done, memory_order_relaxed);
    }
    for (uint64_t i = 0; i < ws; i++)
        free(slots[i]);
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: soak [--duration S] [--interval S] [--preset NAME] [--min N] [--max N]\n"
        "            [--ws N] [--threads N] [--seed N]\n"
        "  random_mixed for --duration seconds (default 600), one sample line per\n"
        "  --interval seconds (default 1).  presets:");
    print_presets(f);
    fprintf(f, "\n");
}

static double mean(const double *v, size_t from, size_t to)
{
    double s = 0;
    for (size_t i = from; i < to; i++)
        s += v[i];
    return to > from ? s / (double)(to - from) : 0.0;
}

int main(int argc, char **argv)
{
    const struct preset *preset = find_preset("mixed");
    int have_min = 0, have_max = 0, have_ws = 0;
    uint64_t opt_min = 0, opt_max = 0, opt_ws = 0, threads = 1, seed = 1;
    double duration = 600, interval = 1;
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *val;
        if (!bench_option("soak", argc, argv, &i, name, sizeof name, &val)) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(name, "--preset")) {
            preset = find_preset(val);
            if (!preset) {
                fprintf(stderr, "soak: unknown preset '%s'\n", val);
                return 2;
            }
        }
        else if (!strcmp(name, "--min")) { opt_min = bench_parse_num(name, val); have_min = 1; }
        else if (!strcmp(name, "--max")) { opt_max = bench_parse_num(name, val); have_max = 1; }
        else if (!strcmp(name, "--ws")) { opt_ws = bench_parse_num(name, val); have_ws = 1; }
        else if (!strcmp(name, "--threads")) threads = bench_parse_num(name, val);
        else if (!strcmp(name, "--seed")) seed = bench_parse_num(name, val);
        else if (!strcmp(name, "--duration")) duration = atof(val);
        else if (!strcmp(name, "--interval")) interval = atof(val);
        else bench_unknown_option("soak", name);
    }
    cfg_min = have_min ? opt_min : preset->min;
    cfg_max = have_max ? opt_max : preset->max;
    cfg_ws = have_ws ? opt_ws : preset->ws;
    if (cfg_min < 1 || cfg_max < cfg_min || cfg_max - cfg_min >= 0xFFFFFFFFULL
        || cfg_ws < 1 || cfg_ws > 0xFFFFFFFFULL || threads < 1 || threads > 1024
        || !(duration > 0) || !(interval >= 0.01) || duration / interval > 1e7) {
        fprintf(stderr, "soak: need 1 <= min <= max, 1 <= ws < 2^32, 1 <= threads <= 1024,\n"
                        "      duration > 0, interval >= 0.01\n");
        return 2;
    }

    const size_t max_samples = (size_t)(duration / interval) + 2;
    double *s_mops = calloc(max_samples, sizeof(double));
    double *s_rss = calloc(max_samples, sizeof(double));
    long *s_flt = calloc(max_samples + 1, sizeof(long)); /* s_flt[i + 1]: at sample i */
    struct worker *workers = aligned_alloc(64, sizeof(struct worker) * threads);
    if (!s_mops || !s_rss || !s_flt || !workers) {
        fprintf(stderr, "soak: out of memory\n");
        return 1;
    }
    memset(workers, 0, sizeof(struct worker) * threads);
    for (unsigned t = 0; t < threads; t++) {
        workers[t].rng = bench_seed_state(seed, t);
        atomic_init(&workers[t].ops, 0);
        workers[t].slots = calloc(cfg_ws, sizeof(void *));
        if (!workers[t].slots) {
            fprintf(stderr, "soak: out of memory\n");
            return 1;
        }
    }

    const double t0 = bench_now();
    for (unsigned t = 0; t < threads; t++)
        if (pthread_create(&workers[t].tid, NULL, worker_main, &workers[t]) != 0) {
            fprintf(stderr, "soak: pthread_create failed\n");
            return 1;
        }

    size_t n = 0;
    uint64_t prev_ops = 0;
    double prev_t = t0;
    long rss_max = 0;
    for (;;) {
        /* Sleep to the next tick (absolute, so sampling does not drift). */
        double next = t0 + interval * (double)(n + 1);
        if (next > t0 + duration)
            next = t0 + duration;
        struct timespec ts = { (time_t)next, (long)((next - (double)(time_t)next) * 1e9) };
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
        }
        const double now = bench_now();
        uint64_t ops = 0;
        for (unsigned t = 0; t < threads; t++)
            ops += atomic_load_explicit(&workers[t].ops, memory_order_relaxed);
        const long rss = bench_rss_kib();
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        const double mops = now > prev_t ? (double)(ops - prev_ops) / (now - prev_t) / 1e6 : 0;
        if (n < max_samples) {
            s_mops[n] = mops;
            s_rss[n] = (double)rss;
            s_flt[n + 1] = ru.ru_minflt;
            n++;
        }
        if (rss > rss_max)
            rss_max = rss;
        printf("soak_sample t=%.3f ops=%llu mops=%.3f rss_kib=%ld minflt=%ld\n", now - t0,
               (unsigned long long)ops, mops, rss, ru.ru_minflt);
        fflush(stdout);
        prev_ops = ops;
        prev_t = now;
        if (now >= t0 + duration - 1e-6 || n >= max_samples)
            break;
    }
    atomic_store(&stop, 1);
    uint64_t total = 0;
    for (unsigned t = 0; t < threads; t++) {
        pthread_join(workers[t].tid, NULL);
        total += atomic_load(&workers[t].ops);
        free(workers[t].slots);
    }
    const double t1 = bench_now();

    /* Windows: the first tenth is warm-up; compare the next tenth with the
     * last tenth (at least one sample each). */
    size_t win = n / 10 ? n / 10 : 1;
    size_t first_from = n >= 3 * win ? win : 0;
    double mops_first = mean(s_mops, first_from, first_from + win);
    double mops_last = mean(s_mops, n - win, n);
    double rss_first = mean(s_rss, first_from, first_from + win);
    double rss_last = mean(s_rss, n - win, n);
    const double seconds = t1 - t0;
    printf("soak preset=%s threads=%llu ws=%llu min=%llu max=%llu duration=%g interval=%g "
           "samples=%zu ops=%llu seconds=%.3f mops=%.3f mops_first=%.3f mops_last=%.3f "
           "mops_drift_pct=%.2f rss_first_kib=%.0f rss_last_kib=%.0f rss_max_kib=%ld "
           "rss_drift_pct=%.2f faults_first=%ld faults_last=%ld seed=%llu",
           preset->name, (unsigned long long)threads, (unsigned long long)cfg_ws,
           (unsigned long long)cfg_min, (unsigned long long)cfg_max, duration, interval, n,
           (unsigned long long)total, seconds, seconds > 0 ? (double)total / seconds / 1e6 : 0,
           mops_first, mops_last,
           mops_first > 0 ? 100.0 * (mops_last - mops_first) / mops_first : 0.0,
           rss_first, rss_last, rss_max,
           rss_first > 0 ? 100.0 * (rss_last - rss_first) / rss_first : 0.0,
           s_flt[first_from + win] - s_flt[first_from], s_flt[n] - s_flt[n - win],
           (unsigned long long)seed);
    bench_report_tail();
    free(s_mops);
    free(s_rss);
    free(s_flt);
    free(workers);
    return 0;
}
