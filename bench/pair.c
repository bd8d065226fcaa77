/* pair: the allocator's hit path, for instruction counting (bench/instr.py).
 *
 *   pair N [SIZE [KEEP]]   N iterations of  p = malloc(SIZE); p[0] = 1; free(p);
 *
 * SIZE defaults to 64.  KEEP (default 0) blocks of the same size are
 * allocated before the loop and freed after it, so that the loop's block is
 * never the only live block of its page: with KEEP=0 some allocators (e.g.
 * mimalloc) take their "page became empty" path on every free.  Run under callgrind at two values of N, the
 * difference of the instruction totals divided by the difference of the N
 * is the cost of one malloc+free pair (start-up and exit cancel out).
 * Prints one line: `pair iters=N size=S allocator=... malloc_from=...`.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_common.h"

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: pair N [SIZE [KEEP]]\n");
        return 2;
    }
    const uint64_t n = bench_parse_num("N", argv[1]);
    const size_t size = argc > 2 ? (size_t)bench_parse_num("SIZE", argv[2]) : 64;
    if (size == 0) {
        fprintf(stderr, "pair: SIZE must be at least 1\n");
        return 2;
    }
    const uint64_t keep = argc > 3 ? bench_parse_num("KEEP", argv[3]) : 0;
    void **kept = keep ? calloc(keep, sizeof(void *)) : NULL;
    if (keep && !kept) {
        fprintf(stderr, "pair: out of memory\n");
        return 1;
    }
    for (uint64_t k = 0; k < keep; k++) {
        kept[k] = malloc(size);
        BENCH_ESCAPE(kept[k]);
    }
    for (uint64_t i = 0; i < n; i++) {
        unsigned char *p = malloc(size);
        if (__builtin_expect(p == NULL, 0)) {
            fprintf(stderr, "pair: malloc(%zu) failed\n", size);
            return 1;
        }
        p[0] = 1;
        BENCH_ESCAPE(p);
        free(p);
    }
    for (uint64_t k = 0; k < keep; k++)
        free(kept[k]);
    free(kept);
    char alloc_name[256], malloc_from[256];
    bench_allocator(alloc_name, sizeof alloc_name);
    bench_malloc_from(malloc_from, sizeof malloc_from);
    printf("pair iters=%llu size=%zu keep=%llu allocator=%s malloc_from=%s peak_rss_kib=%ld\n",
           (unsigned long long)n, size, (unsigned long long)keep, alloc_name, malloc_from, bench_peak_rss_kib());
    return 0;
}
