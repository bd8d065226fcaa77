/* fuzz_hak: a libFuzzer target for the hak_* API of include/hakmem.h.
 *
 * The input is a little program over a table of SLOTS live blocks: each
 * opcode byte is followed by its operands (bytes past the end read as 0).
 * Opcodes allocate (malloc, calloc, aligned_alloc, realloc chains) with sizes
 * from every range the allocator distinguishes (0, tiny, small, mid, large,
 * huge, and sizes next to class and unit boundaries), free, ask for the
 * usable size, make the edge-case calls whose results are specified (NULL
 * with ENOMEM or EINVAL), change options (the purge delay and mode, THP, the
 * learner), take statistics, and hand blocks to a worker thread that frees
 * or reallocates them, or allocates blocks that the main thread later frees
 * (remote frees both ways), and restart that thread (its heap is abandoned
 * with blocks still live, then adopted).
 *
 * Every live block holds a pattern computed from its seed and the offset;
 * it is checked before every free and realloc (the surviving prefix after
 * it), by the worker before its frees, on request, and at the end of each
 * input, when every block is freed.  A new block must be aligned (16 bytes
 * or the alignment asked for), its usable size must cover the request, and
 * its usable range must not overlap that of any other live block.  Any
 * failure prints a line starting "fuzz_hak:" and aborts: libFuzzer saves the
 * input as a crash.
 *
 * The work of one input is bounded: at most MAX_OPS operations, at most
 * LIVE_CAP bytes live (including blocks queued for the worker), and once
 * FILL_BUDGET bytes were written, requests above 64 KiB are cut down.
 * tests/fuzz/make_seeds.py writes inputs in this encoding. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hakmem.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#define SLOTS 64
#define MAX_OPS 4096
#define LIVE_CAP (64 * MiB)
#define FILL_BUDGET (256 * MiB)
#define FULL_CHECK_MAX (256 * KiB) /* larger blocks: ends and samples */
#define BURST_MAX 256
#define RESTARTS_MAX 8
#define QUEUE_CAP 1024

/* Opcodes: the low four bits of the opcode byte. */
enum {
  OP_MALLOC,         /* slot, size */
  OP_FREE,           /* slot */
  OP_CALLOC,         /* slot, split, size */
  OP_REALLOC,        /* slot, chain, size */
  OP_ALIGNED,        /* slot, alignment, size */
  OP_USABLE,         /* slot, flags */
  OP_CHECK,          /* slot */
  OP_REWRITE,        /* slot */
  OP_REMOTE_FREE,    /* slot: the worker checks and frees it, later */
  OP_REMOTE_ALLOC,   /* slot, kind, alignment, size: the worker allocates it */
  OP_REMOTE_REALLOC, /* slot, size: the worker reallocates it */
  OP_SYNC,           /* wait until the worker has done all it was given */
  OP_EDGE,           /* variant, slot, size: calls with specified failures */
  OP_BURST,          /* count, mode, size: many blocks of one size at once */
  OP_OPTION,         /* which, value: an option, or the statistics */
  OP_RESTART,        /* the worker thread exits; a new one starts */
};

/* ---- the block pattern ---------------------------------------------------- */

/* The loops over block contents are kept out of libFuzzer's coverage (which
 * would trace every comparison in them and make them ten times slower). */
#define NO_COVERAGE __attribute__((no_sanitize("coverage"), noinline))

static inline uint64_t mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  x *= 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 32);
}

/* Word k (bytes 8k to 8k + 7, little-endian) of the pattern of seed: seeds
 * are random (mix), so blocks differ, and words differ within a block. */
static inline uint64_t pat_word(uint64_t seed, size_t k) {
  return seed ^ ((uint64_t)k * 0x9E3779B97F4A7C15ull);
}

static inline uint8_t pat_byte(uint64_t seed, size_t i) {
  return (uint8_t)(pat_word(seed, i >> 3) >> ((i & 7) * 8));
}

/* Writes the pattern of seed into p[from, to). */
NO_COVERAGE static void fill(uint8_t* p, size_t from, size_t to, uint64_t seed) {
  size_t i = from;
  for (; i < to && (i & 7) != 0; i++) p[i] = pat_byte(seed, i);
  for (; i + 8 <= to; i += 8) {
    uint64_t w = pat_word(seed, i >> 3);
    memcpy(p + i, &w, 8);
  }
  for (; i < to; i++) p[i] = pat_byte(seed, i);
}

