/* larson: a server simulation in the manner of Larson and Krishnan's
 * benchmark, in which threads come and go and free each other's blocks.
 *
 * There are `threads` chains.  Each chain owns an array of `blocks` live
 * blocks (default 5,000) of sizes uniform in [min, max] (default 8-1000 B),
 * first allocated by the main thread before the clock starts.  A chain runs
 * as a sequence of threads: each thread does one round of `round-iters`
 * replacements (pick a random slot, free its block, malloc a new block of a
 * random size and write its first and last byte), then creates the thread
 * that replaces it, hands it the array and exits.  So a block is usually
 * freed by another thread than the one that allocated it, often a thread
 * that has already exited.  The chain ends when it has done `iters`
 * replacements.
 *
 * With --seconds S a chain runs for S seconds instead (the clock is read
 * every 1024 replacements) and its thread of the moment ends the chain.
 *
 * One operation is one malloc or one free: ops = 2 * iters * threads (or
 * twice the replacements done).
 * The clock runs from the release of the first threads to the end of the
 * last round of every chain (thread creation and exit included, as in a
 * server); the remaining blocks are freed afterwards, outside it.
 *
 * Output: one line on stdout, e.g.
 *   larson threads=2 blocks=5000 min=8 max=1000 round_iters=50000 ops=...
 *   seconds=... mops=... rounds=... seed=1 allocator=... malloc_from=...
 *   peak_rss_kib=...
 * (on one line).  The allocator is chosen at run time with LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "bench_mixed.h"

static uint64_t opt_blocks = 5000, opt_min = 8, opt_max = 1000;
static uint64_t opt_iters = 1000000, opt_round = 50000, opt_seed = 1;
static double opt_seconds; /* > 0: each chain runs this long instead of opt_iters */

struct chain {
    _Alignas(64) uint64_t rng;
    void **blocks;
    uint64_t left;      /* replacements still to do in this chain */
    uint64_t done;      /* replacements done */
    uint64_t rounds;    /* threads that ran (or run) this chain */
    double deadline;    /* with --seconds: when the chain stops */
    unsigned index;
};

static pthread_barrier_t ready_barrier, start_barrier;
static double t_start; /* set by main once all first threads are ready */
static pthread_attr_t detached;
static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static unsigned chains_done;

static void *chain_thread(void *arg);

static void replace(struct chain *c, uint64_t todo)
{
    void **const blocks = c->blocks;
    const uint64_t n = opt_blocks;
    const uint64_t min = opt_min, span = opt_max - opt_min + 1;
    uint64_t s = c->rng;
    for (uint64_t i = 0; i < todo; i++) {
        const uint64_t r = xorshift64s(&s);
        const uint64_t idx = bench_below(r >> 32, n);
        free(blocks[idx]);
        const size_t size = (size_t)(min + bench_below(r, span));
        unsigned char *q = malloc(size);
        if (__builtin_expect(q == NULL, 0)) {
            fprintf(stderr, "larson: malloc(%zu) failed\n", size);
            exit(1);
        }
        q[0] = (unsigned char)i;
        q[size - 1] = (unsigned char)idx;
        BENCH_ESCAPE(q);
        blocks[idx] = q;
    }
    c->rng = s;
    c->done += todo;
}

/* One thread's round: round-iters replacements, or fewer when the chain's
 * work or time is up.  With --seconds the clock is read every 1024
 * replacements and the chain ends (left = 0) when it has passed. */
static void round_of(struct chain *c)
{
    uint64_t todo = c->left < opt_round ? c->left : opt_round;
    if (opt_seconds <= 0) {
        replace(c, todo);
        c->left -= todo;
        return;
    }
    while (todo > 0) {
        const uint64_t n = todo < 1024 ? todo : 1024;
        replace(c, n);
        todo -= n;
        if (bench_now() >= c->deadline) {
            c->left = 0;
            return;
        }
    }
}

/* Starts the next thread of chain c (detached), retrying briefly when the
 * system is momentarily out of threads. */
static void spawn(struct chain *c)
{
    pthread_t tid;
    for (int attempt = 0;; attempt++) {
        int rc = pthread_create(&tid, &detached, chain_thread, c);
        if (rc == 0)
            return;
        if (rc != EAGAIN || attempt >= 1000) {
            fprintf(stderr, "larson: pthread_create: %s\n", strerror(rc));
            exit(1);
        }
        sched_yield();
    }
}

