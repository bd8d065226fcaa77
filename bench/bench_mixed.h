/* random_mixed's presets and random-number helpers, shared by random_mixed.c
 * and soak.c (which runs the same operation for a set duration). */
#ifndef HAKMEM_BENCH_MIXED_H
#define HAKMEM_BENCH_MIXED_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static inline const struct preset *find_preset(const char *name)
{
    for (size_t k = 0; k < NPRESETS; k++)
        if (!strcmp(name, presets[k].name))
            return &presets[k];
    return NULL;
}

static inline void print_presets(FILE *f)
{
    for (size_t i = 0; i < NPRESETS; i++)
        fprintf(f, " %s(%llu-%llu,ws=%llu)", presets[i].name,
                (unsigned long long)presets[i].min, (unsigned long long)presets[i].max,
                (unsigned long long)presets[i].ws);
}

/* Seeds: splitmix64 turns (seed, thread index) into a well-mixed state. */
static inline uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* A non-zero xorshift64* state for thread `t` of a run seeded with `seed`. */
static inline uint64_t bench_seed_state(uint64_t seed, uint64_t t)
{
    uint64_t sm = seed * 0x100000001B3ULL + t;
    return splitmix64(&sm) | 1;
}

/* xorshift64*: three shifts and one multiply; the state must be non-zero. */
static inline uint64_t xorshift64s(uint64_t *state)
{
    uint64_t s = *state;
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    *state = s;
    return s * 0x2545F4914F6CDD1DULL;
}

/* One random_mixed operation: r (a fresh random word) picks one of ws slots;
 * a full slot is freed, an empty one gets a block of a size in
 * [min, min + span) whose first and last byte are written.  who names the
 * program in the message of a failed malloc. */
static inline void mixed_op(void **slots, uint64_t r, uint64_t stamp, uint64_t ws, uint64_t min,
                            uint64_t span, const char *who)
{
    const uint64_t idx = ((r >> 32) * ws) >> 32;
    void *p = slots[idx];
    if (p) {
        free(p);
        slots[idx] = NULL;
    } else {
        const size_t size = (size_t)(min + (((r & 0xFFFFFFFFULL) * span) >> 32));
        unsigned char *q = malloc(size);
        if (__builtin_expect(q == NULL, 0)) {
            fprintf(stderr, "%s: malloc(%zu) failed\n", who, size);
            exit(1);
        }
        q[0] = (unsigned char)stamp;
        q[size - 1] = (unsigned char)idx;
        BENCH_ESCAPE(q);
        slots[idx] = q;
    }
}

/* Uniform integer in [0, n) from 32 random bits (n < 2^32). */
static inline uint64_t bench_below(uint64_t r32, uint64_t n)
{
    return ((r32 & 0xFFFFFFFFULL) * n) >> 32;
}

#endif /* HAKMEM_BENCH_MIXED_H */
