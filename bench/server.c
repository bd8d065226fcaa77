/* server: a thread-per-request server, the blocks of each request crossing
 * three threads.
 *
 * The main thread accepts: it mallocs a request (64 B - 4 KiB, written
 * whole) and starts a detached worker thread for it, at most `inflight`
 * workers at a time.  A worker's first act is to read and free its request,
 * a block of the accepting thread, which runs on; then it builds a response:
 * `parts` pieces (16-512 B each, freed once copied) appended to a body grown
 * by realloc, and a header; it hands the response to the sender thread and
 * ends.  The sender keeps the newest `keep` responses (as if still being
 * sent) and frees the oldest as each new one comes.
 *
 * So every worker's blocks outlive it, and the blocks each worker frees
 * first belong to a thread that does not end.  Allocators that give each
 * thread a heap of its own must hand the heaps of ended threads on (or let
 * others reclaim their memory), else memory grows with the threads started.
 *
 * It runs for `seconds` (default 1), or with --requests N until it has
 * accepted N requests (fixed work, to compare peak RSS).
 *
 * Output: one line on stdout, e.g.
 *   server seconds=1 inflight=16 keep=4096 parts=24 requests=...
 *   kreq_per_s=... rss_end_kib=... allocator=... malloc_from=...
 *   peak_rss_kib=...
 * (on one line).  The allocator is chosen at run time with LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

static double opt_seconds = 1;
static uint64_t opt_requests; /* > 0: this many requests instead of --seconds */
static uint64_t opt_inflight = 16, opt_keep = 4096, opt_parts = 24, opt_seed = 1;

struct request {
    uint64_t seed;
    size_t size;
    unsigned char data[];
};

struct response {
    struct response *next;
    size_t len;
    char *body;
};

static sem_t slots;           /* workers that may still start */
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_cond = PTHREAD_COND_INITIALIZER;
static struct response *queue_head, *queue_tail;
static int accepting_done;
static uint64_t sent_bytes;

static uint64_t next_rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void *worker(void *arg)
{
    struct request *rq = arg;
    uint64_t rng = rq->seed;
    uint64_t sum = 0;
    for (size_t i = 0; i < rq->size; i += 64)
        sum += rq->data[i];
    free(rq);

    size_t len = 0, cap = 0;
    char *body = NULL;
    for (uint64_t k = 0; k < opt_parts; k++) {
        size_t n = 16 + next_rng(&rng) % 497;
        char *piece = malloc(n);
        if (piece == NULL)
            abort();
        memset(piece, (int)('a' + (sum + k) % 26), n);
        if (len + n > cap) {
            cap = cap ? cap * 2 : 256;
            while (cap < len + n)
                cap *= 2;
            body = realloc(body, cap);
            if (body == NULL)
                abort();
        }
        memcpy(body + len, piece, n);
        len += n;
        free(piece);
    }
    struct response *r = malloc(sizeof *r);
    if (r == NULL)
        abort();
    r->next = NULL;
    r->len = len;
    r->body = body;
    pthread_mutex_lock(&queue_lock);
    if (queue_tail)
        queue_tail->next = r;
    else
        queue_head = r;
    queue_tail = r;
    pthread_cond_signal(&queue_cond);
    pthread_mutex_unlock(&queue_lock);
    sem_post(&slots);
    return NULL;
}

static void release(struct response *r)
{
    sent_bytes += r->len + (unsigned char)r->body[r->len - 1];
    free(r->body);
    free(r);
}

static void *sender(void *arg)
{
    (void)arg;
    struct response **ring = calloc(opt_keep, sizeof *ring);
    if (ring == NULL)
        abort();
    uint64_t at = 0;
    for (;;) {
        pthread_mutex_lock(&queue_lock);
        while (queue_head == NULL && !accepting_done)
            pthread_cond_wait(&queue_cond, &queue_lock);
        struct response *list = queue_head;
        queue_head = queue_tail = NULL;
        int done = accepting_done && list == NULL;
        pthread_mutex_unlock(&queue_lock);
        if (done)
            break;
        while (list) {
            struct response *r = list;
            list = r->next;
            if (ring[at])
                release(ring[at]);
            ring[at] = r;
            at = (at + 1) % opt_keep;
        }
    }
    for (uint64_t i = 0; i < opt_keep; i++)
        if (ring[i])
            release(ring[i]);
    free(ring);
    return NULL;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        char name[64];
        const char *val;
        if (!bench_option("server", argc, argv, &i, name, sizeof name, &val)) {
            printf("usage: server [--seconds S | --requests N] [--inflight N] [--keep N] [--parts N] [--seed N]\n");
            return 0;
        }
        if (!strcmp(name, "--seconds"))
            opt_seconds = bench_parse_seconds(name, val);
        else if (!strcmp(name, "--requests"))
            opt_requests = bench_parse_num(name, val);
        else if (!strcmp(name, "--inflight"))
            opt_inflight = bench_parse_num(name, val);
        else if (!strcmp(name, "--keep"))
            opt_keep = bench_parse_num(name, val);
        else if (!strcmp(name, "--parts"))
            opt_parts = bench_parse_num(name, val);
        else if (!strcmp(name, "--seed"))
            opt_seed = bench_parse_num(name, val);
        else
            bench_unknown_option("server", name);
    }
    if (opt_seconds <= 0 || opt_inflight < 1 || opt_inflight > 4096 || opt_keep < 1 || opt_parts < 1) {
        fprintf(stderr, "server: --seconds, --inflight (at most 4096), --keep and --parts must be positive\n");
        return 2;
    }
    sem_init(&slots, 0, (unsigned)opt_inflight);
    pthread_t send_thread;
    if (pthread_create(&send_thread, NULL, sender, NULL) != 0) {
        fprintf(stderr, "server: pthread_create failed\n");
        return 1;
    }
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    uint64_t rng = opt_seed * 0x9E3779B97F4A7C15ull | 1;
    uint64_t requests = 0;
    double start = bench_now(), elapsed = 0;
    while (opt_requests ? requests < opt_requests : elapsed < opt_seconds) {
        sem_wait(&slots);
        size_t size = 64 + next_rng(&rng) % 4033;
        struct request *rq = malloc(sizeof *rq + size);
        if (rq == NULL)
            abort();
        rq->seed = next_rng(&rng) | 1;
        rq->size = size;
        memset(rq->data, (int)(requests & 0xff), size);
        pthread_t t;
        if (pthread_create(&t, &detached, worker, rq) != 0) {
            fprintf(stderr, "server: pthread_create failed\n");
            return 1;
        }
        requests++;
        if ((requests & 63) == 0)
            elapsed = bench_now() - start;
    }
    for (uint64_t i = 0; i < opt_inflight; i++) /* every worker has handed its response on */
        sem_wait(&slots);
    elapsed = bench_now() - start;
    pthread_mutex_lock(&queue_lock);
    accepting_done = 1;
    pthread_cond_signal(&queue_cond);
    pthread_mutex_unlock(&queue_lock);
    long rss_end = bench_rss_kib();
    pthread_join(send_thread, NULL);
    printf("server seconds=%g inflight=%llu keep=%llu parts=%llu requests=%llu kreq_per_s=%.1f"
           " rss_end_kib=%ld sent=%llu",
           elapsed, (unsigned long long)opt_inflight, (unsigned long long)opt_keep,
           (unsigned long long)opt_parts, (unsigned long long)requests, requests / elapsed / 1e3, rss_end,
           (unsigned long long)sent_bytes);
    bench_report_tail();
    return 0;
}