/* The first offset in [from, to) that does not hold the pattern, or SIZE_MAX. */
NO_COVERAGE static size_t mismatch(const uint8_t* p, size_t from, size_t to, uint64_t seed) {
  size_t i = from;
  for (; i < to && (i & 7) != 0; i++)
    if (p[i] != pat_byte(seed, i)) return i;
  for (; i + 8 <= to; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    if (w != pat_word(seed, i >> 3)) break;
  }
  for (; i < to; i++)
    if (p[i] != pat_byte(seed, i)) return i;
  return SIZE_MAX;
}

static void fail(const char* fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

static void fail(const char* fmt, ...) {
  char buf[512];
  __builtin_va_list ap;
  __builtin_va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  __builtin_va_end(ap);
  fprintf(stderr, "fuzz_hak: %s\n", buf);
  fflush(stderr);
  abort();
}

static void bad_byte(const char* where, const uint8_t* p, size_t size, size_t at, uint64_t seed) {
  fail("%s: block %p of %zu bytes: byte %zu is 0x%02x, want 0x%02x (seed %016llx)", where,
       (const void*)p, size, at, p[at], pat_byte(seed, at), (unsigned long long)seed);
}

/* Checks p[from, to): whole when short, else its first and last 4 KiB and
 * two words in every 4 KiB between. */
static void check_range(const char* where, const uint8_t* p, size_t size, size_t from, size_t to,
                        uint64_t seed) {
  size_t at;
  if (to - from <= FULL_CHECK_MAX) {
    at = mismatch(p, from, to, seed);
    if (at != SIZE_MAX) bad_byte(where, p, size, at, seed);
    return;
  }
  at = mismatch(p, from, from + 4 * KiB, seed);
  if (at == SIZE_MAX) at = mismatch(p, to - 4 * KiB, to, seed);
  for (size_t q = (from + 4 * KiB) & ~(size_t)4095; at == SIZE_MAX && q + 8 * KiB <= to; q += 4 * KiB) {
    size_t off = q + (size_t)(mix(seed + q) % 4080);
    at = mismatch(p, off, off + 16, seed);
  }
  if (at != SIZE_MAX) bad_byte(where, p, size, at, seed);
}

static void check_pattern(const char* where, const uint8_t* p, size_t size, uint64_t seed) {
  if (size > 0) check_range(where, p, size, 0, size, seed);
}

NO_COVERAGE static size_t nonzero(const uint8_t* p, size_t size) {
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    if (w != 0) break;
  }
  for (; i < size; i++)
    if (p[i] != 0) return i;
  return SIZE_MAX;
}

static void check_zero(const char* where, const uint8_t* p, size_t size) {
  size_t i = nonzero(p, size);
  if (i != SIZE_MAX) fail("%s: calloc block %p of %zu bytes: byte %zu is 0x%02x, not 0", where,
                        (const void*)p, size, i, p[i]);
}

static void check_fresh(const char* where, const void* p, size_t size, size_t align) {
  if (p == NULL) fail("%s: NULL for %zu bytes (alignment %zu), errno %d", where, size, align, errno);
  if (((uintptr_t)p & (align - 1)) != 0)
    fail("%s: %p for %zu bytes is not aligned to %zu", where, p, size, align);
  size_t usable = hak_usable_size(p);
  if (usable < size) fail("%s: usable size %zu of %p below the %zu asked for", where, usable, p, size);
}

/* ---- the worker thread ---------------------------------------------------- */

enum { REQ_FREE, REQ_ALLOC, REQ_REALLOC, REQ_BURST_ALLOC, REQ_EXIT };

typedef struct req_s {
  int kind;
  int how;          /* REQ_ALLOC: 0 malloc, 1 calloc, 2 aligned_alloc */
  uint8_t* p;
  size_t size;      /* the block's (REQ_FREE, REQ_REALLOC) or the one to make */
  size_t new_size;  /* REQ_REALLOC */
  size_t align;
  uint64_t seed;
  int count;        /* REQ_BURST_ALLOC */
} req_t;

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_work = PTHREAD_COND_INITIALIZER; /* the worker waits */
static pthread_cond_t q_done = PTHREAD_COND_INITIALIZER; /* the main thread waits */
static req_t queue[QUEUE_CAP];
static unsigned q_head, q_tail; /* taken, put */
static bool q_busy;             /* the worker is on a request */
static bool reply_ready;
static uint8_t* reply_p;
static uint8_t* burst_blocks[BURST_MAX];
static pthread_t worker;
static atomic_size_t live_bytes; /* in slots, bursts, and queued for the worker */

