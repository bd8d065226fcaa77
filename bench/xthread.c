/* xthread: producer/consumer; every free is remote.
 *
 * `pairs` pairs of threads.  In each pair the producer mallocs `iters`
 * blocks of sizes uniform in [min, max] (default 16-1024 B), writes the
 * first and last byte of each, and passes them in batches of `batch`
 * pointers through a bounded single-producer/single-consumer ring (`depth`
 * batches) to its consumer, which reads each block's first byte and frees
 * it.  Every block is therefore freed by a thread that did not allocate it,
 * while its owner is still running.  At most batch * depth blocks per pair
 * are in flight (the producer waits when the ring is full).
 *
 * With --seconds S each producer stops after S seconds instead (the clock
 * is read every 8 batches) and its consumer drains the ring.
 *
 * One operation is one malloc or one free: ops = 2 * iters * pairs (twice
 * the blocks produced).
 * Only the transfer is timed (all threads released by one barrier; the
 * clock stops when the last consumer has freed its last block).
 *
 * Output: one line on stdout, e.g.
 *   xthread pairs=1 threads=2 min=16 max=1024 batch=64 depth=64 ops=...
 *   seconds=... mops=... seed=1 allocator=... malloc_from=... peak_rss_kib=...
 * (on one line).  The allocator is chosen at run time with LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "bench_mixed.h"

static uint64_t opt_iters = 2000000, opt_min = 16, opt_max = 1024, opt_seed = 1;
static uint64_t opt_batch = 64, opt_depth = 64;
static double opt_seconds; /* > 0: producers run this long instead of opt_iters */

struct batch {
    uint64_t n;
    void *p[];
};

struct ring {
    _Alignas(64) _Atomic uint64_t tail;  /* batches published by the producer */
    _Alignas(64) _Atomic uint64_t head;  /* batches consumed */
    _Alignas(64) _Atomic uint64_t end;   /* batches in all, once the producer is done */
    _Alignas(64) struct batch **slots;   /* depth batches of opt_batch pointers */
    uint64_t rng;
    unsigned index;
    pthread_t producer, consumer;
    uint64_t checksum;
    uint64_t blocks;  /* blocks produced */
};

static pthread_barrier_t ready_barrier, start_barrier;
static double t_start; /* set by main once every thread is ready */

/* Waits politely: spin a little, then yield (threads may outnumber CPUs). */
static inline void backoff(unsigned *spins)
{
    if (++*spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else {
        sched_yield();
    }
}

static void *producer_main(void *arg)
{
    struct ring *r = arg;
    const uint64_t min = opt_min, span = opt_max - opt_min + 1;
    const uint64_t depth = opt_depth, bsize = opt_batch;
    uint64_t s = r->rng, tail = 0, left = opt_seconds > 0 ? UINT64_MAX : opt_iters;
    pthread_barrier_wait(&ready_barrier);
    pthread_barrier_wait(&start_barrier);
    const double deadline = t_start + opt_seconds;
    while (left > 0) {
        unsigned spins = 0;
        while (tail - atomic_load_explicit(&r->head, memory_order_acquire) >= depth)
            backoff(&spins);
        struct batch *b = r->slots[tail % depth];
        const uint64_t n = left < bsize ? left : bsize;
        for (uint64_t i = 0; i < n; i++) {
            const uint64_t x = xorshift64s(&s);
            const size_t size = (size_t)(min + bench_below(x, span));
            unsigned char *q = malloc(size);
            if (__builtin_expect(q == NULL, 0)) {
                fprintf(stderr, "xthread: malloc(%zu) failed\n", size);
                exit(1);
            }
            q[0] = (unsigned char)(x >> 40);
            q[size - 1] = (unsigned char)i;
            b->p[i] = q;
        }
        b->n = n;
        left -= n;
        r->blocks += n;
        atomic_store_explicit(&r->tail, ++tail, memory_order_release);
        if (opt_seconds > 0 && (tail & 7) == 0 && bench_now() >= deadline)
            break;
    }
    atomic_store_explicit(&r->end, tail, memory_order_release);
    return NULL;
}

static void *consumer_main(void *arg)
{
    struct ring *r = arg;
    const uint64_t depth = opt_depth;
    uint64_t head = 0, sum = 0;
    pthread_barrier_wait(&ready_barrier);
    pthread_barrier_wait(&start_barrier);
    for (;;) {
        unsigned spins = 0;
        while (atomic_load_explicit(&r->tail, memory_order_acquire) == head) {
            /* `end` is stored after the last `tail`: seeing end == head
             * means there is nothing more to come. */
            if (atomic_load_explicit(&r->end, memory_order_acquire) == head)
                goto out;
            backoff(&spins);
        }
        struct batch *b = r->slots[head % depth];
        for (uint64_t i = 0; i < b->n; i++) {
            unsigned char *q = b->p[i];
            sum += q[0];
            free(q);
        }
        atomic_store_explicit(&r->head, ++head, memory_order_release);
    }
out:
    r->checksum = sum;
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: xthread [--pairs N] [--iters N] [--min N] [--max N] [--batch N]\n"
        "               [--depth N] [--seed N] [--seconds S]\n"
        "  --pairs   producer/consumer pairs (default 1, i.e. 2 threads)\n"
        "  --iters   blocks per producer (default 2e6)\n"
        "  --min/--max  block sizes, uniform (default 16-1024)\n"
        "  --batch   pointers per hand-over (default 64); --depth batches in flight (default 64)\n"
        "  --seconds S: producers run S seconds instead of --iters blocks\n"
        "  ops = 2 * blocks = 2 * iters * pairs\n");
}

