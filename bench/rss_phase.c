/* rss_phase: does the memory of a big allocation phase go back to the OS?
 *
 * hakmem's target ("frugal with memory and the OS"): after a phase that
 * allocates 1 GiB in small and mid blocks and frees it all, RSS falls below
 * 5% of that peak within 1 s while the program keeps running lightly, and at
 * once after malloc_trim(0).
 *
 * 1. Allocation phase: malloc --bytes (default 1 GiB) in blocks of random
 *    sizes, small (16-1024 B) and mid (1-64 KiB) interleaved so that each
 *    kind gets half of the bytes (--small-pct changes the share); every
 *    block is memset, so all of it is resident.  The pointers live in an
 *    mmap'ed array (not malloc'ed memory; it is unmapped after the frees).
 *    peak_rss_kib = RSS (/proc/self/statm) at the end of this phase.
 * 2. Free phase: every block freed, in a random (shuffled) order.
 *    after_free_kib = RSS right after the last free.
 * 3. Light phase, --light seconds (default 2): every 1 ms a batch of 200
 *    random_mixed operations (400 slots, 16-1024 B: free a full slot, or
 *    malloc into an empty one and write its first and last byte), sleeping
 *    the rest of the millisecond; RSS sampled every 10 ms.  fall_ms = time
 *    from the end of the frees to the first sample below 5% of the peak (0:
 *    already below right after the frees; -1: never within the light phase);
 *    rss_1s_kib = the sample 1 s after the frees (-1 if --light < 1);
 *    rss_min_kib / rss_end_kib = lowest and last sample.
 * 4. malloc_trim(0), with the light phase's blocks still live;
 *    after_trim_kib = RSS right after it, trim_ms its duration.  Under a
 *    preloaded allocator the call binds to that library's malloc_trim if it
 *    defines one, else to glibc's (which only trims glibc's own heap):
 *    trim_from names the object (dlsym + dladdr, as malloc_from).
 *
 * With --handoff 1, phase 1 runs in another thread, which then waits, alive,
 * without allocating, until the program ends; the main thread does the rest.
 * Its frees are then all of another thread's blocks, and that thread's heap
 * (in allocators that have one per thread) is never used again: a producer
 * that has handed over its work, a main thread once its workers run.
 *
 * RSS is read with open/read on /proc/self/statm (no stdio, so reading it
 * allocates nothing).  It includes the program and its libraries (base_kib,
 * read before phase 1, shows how much) and, at the peak, the pointer array
 * (8 bytes per block).
 *
 * Output: one line on stdout, e.g.
 *   rss_phase bytes=1073741824 allocated=... blocks=... small_blocks=...
 *   mid_blocks=... seed=1 light_s=2 base_kib=... peak_rss_kib=...
 *   after_free_kib=... fall_ms=... rss_1s_kib=... rss_min_kib=...
 *   rss_end_kib=... after_trim_kib=... trim_ms=... alloc_s=... free_s=...
 *   light_ops=... hwm_kib=... allocator=... malloc_from=... trim_from=...
 * (on one line).  hwm_kib is VmHWM.  The allocator is chosen at run time
 * with LD_PRELOAD; this program links only libc.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "bench_mixed.h"

#define SMALL_MIN 16
#define SMALL_MAX 1024
#define MID_MIN 1024
#define MID_MAX 65536
#define LIGHT_WS 400
#define LIGHT_BATCH 200
#define LIGHT_TICK_NS 1000000L  /* one batch per millisecond */
#define SAMPLE_EVERY 10         /* ticks: one RSS sample every 10 ms */
#define FALL_PCT 5

static long page_kib;
static int statm_fd = -1;

/* Resident set in KiB, from /proc/self/statm (second field, in pages). */
static long rss_kib(void)
{
    char buf[128];
    ssize_t n = pread(statm_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) {
        /* Some kernels do not support pread here: reopen. */
        close(statm_fd);
        statm_fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
        n = statm_fd >= 0 ? read(statm_fd, buf, sizeof buf - 1) : -1;
        if (n <= 0)
            return 0;
    }
    buf[n] = '\0';
    char *p = buf;
    strtol(p, &p, 10);
    return strtol(p, NULL, 10) * page_kib;
}

static void sym_from(const char *sym, char *out, size_t outlen)
{
    Dl_info info;
    void *p = dlsym(RTLD_DEFAULT, sym);
    if (p && dladdr(p, &info) && info.dli_fname && info.dli_fname[0])
        snprintf(out, outlen, "%s", bench_basename(info.dli_fname));
    else
        snprintf(out, outlen, "none");
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: rss_phase [--bytes N] [--light S] [--seed N] [--small-pct P] [--handoff 1]\n"
        "  --bytes N      allocate N bytes, then free them all (default 1G; k/M/G = 1024^n)\n"
        "  --light S      seconds of light work after the frees (default 2)\n"
        "  --seed N       random seed (default 1)\n"
        "  --small-pct P  share of the bytes in small blocks, 0-100 (default 50)\n"
        "  --handoff 1    another thread allocates, then waits without allocating\n"
        "  small blocks: %d-%d B; mid blocks: %d-%d B\n",
        SMALL_MIN, SMALL_MAX, MID_MIN, MID_MAX);
}