static void worker_free(const req_t* r) {
  check_pattern("remote free", r->p, r->size, r->seed);
  hak_free(r->p);
  atomic_fetch_sub(&live_bytes, r->size);
}

static uint8_t* worker_alloc(const req_t* r) {
  uint8_t* p;
  size_t align = 16;
  errno = 0;
  if (r->how == 1) {
    p = hak_calloc(1, r->size);
    check_fresh("remote calloc", p, r->size, align);
    check_zero("remote calloc", p, r->size);
  } else if (r->how == 2) {
    align = r->align;
    p = hak_aligned_alloc(align, r->size);
    check_fresh("remote aligned_alloc", p, r->size, align < 16 ? 16 : align);
  } else {
    p = hak_malloc(r->size);
    check_fresh("remote malloc", p, r->size, align);
  }
  fill(p, 0, r->size, r->seed);
  return p;
}

static uint8_t* worker_realloc(const req_t* r) {
  check_pattern("remote realloc (before)", r->p, r->size, r->seed);
  uint8_t* q = hak_realloc(r->p, r->new_size);
  if (r->new_size == 0) {
    if (q != NULL) fail("remote realloc to 0 returned %p, not NULL", (void*)q);
    return NULL;
  }
  check_fresh("remote realloc", q, r->new_size, 16);
  size_t keep = r->size < r->new_size ? r->size : r->new_size;
  check_pattern("remote realloc (kept prefix)", q, keep, r->seed);
  if (r->new_size > keep) fill(q, keep, r->new_size, r->seed);
  return q;
}

static void* worker_main(void* arg) {
  (void)arg;
  pthread_mutex_lock(&q_lock);
  for (;;) {
    while (q_head == q_tail) pthread_cond_wait(&q_work, &q_lock);
    req_t r = queue[q_head % QUEUE_CAP];
    q_head++;
    q_busy = true;
    pthread_mutex_unlock(&q_lock);
    uint8_t* out = NULL;
    switch (r.kind) {
      case REQ_FREE: worker_free(&r); break;
      case REQ_ALLOC: out = worker_alloc(&r); break;
      case REQ_REALLOC: out = worker_realloc(&r); break;
      case REQ_BURST_ALLOC:
        for (int i = 0; i < r.count; i++) {
          req_t one = r;
          one.seed = r.seed + (uint64_t)i;
          burst_blocks[i] = worker_alloc(&one);
        }
        break;
      default: break;
    }
    pthread_mutex_lock(&q_lock);
    q_busy = false;
    if (r.kind != REQ_FREE) {
      reply_p = out;
      reply_ready = true;
    }
    pthread_cond_broadcast(&q_done);
    if (r.kind == REQ_EXIT) break;
  }
  pthread_mutex_unlock(&q_lock);
  return NULL;
}

static void worker_start(void) {
  if (pthread_create(&worker, NULL, worker_main, NULL) != 0) fail("pthread_create failed");
}

static void post(const req_t* r) {
  pthread_mutex_lock(&q_lock);
  while (q_tail - q_head >= QUEUE_CAP) pthread_cond_wait(&q_done, &q_lock);
  queue[q_tail % QUEUE_CAP] = *r;
  q_tail++;
  pthread_cond_signal(&q_work);
  pthread_mutex_unlock(&q_lock);
}

/* Posts a request and waits for its answer (the requests before it are done). */
static uint8_t* call(const req_t* r) {
  pthread_mutex_lock(&q_lock);
  reply_ready = false;
  pthread_mutex_unlock(&q_lock);
  post(r);
  pthread_mutex_lock(&q_lock);
  while (!reply_ready) pthread_cond_wait(&q_done, &q_lock);
  uint8_t* p = reply_p;
  pthread_mutex_unlock(&q_lock);
  return p;
}

static void drain(void) {
  pthread_mutex_lock(&q_lock);
  while (q_head != q_tail || q_busy) pthread_cond_wait(&q_done, &q_lock);
  pthread_mutex_unlock(&q_lock);
}