int main(int argc, char **argv)
{
    uint64_t pairs = 1;
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *val;
        if (!bench_option("xthread", argc, argv, &i, name, sizeof name, &val)) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(name, "--pairs")) pairs = bench_parse_num(name, val);
        else if (!strcmp(name, "--threads")) pairs = bench_parse_num(name, val) / 2;
        else if (!strcmp(name, "--iters")) opt_iters = bench_parse_num(name, val);
        else if (!strcmp(name, "--min")) opt_min = bench_parse_num(name, val);
        else if (!strcmp(name, "--max")) opt_max = bench_parse_num(name, val);
        else if (!strcmp(name, "--batch")) opt_batch = bench_parse_num(name, val);
        else if (!strcmp(name, "--depth")) opt_depth = bench_parse_num(name, val);
        else if (!strcmp(name, "--seed")) opt_seed = bench_parse_num(name, val);
        else if (!strcmp(name, "--seconds")) opt_seconds = bench_parse_seconds(name, val);
        else bench_unknown_option("xthread", name);
    }
    if (pairs < 1 || pairs > 512 || opt_min < 1 || opt_max < opt_min
        || opt_max - opt_min >= 0xFFFFFFFFULL || opt_batch < 1 || opt_batch > (1u << 20)
        || opt_depth < 1 || opt_depth > (1u << 20)) {
        fprintf(stderr, "xthread: need 1 <= pairs <= 512 (--threads = 2 * pairs), "
                        "1 <= min <= max, batch and depth in [1, 2^20]\n");
        return 2;
    }

    struct ring *rings = aligned_alloc(64, sizeof(struct ring) * pairs);
    if (!rings) {
        fprintf(stderr, "xthread: out of memory\n");
        return 1;
    }
    memset(rings, 0, sizeof(struct ring) * pairs);
    for (unsigned t = 0; t < pairs; t++) {
        struct ring *r = &rings[t];
        r->index = t;
        r->rng = bench_seed_state(opt_seed, t);
        atomic_init(&r->head, 0);
        atomic_init(&r->tail, 0);
        atomic_init(&r->end, UINT64_MAX);
        r->slots = malloc(sizeof(struct batch *) * opt_depth);
        if (!r->slots) {
            fprintf(stderr, "xthread: out of memory\n");
            return 1;
        }
        for (uint64_t k = 0; k < opt_depth; k++) {
            r->slots[k] = malloc(sizeof(struct batch) + sizeof(void *) * opt_batch);
            if (!r->slots[k]) {
                fprintf(stderr, "xthread: out of memory\n");
                return 1;
            }
        }
    }

    pthread_barrier_init(&ready_barrier, NULL, (unsigned)(2 * pairs + 1));
    pthread_barrier_init(&start_barrier, NULL, (unsigned)(2 * pairs + 1));
    for (unsigned t = 0; t < pairs; t++) {
        if (pthread_create(&rings[t].consumer, NULL, consumer_main, &rings[t]) != 0
            || pthread_create(&rings[t].producer, NULL, producer_main, &rings[t]) != 0) {
            fprintf(stderr, "xthread: pthread_create failed\n");
            return 1;
        }
    }
    pthread_barrier_wait(&ready_barrier);
    const double t0 = t_start = bench_now();
    pthread_barrier_wait(&start_barrier);
    for (unsigned t = 0; t < pairs; t++)
        pthread_join(rings[t].consumer, NULL);
    const double t1 = bench_now();
    uint64_t checksum = 0, blocks = 0;
    for (unsigned t = 0; t < pairs; t++) {
        pthread_join(rings[t].producer, NULL);
        checksum += rings[t].checksum;
        blocks += rings[t].blocks;
        for (uint64_t k = 0; k < opt_depth; k++)
            free(rings[t].slots[k]);
        free(rings[t].slots);
    }
    free(rings);

    const double seconds = t1 - t0;
    const uint64_t ops = 2 * blocks;
    printf("xthread pairs=%llu threads=%llu min=%llu max=%llu batch=%llu depth=%llu ops=%llu "
           "seconds=%.6f mops=%.3f seed=%llu checksum=%llu",
           (unsigned long long)pairs, (unsigned long long)(2 * pairs),
           (unsigned long long)opt_min, (unsigned long long)opt_max,
           (unsigned long long)opt_batch, (unsigned long long)opt_depth,
           (unsigned long long)ops, seconds,
           seconds > 0 ? (double)ops / seconds / 1e6 : 0.0, (unsigned long long)opt_seed,
           (unsigned long long)checksum);
    bench_report_tail();
    return 0;
}