static void *chain_thread(void *arg)
{
    struct chain *c = arg;
    if (c->rounds == 1) { /* the first thread of each chain starts with the clock */
        pthread_barrier_wait(&ready_barrier);
        pthread_barrier_wait(&start_barrier);
        c->deadline = t_start + opt_seconds;
    }
    round_of(c);
    if (c->left > 0) {
        c->rounds++;
        spawn(c); /* hands the array over; this thread touches c no more */
        return NULL;
    }
    pthread_mutex_lock(&done_lock);
    chains_done++;
    pthread_cond_signal(&done_cond);
    pthread_mutex_unlock(&done_lock);
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: larson [--threads N] [--iters N] [--blocks N] [--min N] [--max N]\n"
        "              [--round-iters N] [--seed N] [--seconds S]\n"
        "  --threads      chains of threads running at once (default 1)\n"
        "  --iters        replacements (free + malloc) per chain (default 1e6)\n"
        "  --blocks       live blocks per chain (default 5000)\n"
        "  --min/--max    block sizes, uniform (default 8-1000)\n"
        "  --round-iters  replacements per thread before it hands over (default 50000)\n"
        "  --seconds      each chain runs S seconds instead of --iters replacements\n"
        "  ops = 2 * iters * threads (2 * replacements done, with --seconds)\n");
}

int main(int argc, char **argv)
{
    uint64_t threads = 1;
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *val;
        if (!bench_option("larson", argc, argv, &i, name, sizeof name, &val)) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(name, "--threads")) threads = bench_parse_num(name, val);
        else if (!strcmp(name, "--iters")) opt_iters = bench_parse_num(name, val);
        else if (!strcmp(name, "--blocks")) opt_blocks = bench_parse_num(name, val);
        else if (!strcmp(name, "--min")) opt_min = bench_parse_num(name, val);
        else if (!strcmp(name, "--max")) opt_max = bench_parse_num(name, val);
        else if (!strcmp(name, "--round-iters")) opt_round = bench_parse_num(name, val);
        else if (!strcmp(name, "--seed")) opt_seed = bench_parse_num(name, val);
        else if (!strcmp(name, "--seconds")) opt_seconds = bench_parse_seconds(name, val);
        else bench_unknown_option("larson", name);
    }
    if (threads < 1 || threads > 1024 || opt_blocks < 1 || opt_blocks > 0xFFFFFFFFULL
        || opt_min < 1 || opt_max < opt_min || opt_max - opt_min >= 0xFFFFFFFFULL
        || opt_round < 1) {
        fprintf(stderr, "larson: need 1 <= threads <= 1024, 1 <= blocks < 2^32, "
                        "1 <= min <= max, round-iters >= 1\n");
        return 2;
    }

    struct chain *chains = aligned_alloc(64, sizeof(struct chain) * threads);
    if (!chains) {
        fprintf(stderr, "larson: out of memory\n");
        return 1;
    }
    memset(chains, 0, sizeof(struct chain) * threads);
    /* The main thread allocates every chain's first blocks (as the original
     * does), so the first round of each chain frees remote blocks. */
    for (unsigned t = 0; t < threads; t++) {
        struct chain *c = &chains[t];
        c->index = t;
        c->rng = bench_seed_state(opt_seed, t);
        c->left = opt_seconds > 0 ? UINT64_MAX : opt_iters;
        c->rounds = 1;
        c->blocks = malloc(sizeof(void *) * opt_blocks);
        if (!c->blocks) {
            fprintf(stderr, "larson: out of memory\n");
            return 1;
        }
        for (uint64_t k = 0; k < opt_blocks; k++) {
            const uint64_t r = xorshift64s(&c->rng);
            const size_t size = (size_t)(opt_min + bench_below(r, opt_max - opt_min + 1));
            unsigned char *q = malloc(size);
            if (!q) {
                fprintf(stderr, "larson: malloc(%zu) failed\n", size);
                return 1;
            }
            q[0] = 1;
            q[size - 1] = 2;
            c->blocks[k] = q;
        }
    }

    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    pthread_barrier_init(&ready_barrier, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&start_barrier, NULL, (unsigned)threads + 1);
    for (unsigned t = 0; t < threads; t++)
        spawn(&chains[t]);
    pthread_barrier_wait(&ready_barrier);
    const double t0 = t_start = bench_now();
    pthread_barrier_wait(&start_barrier);
    pthread_mutex_lock(&done_lock);
    while (chains_done < threads)
        pthread_cond_wait(&done_cond, &done_lock);
    pthread_mutex_unlock(&done_lock);
    const double t1 = bench_now();

    uint64_t rounds = 0, replaced = 0;
    for (unsigned t = 0; t < threads; t++) {
        rounds += chains[t].rounds;
        replaced += chains[t].done;
        for (uint64_t k = 0; k < opt_blocks; k++)
            free(chains[t].blocks[k]);
        free(chains[t].blocks);
    }
    free(chains);

    const double seconds = t1 - t0;
    const uint64_t ops = 2 * replaced;
    printf("larson threads=%llu blocks=%llu min=%llu max=%llu round_iters=%llu ops=%llu "
           "seconds=%.6f mops=%.3f rounds=%llu seed=%llu",
           (unsigned long long)threads, (unsigned long long)opt_blocks,
           (unsigned long long)opt_min, (unsigned long long)opt_max,
           (unsigned long long)opt_round, (unsigned long long)ops, seconds,
           seconds > 0 ? (double)ops / seconds / 1e6 : 0.0, (unsigned long long)rounds,
           (unsigned long long)opt_seed);
    bench_report_tail();
    return 0;
}