static void sleep_until(double t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

/* Phase 1: what it allocated, for the main thread to free. */
struct alloc_phase {
    uint64_t bytes, small_pct, rng;
    void **blocks;
    size_t n, array_len;
    uint64_t small_bytes, mid_bytes, small_n, mid_n;
    double t_alloc;
    int failed, done;
};

static pthread_mutex_t handoff_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t handoff_cond = PTHREAD_COND_INITIALIZER;

/* At most bytes / SMALL_MIN blocks: reserve that much address space for the
 * pointers; only the part used becomes resident. */
static void alloc_blocks(struct alloc_phase *a)
{
    const size_t cap = (size_t)(a->bytes / SMALL_MIN + 1);
    a->array_len = cap * sizeof(void *);
    void **blocks = mmap(NULL, a->array_len, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (blocks == MAP_FAILED) {
        perror("rss_phase: mmap of the pointer array");
        a->failed = 1;
        return;
    }
    uint64_t small_bytes = 0, mid_bytes = 0, small_n = 0, mid_n = 0;
    size_t n = 0;
    a->t_alloc = bench_now();
    while (small_bytes + mid_bytes < a->bytes) {
        const uint64_t r = xorshift64s(&a->rng);
        /* The kind that is behind its share of the bytes goes next. */
        const int small = a->small_pct == 100 ||
            (a->small_pct > 0 && small_bytes * 100 / a->small_pct <= mid_bytes * 100 / (100 - a->small_pct));
        const size_t size = small ? SMALL_MIN + bench_below(r, SMALL_MAX - SMALL_MIN + 1)
                                  : MID_MIN + bench_below(r, MID_MAX - MID_MIN + 1);
        unsigned char *p = malloc(size);
        if (!p) {
            fprintf(stderr, "rss_phase: malloc(%zu) failed after %zu blocks\n", size, n);
            a->failed = 1;
            return;
        }
        memset(p, (int)(n | 1), size);
        BENCH_ESCAPE(p);
        blocks[n++] = p;
        if (small) {
            small_bytes += size;
            small_n++;
        } else {
            mid_bytes += size;
            mid_n++;
        }
    }
    a->blocks = blocks;
    a->n = n;
    a->small_bytes = small_bytes;
    a->mid_bytes = mid_bytes;
    a->small_n = small_n;
    a->mid_n = mid_n;
}

/* --handoff: allocates, hands over, then waits for the program's end. */
static void *alloc_thread(void *arg)
{
    struct alloc_phase *a = arg;
    alloc_blocks(a);
    pthread_mutex_lock(&handoff_lock);
    a->done = 1;
    pthread_cond_broadcast(&handoff_cond);
    pthread_mutex_unlock(&handoff_lock);
    for (;;)
        pause();
    return NULL;
}

int main(int argc, char **argv)
{
    uint64_t bytes = 1ULL << 30, seed = 1, small_pct = 50;
    double light = 2.0;
    int handoff = 0;
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *val;
        if (!bench_option("rss_phase", argc, argv, &i, name, sizeof name, &val)) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(name, "--bytes"))
            bytes = bench_parse_size(name, val);
        else if (!strcmp(name, "--light"))
            light = bench_parse_seconds(name, val);
        else if (!strcmp(name, "--seed"))
            seed = bench_parse_num(name, val);
        else if (!strcmp(name, "--small-pct"))
            small_pct = bench_parse_num(name, val);
        else if (!strcmp(name, "--handoff"))
            handoff = bench_parse_num(name, val) != 0;
        else
            bench_unknown_option("rss_phase", name);
    }
    if (bytes < 1 || small_pct > 100) {
        fprintf(stderr, "rss_phase: need --bytes >= 1 and --small-pct in [0, 100]\n");
        return 2;
    }
    page_kib = sysconf(_SC_PAGESIZE) / 1024;
    statm_fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (statm_fd < 0) {
        perror("rss_phase: /proc/self/statm");
        return 1;
    }

    /* Names first: dlsym/dladdr and /proc/self/maps may allocate, and
     * should not do so in the middle of the measurement. */
    char alloc_name[256], malloc_from[256], trim_from[256];
    bench_allocator(alloc_name, sizeof alloc_name);
    bench_malloc_from(malloc_from, sizeof malloc_from);
    sym_from("malloc_trim", trim_from, sizeof trim_from);

    uint64_t rng = bench_seed_state(seed, 0);
    void *light_slots[LIGHT_WS] = { 0 };
    const long base_kib = rss_kib();

    /* 1. Allocation (in another thread with --handoff). */
    struct alloc_phase a = { .bytes = bytes, .small_pct = small_pct, .rng = rng };
    pthread_t producer;
    if (handoff) {
        if (pthread_create(&producer, NULL, alloc_thread, &a) != 0) {
            fprintf(stderr, "rss_phase: pthread_create failed\n");
            return 1;
        }
        pthread_mutex_lock(&handoff_lock);
        while (!a.done)
            pthread_cond_wait(&handoff_cond, &handoff_lock);
        pthread_mutex_unlock(&handoff_lock);
    } else {
        alloc_blocks(&a);
    }
    if (a.failed)
        return 1;
    void **blocks = a.blocks;
    const size_t n = a.n, array_len = a.array_len;
    const uint64_t small_bytes = a.small_bytes, mid_bytes = a.mid_bytes, small_n = a.small_n,
                   mid_n = a.mid_n;
    const double t_alloc = a.t_alloc;
    rng = a.rng;
    const long peak_kib = rss_kib();

    /* 2. Free everything, in a random order (Fisher-Yates). */
    const double t_free = bench_now();
    for (size_t i = n - 1; i > 0; i--) {
        const size_t j = (size_t)bench_below(xorshift64s(&rng), i + 1);
        void *t = blocks[i];
        blocks[i] = blocks[j];
        blocks[j] = t;
    }
    for (size_t i = 0; i < n; i++)
        free(blocks[i]);
    const double t_freed = bench_now();
    munmap(blocks, array_len);
    const long after_free_kib = rss_kib();

    /* 3. Light work: a batch of operations every millisecond, RSS every 10. */
    long fall_ms = -1, rss_1s_kib = -1, rss_min_kib = after_free_kib, rss_end_kib = after_free_kib;
    if ((uint64_t)after_free_kib * 100 < (uint64_t)peak_kib * FALL_PCT)
        fall_ms = 0;
    uint64_t light_ops = 0;
    const uint64_t ticks = (uint64_t)(light * 1000.0 + 0.5);
    for (uint64_t tick = 1; tick <= ticks; tick++) {
        for (unsigned k = 0; k < LIGHT_BATCH; k++)
            mixed_op(light_slots, xorshift64s(&rng), light_ops++, LIGHT_WS, SMALL_MIN,
                     SMALL_MAX - SMALL_MIN + 1, "rss_phase");
        sleep_until(t_freed + (double)tick * 1e-3);
        if (tick % SAMPLE_EVERY == 0) {
            const long r = rss_kib();
            const long ms = (long)((bench_now() - t_freed) * 1000.0 + 0.5);
            if (fall_ms < 0 && (uint64_t)r * 100 < (uint64_t)peak_kib * FALL_PCT)
                fall_ms = ms;
            if (tick == 1000)
                rss_1s_kib = r;
            if (r < rss_min_kib)
                rss_min_kib = r;
            rss_end_kib = r;
        }
    }

    /* 4. malloc_trim(0), the light blocks still live. */
    const double t_trim = bench_now();
    malloc_trim(0);
    const double trim_s = bench_now() - t_trim;
    const long after_trim_kib = rss_kib();
    const long hwm_kib = bench_peak_rss_kib();
    for (unsigned k = 0; k < LIGHT_WS; k++)
        free(light_slots[k]);

    printf("rss_phase bytes=%llu allocated=%llu blocks=%zu small_blocks=%llu mid_blocks=%llu "
           "seed=%llu light_s=%g base_kib=%ld peak_rss_kib=%ld after_free_kib=%ld fall_ms=%ld "
           "rss_1s_kib=%ld rss_min_kib=%ld rss_end_kib=%ld after_trim_kib=%ld trim_ms=%.3f "
           "alloc_s=%.3f free_s=%.3f light_ops=%llu hwm_kib=%ld allocator=%s malloc_from=%s "
           "trim_from=%s\n",
           (unsigned long long)bytes, (unsigned long long)(small_bytes + mid_bytes), n,
           (unsigned long long)small_n, (unsigned long long)mid_n, (unsigned long long)seed,
           light, base_kib, peak_kib, after_free_kib, fall_ms, rss_1s_kib, rss_min_kib,
           rss_end_kib, after_trim_kib, trim_s * 1e3, t_free - t_alloc, t_freed - t_free,
           (unsigned long long)light_ops, hwm_kib, alloc_name, malloc_from, trim_from);
    close(statm_fd);
    return 0;
}