static void worker_restart(void) {
  req_t r = {.kind = REQ_EXIT};
  call(&r);
  if (pthread_join(worker, NULL) != 0) fail("pthread_join failed");
  worker_start();
}

/* ---- one input ------------------------------------------------------------ */

typedef struct slot_s {
  uint8_t* p; /* NULL: empty */
  size_t size;
  size_t usable;
  size_t align;
  uint64_t seed;
} slot_t;

typedef struct input_s {
  const uint8_t* d;
  size_t n, i;
} input_t;

static slot_t slots[SLOTS];
static uint64_t seed_count; /* per input, so that runs repeat */
static size_t filled;       /* bytes written this input */
static int restarts;

static size_t boundaries[160];
static size_t boundary_count;

static const char* const option_names[] = {"PURGE_DELAY_MS", "PURGE", "THP", "LEARN"};
#define OPTION_COUNT 4
static long option_default[OPTION_COUNT];
static bool option_changed[OPTION_COUNT];

static uint8_t in8(input_t* in) { return in->i < in->n ? in->d[in->i++] : 0; }
static uint16_t in16(input_t* in) {
  uint16_t lo = in8(in);
  return (uint16_t)(lo | (uint16_t)in8(in) << 8);
}
static uint32_t in32(input_t* in) {
  uint32_t lo = in16(in);
  return lo | (uint32_t)in16(in) << 16;
}

static uint64_t new_seed(int slot) {
  seed_count++;
  return mix(((uint64_t)slot << 40) + seed_count);
}

/* A size: a selector byte (its range), then 4 bytes for the value. */
static size_t draw_size(input_t* in) {
  uint8_t sel = in8(in);
  uint32_t v = in32(in);
  size_t size;
  switch (sel & 15) {
    case 0: size = 0; break;
    case 1: case 2: case 3: case 4: size = 1 + v % 64; break;
    case 5: case 6: case 7: case 8: size = 1 + v % 1024; break;
    case 9: case 10: size = 1 + v % (128 * KiB); break;
    case 11: case 12: { /* next to a class, unit or mapping boundary */
      static const int delta[8] = {-1, 0, 1, -16, 16, -4096, 4096, 15};
      size_t b = boundaries[v % boundary_count];
      long d = delta[(v >> 16) & 7];
      size = (d < 0 && (size_t)-d > b) ? b : (size_t)((long)b + d);
      break;
    }
    case 13: case 14: size = 64 * KiB + v % (MiB - 64 * KiB + 8 * KiB); break;
    default: size = MiB + v % (7 * MiB); break;
  }
  if (filled > FILL_BUDGET && size > 64 * KiB) size = size % (64 * KiB);
  return size;
}

/* Room for size more live bytes?  Waits for the worker's frees first. */
static bool room(size_t size) {
  if (atomic_load(&live_bytes) + size <= LIVE_CAP) return true;
  drain();
  return atomic_load(&live_bytes) + size <= LIVE_CAP;
}

/* A new block's usable range overlaps no other live block's. */
static void check_disjoint(const char* where, int self, const uint8_t* p, size_t usable) {
  for (int j = 0; j < SLOTS; j++) {
    const slot_t* s = &slots[j];
    if (j == self || s->p == NULL) continue;
    if (p < s->p + s->usable && s->p < p + usable)
      fail("%s: %p (+%zu) overlaps the live block %p (+%zu) of slot %d", where, (const void*)p,
           usable, (const void*)s->p, s->usable, j);
  }
}

static void slot_check(const char* where, int i) {
  const slot_t* s = &slots[i];
  if (s->p != NULL) check_pattern(where, s->p, s->size, s->seed);
}

static void slot_free(int i) {
  slot_t* s = &slots[i];
  if (s->p == NULL) return;
  slot_check("free", i);
  hak_free(s->p);
  atomic_fetch_sub(&live_bytes, s->size);
  s->p = NULL;
}

/* Takes p (size bytes, checked fresh) into slot i, filling it unless filled. */
static void slot_take(const char* where, int i, uint8_t* p, size_t size, size_t align, uint64_t seed,
                      bool is_filled) {
  slot_t* s = &slots[i];
  s->p = p;
  s->size = size;
  s->usable = hak_usable_size(p);
  s->align = align;
  s->seed = seed;
  check_disjoint(where, i, p, s->usable);
  if (!is_filled) fill(p, 0, size, seed);
  filled += size;
  atomic_fetch_add(&live_bytes, size);
}

