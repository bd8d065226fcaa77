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

uintptr_t hak_link_key, hak_canary, hak_freed_key;

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
  uintptr_t secret[3];
  for (int i = 0; i < 3; i++) {
    uint64_t k = mix64(seed[i] ^ mix64(salt + (uint64_t)i));
    /* Odd, so not zero: a zero key would store links in the clear, and the
     * link key's low byte not zero makes a cleared first word (a block just
     * handed out) decode to no link (hak_block_linked). */
    secret[i] = (uintptr_t)(k | 1u) ^ ((uintptr_t)i << 1);
  }
  hak_link_key = secret[0];
  hak_freed_key = secret[1];
  hak_canary = secret[2];
}

/* A thread's own random stream, seeded from the secrets: a Weyl sequence
 * whose steps are mixed by one 128-bit multiply (the wyrand construction),
 * enough to shuffle with. */
static __thread uint64_t rng_state;

static inline uint64_t rng_mix(uint64_t s) {
  __uint128_t t = (__uint128_t)s * (s ^ 0xe7037ed1a0b428dbull);
  return (uint64_t)(t >> 64) ^ (uint64_t)t;
}
#define RNG_STEP 0xa0761d6478bd642full

/* Links the n blocks of bs bytes from first in a random order, ending with
 * tail, and lays their canaries; returns the first of the list.  n is at
 * most HAK_SECURE_CARVE_MAX.  The order is a shuffle of the indices, built
 * inside out (index i goes to a random place j <= i, whose index moves to
 * i), two steps per random word. */
hak_block_t* hak_secure_carve(uint8_t* first, uint32_t bs, uint32_t n, hak_block_t* tail) {
  uint16_t order[HAK_SECURE_CARVE_MAX];
  uint64_t s = rng_state;
  if (unlikely(s == 0)) s = mix64(hak_link_key ^ hak_thread_id()) | 1;
  order[0] = 0;
  uint64_t r = 0;
  for (uint32_t i = 1; i < n; i++) {
    if (i & 1) {
      s += RNG_STEP;
      r = rng_mix(s);
    } else {
      r >>= 32;
    }
    uint32_t j = (uint32_t)(((r & 0xffffffffu) * (i + 1)) >> 32);
    order[i] = order[j];
    order[j] = (uint16_t)i;
  }
  rng_state = s;
  /* (hak_block_set_next and hak_canary_set, the secrets read once: the
   * compiler cannot tell that the stores leave them alone.) */
  const uintptr_t link_key = hak_link_key, canary = hak_canary;
  uintptr_t list = (uintptr_t)tail;
  for (uint32_t i = 0; i < n; i++) {
    uint8_t* b = first + (size_t)order[i] * bs;
    ((hak_block_t*)b)->link = __builtin_bswap64(list ^ (uintptr_t)b) ^ link_key;
    *(uintptr_t*)(b + bs - HAK_CANARY_SIZE) = canary;
    list = (uintptr_t)b;
  }
  return (hak_block_t*)list;
}

void hak_bad_link(const void* at) {
  hak_fatal("corrupted free list (a freed block was written to) at", at);
}

/* A block freed that is linked (free already), or whose last word is not
 * its canary: the freed tag of a block on another heap's list, else a write
 * past its end. */
void hak_bad_free(const hak_page_t* page, const void* b) {
  if (hak_block_linked(b) || *hak_canary_at(page, b) == hak_freed_word()) hak_double_free(page, b);
  hak_fatal_class("write past the end of the block", b, page->cls == HAK_CLASS_LARGE ? -1 : (int)page->cls);
}

#endif
