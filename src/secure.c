/* The secure build (make secure, HAK_SECURE): the secrets behind encoded
 * free-list links, freed tags and canaries; fresh blocks carved in random
 * order; the reports of a corrupted heap.  The checks themselves are inline
 * (src/internal.h); the guard pages are laid in segment.c and huge.c.  The
 * release build compiles this file to nothing. */
#include "internal.h"

#if HAK_SECURE

#include <sys/auxv.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

uintptr_t hak_secret[3];

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Once, at start, before the first block is carved: from getrandom, else
 * from the 16 random bytes the kernel gives every process (AT_RANDOM), mixed
 * with the clock and an address either way. */
void hak_secure_init(void) {
  uint64_t seed[3] = {0, 0, 0};
  long got = syscall(SYS_getrandom, seed, sizeof seed, 1 /* GRND_NONBLOCK */);
  if (got != (long)sizeof seed) {
    const uint64_t* at = (const uint64_t*)getauxval(AT_RANDOM);
    if (at != NULL) {
      seed[0] ^= at[0];
      seed[1] ^= at[1];
    }
  }
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t salt = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ (uintptr_t)&ts;
  for (int i = 0; i < 3; i++) {
    uint64_t k = mix64(seed[i] ^ mix64(salt + (uint64_t)i));
    /* Odd, so not zero: a zero key would store links in the clear, and the
     * link key's low byte not zero makes a cleared first word (a block just
     * handed out) decode to no link (hak_block_linked). */
    hak_secret[i] = (uintptr_t)(k | 1u) ^ ((uintptr_t)i << 1);
  }
}

/* A thread's own random stream (splitmix), seeded from the secrets. */
static __thread uint64_t rng_state;

static uint64_t rng_next(void) {
  if (unlikely(rng_state == 0)) rng_state = mix64(hak_secret[0] ^ hak_thread_id()) | 1;
  rng_state += 0x9e3779b97f4a7c15ull;
  return mix64(rng_state);
}

/* Swaps order[i - 1] with an element of order[0 .. i - 1] chosen by r (32
 * random bits). */
static inline void shuffle_step(uint16_t* order, uint32_t i, uint64_t r) {
  uint32_t j = (uint32_t)((r * i) >> 32);
  uint16_t t = order[i - 1];
  order[i - 1] = order[j];
  order[j] = t;
}

/* Links the n blocks of bs bytes from first in a random order (a shuffle of
 * their indices, two steps per random word), ending with tail, and lays
 * their canaries; returns the first of the list.  n is at most
 * HAK_SECURE_CARVE_MAX. */
hak_block_t* hak_secure_carve(uint8_t* first, uint32_t bs, uint32_t n, hak_block_t* tail) {
  uint16_t order[HAK_SECURE_CARVE_MAX];
  for (uint32_t i = 0; i < n; i++) order[i] = (uint16_t)i;
  uint32_t i = n;
  for (; i > 2; i -= 2) {
    uint64_t r = rng_next();
    shuffle_step(order, i, r >> 32);
    shuffle_step(order, i - 1, r & 0xffffffffu);
  }
  if (i == 2) shuffle_step(order, 2, rng_next() >> 32);
  hak_block_t* list = tail;
  for (i = 0; i < n; i++) {
    hak_block_t* b = (hak_block_t*)(first + (size_t)order[i] * bs);
    hak_block_set_next(b, list);
    *(uintptr_t*)((uint8_t*)b + bs - HAK_CANARY_SIZE) = hak_canary_word(b);
    list = b;
  }
  return list;
}

void hak_bad_link(const void* at) {
  hak_fatal("corrupted free list (a freed block was written to) at", at);
}

/* A block freed that is linked (free already), or whose last word is not
 * its canary: the freed tag of a block on another heap's list, else a write
 * past its end. */
void hak_bad_free(const hak_page_t* page, const void* b) {
  if (hak_block_linked(b) || *hak_canary_at(page, b) == hak_freed_word(b)) hak_double_free(page, b);
  hak_fatal_class("write past the end of the block", b, page->cls == HAK_CLASS_LARGE ? -1 : (int)page->cls);
}

#endif