static void op_malloc(input_t* in) {
  int i = in8(in) % SLOTS;
  size_t size = draw_size(in);
  slot_free(i);
  if (!room(size)) return;
  errno = 0;
  uint8_t* p = hak_malloc(size);
  check_fresh("malloc", p, size, 16);
  slot_take("malloc", i, p, size, 16, new_seed(i), false);
}

static void op_calloc(input_t* in) {
  int i = in8(in) % SLOTS;
  uint8_t split = in8(in);
  size_t size = draw_size(in);
  static const size_t unit[8] = {1, 2, 3, 4, 8, 16, 24, 100};
  size_t u = unit[split & 7], count = size / u;
  size = count * u;
  slot_free(i);
  if (!room(size)) return;
  errno = 0;
  uint8_t* p = (split & 8) ? hak_calloc(u, count) : hak_calloc(count, u); /* either order */
  check_fresh("calloc", p, size, 16);
  check_zero("calloc", p, size);
  slot_take("calloc", i, p, size, 16, new_seed(i), false);
}

/* Reallocates slot i to size, checking what must survive; false if it is empty now. */
static bool slot_realloc(const char* where, int i, size_t size) {
  slot_t* s = &slots[i];
  if (s->p == NULL) {
    if (!room(size)) return false;
    errno = 0;
    uint8_t* p = hak_realloc(NULL, size);
    check_fresh(where, p, size, 16);
    slot_take(where, i, p, size, 16, new_seed(i), false);
    return true;
  }
  if (size > s->size && !room(size - s->size)) return true;
  slot_check(where, i);
  errno = 0;
  uint8_t* q = hak_realloc(s->p, size);
  if (size == 0) {
    if (q != NULL) fail("%s: realloc(%p, 0) returned %p, not NULL", where, (void*)s->p, (void*)q);
    atomic_fetch_sub(&live_bytes, s->size);
    s->p = NULL;
    return false;
  }
  check_fresh(where, q, size, 16);
  size_t keep = s->size < size ? s->size : size;
  check_range(where, q, size, 0, keep, s->seed);
  if (size > keep) fill(q, keep, size, s->seed);
  filled += size - keep;
  if (size > s->size)
    atomic_fetch_add(&live_bytes, size - s->size);
  else
    atomic_fetch_sub(&live_bytes, s->size - size);
  s->p = q;
  s->size = size;
  s->usable = hak_usable_size(q);
  s->align = 16;
  check_disjoint(where, i, q, s->usable);
  return true;
}

/* A chain of up to 7 steps after the first, growing (x1.5 + 1), shrinking
 * (x2/3), alternating, or each to a size drawn from the input. */
static int op_realloc(input_t* in) {
  int i = in8(in) % SLOTS;
  uint8_t chain = in8(in);
  size_t size = draw_size(in);
  int steps = chain & 7, mode = (chain >> 3) & 3;
  if (!slot_realloc("realloc", i, size)) return 1;
  for (int k = 0; k < steps; k++) {
    if (mode == 3) {
      size = draw_size(in);
    } else if (mode == 0 || (mode == 2 && (k & 1) == 0)) {
      size = size + size / 2 + 1;
      if (size > 8 * MiB) size = 8 * MiB;
    } else {
      size = size * 2 / 3;
    }
    if (filled > FILL_BUDGET && size > 64 * KiB) size %= 64 * KiB;
    if (!slot_realloc("realloc chain", i, size)) return k + 2;
  }
  return steps + 1;
}

/* An alignment byte: 1 to 4 MiB, or invalid ones (not powers of two: EINVAL;
 * too large: ENOMEM). */
static size_t draw_align(uint8_t a, int* want_errno) {
  static const size_t bad[6] = {0, 3, 24, 48, 4096 + 16, SIZE_MAX};
  a %= 32;
  *want_errno = 0;
  if (a <= 16) return (size_t)1 << a;
  if (a <= 22) {
    *want_errno = EINVAL;
    return bad[a - 17];
  }
  if (a == 23) {
    *want_errno = ENOMEM;
    return (size_t)1 << 63;
  }
  if (a <= 27) return (size_t)1 << (a - 16); /* 128 .. 2048 once more */
  return (size_t)1 << (a - 28 + 19);         /* 512 KiB .. 4 MiB */
}

