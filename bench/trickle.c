/* trickle: frees that trickle into an idle thread's heap, and what they cost
 * the thread that makes them.
 *
 * A producer thread mallocs `blocks` blocks of `size` bytes (default
 * 1,000,000 of 48 B), hands them over and then waits, alive, without
 * allocating, until the program ends.  The main thread frees them in a random
 * order, evenly over 80% of `seconds` (default 3), a slice every millisecond,
 * and in each millisecond also frees and mallocs 64 blocks of 4-64 KiB of its
 * own (so that it makes page events, as a working thread does); then it
 * sleeps for the rest of the millisecond.  Every malloc and free of the main
 * thread is timed.
 *
 * Allocators that look at idle threads' heaps from other threads' calls (as
 * hakmem's sweep of dormant heaps does) do that work inside some call of the
 * main thread here: worst_us is the longest single call, and done the share
 * of the frees it got through in the time.
 *
 * With --spread F the frees take that share of the time instead of 80%; 0
 * frees them all at once, in the first millisecond (a burst).
 *
 * Output: one line on stdout, e.g.
 *   trickle blocks=1000000 size=48 seconds=3 freed=1000000 done=1.000
 *   worst_us=... mean_ns=... calls=... rss_freed_kib=... rss_halved_s=...
 *   rss_idle_kib=... rss_end_kib=... allocator=... malloc_from=...
 *   peak_rss_kib=...
 * RSS from /proc/self/statm: rss_freed_kib once the last block was freed,
 * rss_halved_s how long after that it first fell below half that (-1:
 * never), rss_idle_kib at the end with the idle thread still alive (what
 * came back of its memory while the main thread ran on), rss_end_kib after
 * the idle thread ended.
 * (on one line).  The allocator is chosen at run time with LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"

static uint64_t opt_blocks = 1000000, opt_size = 48;
static double opt_seconds = 3, opt_spread = 0.8;

static void **blocks;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int handed, finished;

static void *producer(void *arg)
{
    (void)arg;
    for (uint64_t i = 0; i < opt_blocks; i++) {
        unsigned char *p = malloc(opt_size);
        if (p == NULL) {
            fprintf(stderr, "trickle: malloc(%llu) failed\n", (unsigned long long)opt_size);
            exit(1);
        }
        p[0] = (unsigned char)i;
        blocks[i] = p;
    }
    pthread_mutex_lock(&lock);
    handed = 1;
    pthread_cond_broadcast(&cond);
    while (!finished)
        pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* Resident KiB now, from /proc/self/statm (no stdio: nothing allocated). */
static uint64_t rng = 88172645463325252ull;
static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        char name[64];
        const char *val;
        if (!bench_option("trickle", argc, argv, &i, name, sizeof name, &val)) {
            printf("usage: trickle [--blocks N] [--size B] [--seconds S] [--spread F]\n");
            return 0;
        }
        if (!strcmp(name, "--blocks"))
            opt_blocks = bench_parse_num(name, val);
        else if (!strcmp(name, "--size"))
            opt_size = bench_parse_size(name, val);
        else if (!strcmp(name, "--seconds"))
            opt_seconds = bench_parse_seconds(name, val);
        else if (!strcmp(name, "--spread"))
            opt_spread = atof(val);
        else
            bench_unknown_option("trickle", name);
    }
    if (opt_blocks < 1 || opt_size < 1 || opt_seconds <= 0 || !(opt_spread >= 0 && opt_spread < 1)) {
        fprintf(stderr, "trickle: --blocks, --size and --seconds must be positive, --spread in [0, 1)\n");
        return 2;
    }
    blocks = calloc(opt_blocks, sizeof *blocks);
    if (blocks == NULL) {
        fprintf(stderr, "trickle: no room for %llu pointers\n", (unsigned long long)opt_blocks);
        return 1;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, producer, NULL) != 0) {
        fprintf(stderr, "trickle: pthread_create failed\n");
        return 1;
    }
    pthread_mutex_lock(&lock);
    while (!handed)
        pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
    for (uint64_t i = opt_blocks - 1; i > 0; i--) {
        uint64_t j = next_random() % (i + 1);
        void *x = blocks[i];
        blocks[i] = blocks[j];
        blocks[j] = x;
    }

    uint64_t per_ms = opt_spread > 0 ? (uint64_t)(opt_blocks / (opt_seconds * 1000 * opt_spread)) + 1 : opt_blocks;
    uint64_t freed = 0;
    long rss_freed = -1; /* RSS once the last block was freed */
    double freed_at = 0, drop_at = -1;
    double worst = 0, total = 0, start = bench_now();
    uint64_t calls = 0;
    void *own[64] = {0};
    while (bench_now() - start < opt_seconds) {
        for (uint64_t k = 0; k < per_ms && freed < opt_blocks; k++) {
            double a = bench_now();
            free(blocks[freed++]);
            double e = bench_now() - a;
            total += e;
            calls++;
            if (e > worst)
                worst = e;
        }
        for (int k = 0; k < 64; k++) {
            size_t size = 4096 + next_random() % 61440;
            double a = bench_now();
            free(own[k]);
            unsigned char *p = malloc(size);
            double e = bench_now() - a;
            if (p == NULL) {
                fprintf(stderr, "trickle: malloc(%zu) failed\n", size);
                return 1;
            }
            p[0] = p[size - 1] = 1;
            own[k] = p;
            total += e;
            calls += 2;
            if (e > worst)
                worst = e;
        }
        if (freed == opt_blocks) {
            if (rss_freed < 0) {
                rss_freed = bench_rss_kib();
                freed_at = bench_now();
            } else if (drop_at < 0 && bench_rss_kib() < rss_freed / 2) {
                drop_at = bench_now() - freed_at;
            }
        }
        usleep(1000);
    }
    long rss_idle = bench_rss_kib();
    for (int k = 0; k < 64; k++)
        free(own[k]);
    pthread_mutex_lock(&lock);
    finished = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    pthread_join(t, NULL);
    printf("trickle blocks=%llu size=%llu seconds=%g freed=%llu done=%.3f worst_us=%.0f mean_ns=%.0f calls=%llu"
           " rss_freed_kib=%ld rss_halved_s=%.2f rss_idle_kib=%ld rss_end_kib=%ld",
           (unsigned long long)opt_blocks, (unsigned long long)opt_size, opt_seconds,
           (unsigned long long)freed, (double)freed / (double)opt_blocks, worst * 1e6,
           total / (double)calls * 1e9, (unsigned long long)calls, rss_freed, drop_at, rss_idle, bench_rss_kib());
    bench_report_tail();
    while (freed < opt_blocks)
        free(blocks[freed++]);
    free(blocks);
    return 0;
}