static void op_aligned(input_t* in) {
  int i = in8(in) % SLOTS;
  int want_errno;
  size_t align = draw_align(in8(in), &want_errno);
  size_t size = draw_size(in);
  slot_free(i);
  if (!room(size + (align <= 4 * MiB ? align : 0))) return;
  errno = 0;
  uint8_t* p = hak_aligned_alloc(align, size);
  if (want_errno != 0) {
    if (p != NULL || errno != want_errno)
      fail("aligned_alloc(%zu, %zu) returned %p errno %d, want NULL errno %d", align, size,
           (void*)p, errno, want_errno);
    return;
  }
  size_t need = align < 16 ? 16 : align;
  check_fresh("aligned_alloc", p, size, need);
  slot_take("aligned_alloc", i, p, size, need, new_seed(i), false);
}

/* The usable size covers the request and stays as it was; with flag 1 the
 * slack is taken into the block (the pattern written over it). */
static void op_usable(input_t* in) {
  int i = in8(in) % SLOTS;
  uint8_t flags = in8(in);
  slot_t* s = &slots[i];
  if (s->p == NULL) {
    if (hak_usable_size(NULL) != 0) fail("usable_size(NULL) is not 0");
    return;
  }
  size_t u = hak_usable_size(s->p);
  if (u < s->size || u != s->usable)
    fail("usable_size(%p) is %zu, was %zu, for a block of %zu", (void*)s->p, u, s->usable, s->size);
  if ((flags & 1) && u > s->size && u - s->size <= 8 * MiB && room(u - s->size)) {
    fill(s->p, s->size, u, s->seed);
    filled += u - s->size;
    atomic_fetch_add(&live_bytes, u - s->size);
    s->size = u;
  }
}

static void op_rewrite(input_t* in) {
  int i = in8(in) % SLOTS;
  slot_t* s = &slots[i];
  if (s->p == NULL) return;
  slot_check("rewrite", i);
  s->seed = new_seed(i);
  fill(s->p, 0, s->size, s->seed);
  filled += s->size;
}

static void op_remote_free(input_t* in) {
  int i = in8(in) % SLOTS;
  slot_t* s = &slots[i];
  if (s->p == NULL) return;
  req_t r = {.kind = REQ_FREE, .p = s->p, .size = s->size, .seed = s->seed};
  s->p = NULL;
  post(&r);
}

static void op_remote_alloc(input_t* in) {
  int i = in8(in) % SLOTS;
  uint8_t kind = in8(in);
  int want_errno;
  size_t align = draw_align(in8(in), &want_errno);
  size_t size = draw_size(in);
  if (want_errno != 0 || align > 64 * KiB) align = 64;
  slot_free(i);
  if (!room(size + align)) return;
  req_t r = {.kind = REQ_ALLOC, .how = kind % 3, .size = size, .align = align, .seed = new_seed(i)};
  uint8_t* p = call(&r);
  slot_take("remote alloc", i, p, size, r.how == 2 && align > 16 ? align : 16, r.seed, true);
}

static void op_remote_realloc(input_t* in) {
  int i = in8(in) % SLOTS;
  size_t size = draw_size(in);
  slot_t* s = &slots[i];
  if (s->p == NULL) return;
  if (size > s->size && !room(size - s->size)) return;
  req_t r = {.kind = REQ_REALLOC, .p = s->p, .size = s->size, .new_size = size, .seed = s->seed};
  size_t old = s->size;
  uint8_t* q = call(&r);
  s->p = NULL;
  atomic_fetch_sub(&live_bytes, old);
  if (q != NULL) slot_take("remote realloc", i, q, size, 16, r.seed, true);
}

static void expect_fail(const char* what, void* p, int want) {
  int e = errno;
  if (p != NULL || e != want)
    fail("%s returned %p errno %d, want NULL errno %d", what, p, e, want);
}

static volatile size_t opaque_zero; /* keeps the compiler from reasoning about the sizes */

static void op_edge(input_t* in) {
  uint8_t variant = in8(in);
  int i = in8(in) % SLOTS;
  size_t size = draw_size(in);
  size_t z = opaque_zero;
  slot_t* s = &slots[i];
  errno = 0;
  switch (variant % 12) {
    case 0: expect_fail("malloc(SIZE_MAX)", hak_malloc(SIZE_MAX + z), ENOMEM); break;
    case 1: expect_fail("malloc(PTRDIFF_MAX)", hak_malloc((size_t)PTRDIFF_MAX + z), ENOMEM); break;
    case 2: expect_fail("calloc(SIZE_MAX/2 + 2, 2)", hak_calloc(SIZE_MAX / 2 + 2 + z, 2), ENOMEM); break;
    case 3: expect_fail("calloc(2^32, 2^32)", hak_calloc(((size_t)1 << 32) + z, (size_t)1 << 32), ENOMEM); break;
    case 4: expect_fail("aligned_alloc(64, SIZE_MAX - 64)", hak_aligned_alloc(64, SIZE_MAX - 64 + z), ENOMEM); break;
    case 5: /* a failed realloc leaves the block as it was */
      if (s->p != NULL) {
        slot_check("realloc to SIZE_MAX (before)", i);
        expect_fail("realloc(p, SIZE_MAX)", hak_realloc(s->p, SIZE_MAX - 16 * (variant >> 4) + z), ENOMEM);
        slot_check("realloc to SIZE_MAX (after)", i);
      }
      break;
    case 6: hak_free(NULL); break;
    case 7:
      if (hak_usable_size(NULL) != 0) fail("usable_size(NULL) is not 0");
      break;
    case 8: /* calloc with a zero count or size: a unique block */
    case 9: {
      uint8_t* p = variant % 12 == 8 ? hak_calloc(z, size) : hak_calloc(size, z);
      check_fresh("calloc of 0 bytes", p, 0, 16);
      slot_free(i);
      slot_take("calloc of 0 bytes", i, p, 0, 16, new_seed(i), false);
      break;
    }
    case 10: /* realloc(NULL, n) is malloc(n) */
      slot_free(i);
      slot_realloc("realloc(NULL)", i, size);
      break;
    default: /* realloc to its own size (it may move, when the block is much larger) */
      if (s->p != NULL && s->size != 0) {
        slot_check("realloc to the same size (before)", i);
        uint8_t* q = hak_realloc(s->p, s->size);
        check_fresh("realloc to the same size", q, s->size, 16);
        if (q != s->p) {
          s->align = 16;
          s->p = q;
          s->usable = hak_usable_size(q);
          check_disjoint("realloc to the same size", i, q, s->usable);
        }
        slot_check("realloc to the same size (after)", i);
      }
      break;
  }
}

/* count blocks of one size, allocated here or by the worker, freed in
 * order, in reverse, odd ones first, by the worker, or here. */
static int op_burst(input_t* in) {
  int count = 1 + in8(in) % BURST_MAX;
  uint8_t mode = in8(in);
  size_t size = draw_size(in) % (16 * KiB);
  static uint8_t* mine[BURST_MAX];
  if (!room((size_t)count * size)) return 1;
  uint64_t seed = new_seed(SLOTS);
  int free_mode = mode % 5;
  if ((mode >> 3) & 1) { /* the worker allocates them */
    req_t r = {.kind = REQ_BURST_ALLOC, .how = (mode >> 4) % 2, .size = size, .seed = seed, .count = count};
    call(&r);
    memcpy(mine, burst_blocks, sizeof mine[0] * (size_t)count);
    if (free_mode == 3) free_mode = 4; /* not back to their own thread */
  } else {
    for (int k = 0; k < count; k++) {
      errno = 0;
      mine[k] = hak_malloc(size);
      check_fresh("burst malloc", mine[k], size, 16);
      fill(mine[k], 0, size, seed + (uint64_t)k);
    }
  }
  atomic_fetch_add(&live_bytes, (size_t)count * size);
  filled += (size_t)count * size;
  int odd = count / 2;
  for (int k = 0; k < count; k++) {
    int j = k;
    if (free_mode == 1) j = count - 1 - k;
    if (free_mode == 2) j = k < odd ? 2 * k + 1 : 2 * (k - odd); /* odd positions, then even ones */
    if (free_mode == 3) {
      req_t r = {.kind = REQ_FREE, .p = mine[j], .size = size, .seed = seed + (uint64_t)j};
      post(&r);
    } else {
      check_pattern("burst free", mine[j], size, seed + (uint64_t)j);
      hak_free(mine[j]);
      atomic_fetch_sub(&live_bytes, size);
    }
  }
  return 1 + count / 8;
}

static void option_set(int which, long value) {
  if (hak_option_set(option_names[which], value) != 0)
    fail("hak_option_set(%s, %ld) failed", option_names[which], value);
  option_changed[which] = true;
}

/* An option changed (restored at the end of the input), or the statistics
 * taken (and reset) while the worker may be allocating. */
static void op_option(input_t* in) {
  static const long delays[4] = {0, -1, 1, 100};
  uint8_t which = in8(in), value = in8(in);
  switch (which % 5) {
    case 0: option_set(0, delays[value % 4]); break;
    case 1: option_set(1, value % 2); break;
    case 2: option_set(2, value % 3); break;
    case 3: option_set(3, value % 2); break;
    default: {
      static hak_stats_t st;
      bool quiet = (value & 2) != 0; /* the worker idle: the figures agree */
      if (quiet) drain();
      hak_stats_get(&st);
      if (quiet && (st.huge_live_bytes > st.live_bytes || st.committed_bytes > st.reserved_bytes))
        fail("statistics: huge live %zu of live %zu, committed %zu of reserved %zu", st.huge_live_bytes,
             st.live_bytes, st.committed_bytes, st.reserved_bytes);
      if (value & 1) hak_stats_reset();
      break;
    }
  }
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
  (void)argc;
  (void)argv;
  /* Sizes next to boundaries: the classes (16 to 256 by 16, then four per
   * doubling to 128 KiB, and the fifth, 9/8 of each doubling from 1 KiB,
   * last so that the older entries keep their places), the 64 KiB unit,
   * 1 MiB (large to huge), the 2 MiB segment and multiples. */
  for (size_t s = 16; s <= 256; s += 16) boundaries[boundary_count++] = s;
  for (size_t d = 256; d < 128 * KiB; d *= 2)
    for (size_t q = 5; q <= 8; q++) boundaries[boundary_count++] = d * q / 4;
  static const size_t more[] = {0, 1, 4 * KiB, 60 * KiB, 64 * KiB, 192 * KiB, 960 * KiB, MiB,
                                MiB + 4 * KiB, 2 * MiB - 4 * KiB, 2 * MiB, 2 * MiB + 4 * KiB, 4 * MiB, 6 * MiB};
  for (size_t k = 0; k < sizeof more / sizeof more[0]; k++) boundaries[boundary_count++] = more[k];
  for (size_t d = KiB; d < 128 * KiB; d *= 2) boundaries[boundary_count++] = d * 9 / 8;
  for (int k = 0; k < OPTION_COUNT; k++)
    if (hak_option_get(option_names[k], &option_default[k]) != 0)
      fail("hak_option_get(%s) failed", option_names[k]);
  worker_start();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  input_t in = {.d = data, .n = size, .i = 0};
  seed_count = 0;
  filled = 0;
  restarts = 0;
  int ops = 0;
  while (in.i < in.n && ops < MAX_OPS) {
    uint8_t op = in8(&in) & 15;
    int cost = 1;
    switch (op) {
      case OP_MALLOC: op_malloc(&in); break;
      case OP_FREE: slot_free(in8(&in) % SLOTS); break;
      case OP_CALLOC: op_calloc(&in); break;
      case OP_REALLOC: cost = op_realloc(&in); break;
      case OP_ALIGNED: op_aligned(&in); break;
      case OP_USABLE: op_usable(&in); break;
      case OP_CHECK: slot_check("check", in8(&in) % SLOTS); break;
      case OP_REWRITE: op_rewrite(&in); break;
      case OP_REMOTE_FREE: op_remote_free(&in); break;
      case OP_REMOTE_ALLOC: op_remote_alloc(&in); break;
      case OP_REMOTE_REALLOC: op_remote_realloc(&in); break;
      case OP_SYNC: drain(); break;
      case OP_EDGE: op_edge(&in); break;
      case OP_BURST: cost = op_burst(&in); break;
      case OP_OPTION: op_option(&in); break;
      default:
        if (restarts < RESTARTS_MAX) {
          restarts++;
          worker_restart();
        }
        break;
    }
    ops += cost;
  }
  for (int i = 0; i < SLOTS; i++) slot_free(i);
  drain();
  if (atomic_load(&live_bytes) != 0) fail("%zu live bytes left after the input", atomic_load(&live_bytes));
  for (int k = 0; k < OPTION_COUNT; k++) {
    if (!option_changed[k]) continue;
    if (hak_option_set(option_names[k], option_default[k]) != 0) fail("restoring %s failed", option_names[k]);
    option_changed[k] = false;
  }
  return 0;
}
