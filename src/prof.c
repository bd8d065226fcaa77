/* The sampling heap profiler (HAKMEM_PROF), in the profiling library
 * (libhakmem-prof.so, HAK_PROF): the other libraries have none of its
 * fast-path countdown, and refuse the option.
 *
 * Each thread's heap counts down the bytes it hands out (heap->prof_left, one
 * subtraction on the malloc fast path); the allocation that takes it below
 * zero reaches hak_alloc_slow, which samples it here.  The gaps between
 * samples are drawn from an exponential distribution of mean HAKMEM_PROF_RATE
 * bytes, so every byte is sampled with the same probability and a block of s
 * bytes with 1 - exp(-s / rate): the profile's readers divide by that to
 * estimate the whole heap (as pprof does with gperftools' heap profiles).
 * While profiling is off the countdown still runs, over 16 MiB gaps, so that
 * hak_option_set("PROF", 1) takes effect in every thread soon after.
 *
 * A sampled block of a size class is handed out 16 bytes inside a block 16
 * bytes larger: its free then fails the fast path's block-start test and
 * reaches hak_free_slow, which forgets the sample.  A sampled large block's
 * page gets a div_magic of 0 instead, which fails the same test, and a huge
 * block's free always takes the slow path.  So frees cost nothing more for
 * the blocks that are not sampled.  Aligned requests (above 16 bytes) are
 * not sampled: their address must stay aligned.
 *
 * The live samples and their call stacks sit in tables of memory mapped
 * here, never in blocks of the heap.  The profile is written at exit, on
 * HAKMEM_PROF_SIGNAL, or by hak_prof_write, in the text format of
 * gperftools' heap profiles (heap_v2), which pprof and `hakmem prof` read. */
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define PROF_PAD 16
#define PROF_MAX_FRAMES 64
#define PROF_OFF_INTERVAL ((int64_t)16 << 20)
#define PROF_MAX_INTERVAL ((int64_t)1 << 40)
#define PROF_STACK_BUCKETS 4096
#define PROF_CHUNK ((size_t)256 << 10)

HAK_BSS_LAST char hak_prof_path[256];

typedef struct prof_stack_s {
  struct prof_stack_s* next; /* in its hash chain */
  uint64_t hash;
  size_t live_count, live_bytes;   /* samples live now, and their requested bytes */
  size_t alloc_count, alloc_bytes; /* every sample taken here */
  uint32_t depth;
  void* frames[];
} prof_stack_t;

typedef struct prof_sample_s {
  struct prof_sample_s* next; /* in its hash chain, or the free list */
  const void* p;
  size_t size;
  prof_stack_t* stack;
} prof_sample_t;

/* Everything below is guarded by prof_lock, a spin lock so that the signal
 * handler can try it. */
static atomic_flag prof_lock = ATOMIC_FLAG_INIT;
static _Atomic int dump_pending; /* a signal came while the lock was held */
static uint8_t* chunk_next;      /* bump allocation of stacks and samples */
static uint8_t* chunk_end;
HAK_BSS_LAST prof_stack_t* hak_prof_stack_buckets[PROF_STACK_BUCKETS];
static prof_sample_t** sample_buckets;
static size_t sample_bucket_count; /* a power of two */
static prof_sample_t* sample_free;
static size_t samples_taken; /* by this process, ever */
static int signal_installed; /* the signal whose handler is ours (0: none) */
/* Live samples: read without the lock by hak_free_slow, to skip the lookup
 * while there are none. */
_Atomic size_t hak_prof_live;

/* Set while this thread records a sample (the unwinder allocates when it
 * first runs) or makes an aligned block: no sample is taken meanwhile. */
__thread bool hak_prof_busy __attribute__((tls_model("initial-exec")));

static bool prof_write_now(const char* path);

void hak_prof_lock(void) {
  while (atomic_flag_test_and_set_explicit(&prof_lock, memory_order_acquire)) sched_yield();
}

/* Writes the profile a signal asked for, if the lock is free; else its
 * holder does, on unlocking. */
static void write_pending(void) {
  if (atomic_flag_test_and_set_explicit(&prof_lock, memory_order_acquire)) return;
  if (atomic_exchange_explicit(&dump_pending, 0, memory_order_relaxed)) (void)prof_write_now(NULL);
  atomic_flag_clear_explicit(&prof_lock, memory_order_release);
}

void hak_prof_unlock(void) {
  atomic_flag_clear_explicit(&prof_lock, memory_order_release);
  if (unlikely(atomic_load_explicit(&dump_pending, memory_order_relaxed))) write_pending();
}

/* ---- the gaps between samples ------------------------------------------- */

/* ln(u) for u in (0, 1], without libm: u = m * 2^e with m in [0.5, 1), and
 * ln(m) = 2 atanh((m - 1) / (m + 1)), whose series converges fast there. */
static double prof_ln(double u) {
  int e = 0;
  while (u < 0.5) {
    u *= 2;
    e--;
  }
  double z = (u - 1) / (u + 1), z2 = z * z;
  double s = z * (1 + z2 * (1.0 / 3 + z2 * (1.0 / 5 + z2 * (1.0 / 7 + z2 * (1.0 / 9 + z2 / 11)))));
  return 2 * s + e * 0.6931471805599453;
}

static uint64_t prof_random(hak_heap_t* heap) {
  if (heap->prof_rng == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    heap->prof_rng = (uint64_t)(uintptr_t)heap ^ ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec;
  }
  uint64_t z = (heap->prof_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Re-arms a heap's countdown: an exponential gap of mean rate while
 * profiling, else the long gap that only looks at the option again. */
void hak_prof_arm(hak_heap_t* heap) {
  if (HAK_POLICY(prof) == HAK_PROF_OFF) {
    heap->prof_left = PROF_OFF_INTERVAL;
    return;
  }
  double u = (double)((prof_random(heap) >> 11) + 1) * (1.0 / 9007199254740992.0); /* (0, 1] */
  double gap = -prof_ln(u) * (double)HAK_POLICY(prof_rate);
  heap->prof_left = gap >= (double)PROF_MAX_INTERVAL ? PROF_MAX_INTERVAL : (int64_t)gap;
}

/* ---- the tables ------------------------------------------------------------ */

static void* prof_carve(size_t size) {
  size = (size + 15) & ~(size_t)15;
  if (chunk_next == NULL || (size_t)(chunk_end - chunk_next) < size) {
    uint8_t* chunk = hak_os_map(PROF_CHUNK);
    if (chunk == NULL) return NULL;
    chunk_next = chunk;
    chunk_end = chunk + PROF_CHUNK;
  }
  void* p = chunk_next;
  chunk_next += size;
  return p;
}

static uint64_t prof_mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  return h ^ (h >> 33);
}

static prof_stack_t* stack_find(void* const* frames, uint32_t depth) {
  uint64_t hash = depth;
  for (uint32_t i = 0; i < depth; i++) hash = prof_mix(hash ^ (uint64_t)(uintptr_t)frames[i]);
  prof_stack_t** bucket = &hak_prof_stack_buckets[hash & (PROF_STACK_BUCKETS - 1)];
  for (prof_stack_t* s = *bucket; s != NULL; s = s->next)
    if (s->hash == hash && s->depth == depth && memcmp(s->frames, frames, depth * sizeof(void*)) == 0)
      return s;
  prof_stack_t* s = prof_carve(sizeof(prof_stack_t) + depth * sizeof(void*));
  if (s == NULL) return NULL;
  memset(s, 0, sizeof *s);
  s->hash = hash;
  s->depth = depth;
  memcpy(s->frames, frames, depth * sizeof(void*));
  s->next = *bucket;
  *bucket = s;
  return s;
}

static size_t sample_bucket(const void* p) {
  return (size_t)prof_mix((uint64_t)(uintptr_t)p) & (sample_bucket_count - 1);
}

/* Doubles the sample table once it holds two samples a bucket. */
static void samples_grow(void) {
  size_t count = sample_bucket_count ? sample_bucket_count * 2 : 4096;
  prof_sample_t** buckets = hak_os_map(count * sizeof(void*));
  if (buckets == NULL) return; /* the chains just grow longer */
  prof_sample_t** old = sample_buckets;
  size_t old_count = sample_bucket_count;
  sample_buckets = buckets;
  sample_bucket_count = count;
  for (size_t i = 0; i < old_count; i++) {
    for (prof_sample_t* s = old[i]; s != NULL;) {
      prof_sample_t* next = s->next;
      size_t b = sample_bucket(s->p);
      s->next = buckets[b];
      buckets[b] = s;
      s = next;
    }
  }
  if (old != NULL) hak_os_unmap(old, old_count * sizeof(void*));
}

static void sample_add(const void* p, size_t size, prof_stack_t* stack) {
  size_t live = atomic_load_explicit(&hak_prof_live, memory_order_relaxed);
  if (live >= 2 * sample_bucket_count) samples_grow();
  if (sample_buckets == NULL) return;
  prof_sample_t* s = sample_free;
  if (s != NULL)
    sample_free = s->next;
  else if ((s = prof_carve(sizeof *s)) == NULL)
    return;
  s->p = p;
  s->size = size;
  s->stack = stack;
  size_t b = sample_bucket(p);
  s->next = sample_buckets[b];
  sample_buckets[b] = s;
  stack->live_count++;
  stack->live_bytes += size;
  stack->alloc_count++;
  stack->alloc_bytes += size;
  samples_taken++;
  atomic_store_explicit(&hak_prof_live, live + 1, memory_order_relaxed);
}

/* Removes p's sample; false if p was not sampled. */
static bool sample_remove(const void* p, prof_stack_t** stack, size_t* size) {
  if (sample_buckets == NULL) return false;
  for (prof_sample_t** link = &sample_buckets[sample_bucket(p)]; *link != NULL; link = &(*link)->next) {
    prof_sample_t* s = *link;
    if (s->p != p) continue;
    *link = s->next;
    s->stack->live_count--;
    s->stack->live_bytes -= s->size;
    *stack = s->stack;
    *size = s->size;
    s->next = sample_free;
    sample_free = s;
    atomic_fetch_sub_explicit(&hak_prof_live, 1, memory_order_relaxed);
    return true;
  }
  return false;
}

/* ---- sampling -------------------------------------------------------------- */

static void prof_signal_handler(int sig) {
  (void)sig;
  int saved = errno;
  atomic_store_explicit(&dump_pending, 1, memory_order_relaxed);
  write_pending();
  errno = saved;
}

/* HAKMEM_PROF_SIGNAL's handler, for the signal set now (under the lock).
 * The one set before, if another, goes back to its default action. */
static void install_signal(void) {
  int sig = HAK_POLICY(prof_signal);
  if (sig == signal_installed) return;
  if (signal_installed > 0) signal(signal_installed, SIG_DFL);
  signal_installed = sig;
  if (sig <= 0) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = prof_signal_handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, NULL);
}

/* The handler as soon as profiling is on (at start, and when
 * hak_option_set turns it on or changes the signal), not at the first
 * sample: before it, the signal would end the program (a review found it). */
void hak_prof_signal_update(void) {
  if (HAK_POLICY(prof) == HAK_PROF_OFF) return;
  hak_prof_lock();
  install_signal();
  hak_prof_unlock();
}

/* The stack unwinder: libunwind's unw_backtrace where the system has it
 * (about 20 ns a frame, against 0.5 µs for glibc's backtrace, which walks
 * libgcc's unwind tables anew each time), else glibc's.  Looked up once,
 * with dlopen, so that hakmem needs neither at link time, and used once
 * there (either loads what it needs on first use): when profiling is asked
 * for at start (hakmem's constructor) or turned on (hak_option_set), not
 * inside a malloc, where a dlopen could wait for the loader's lock held by a
 * thread that waits for this one. */
typedef int (*prof_unwind_fn)(void** frames, int max);
static prof_unwind_fn prof_unwind = backtrace;
static pthread_once_t unwind_once = PTHREAD_ONCE_INIT;

static void unwind_choose(void) {
  bool busy = hak_prof_busy;
  hak_prof_busy = true;
  void* lib = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
  void* fn = lib != NULL ? dlsym(lib, "unw_backtrace") : NULL;
  if (fn != NULL) prof_unwind = (prof_unwind_fn)fn;
  void* frames[4];
  (void)prof_unwind(frames, 4);
  hak_prof_busy = busy;
}

void hak_prof_prepare(void) { pthread_once(&unwind_once, unwind_choose); }

/* Records block p of size bytes with the call stack that made it. */
static HAK_NOINLINE void prof_record(const void* p, size_t size) {
  hak_prof_busy = true; /* the unwinder's own allocations are not sampled */
  hak_prof_prepare();    /* done already, but for a sample before the constructor */
  void* frames[PROF_MAX_FRAMES];
  int depth = prof_unwind(frames, PROF_MAX_FRAMES);
  if (depth > 1) {
    hak_prof_lock();
    install_signal(); /* (a sample before the constructor) */
    prof_stack_t* stack = stack_find(frames + 1, (uint32_t)(depth - 1)); /* without this function */
    if (stack != NULL) sample_add(p, size, stack);
    hak_prof_unlock();
  }
  hak_prof_busy = false;
}

static bool prof_sampling(void) { return HAK_POLICY(prof) != HAK_PROF_OFF && !hak_prof_busy; }

/* The allocation that ran a heap's countdown out: re-arms it, and while
 * profiling samples the block (padded, see above).  size: as the fast path
 * saw it (the secure build's canary included). */
void* hak_prof_alloc(hak_heap_t* heap, size_t size) {
  hak_prof_arm(heap);
  if (!prof_sampling() || size > HAK_SIZE_LIMIT) return hak_heap_alloc(heap, size);
  if (size > HAK_CLASS_MAX_SIZE) {
    /* A large block keeps its address (realloc grows it in place): its
     * page's div_magic of 0 sends its free to the slow path, as a huge
     * block's always goes.  (A padded class block of the largest sizes
     * becomes a large block, its free found by its inner address.) */
    void* h = hak_heap_alloc(heap, size);
    if (h == NULL) return NULL;
    if (size <= HAK_LARGE_MAX) hak_page_mark_sampled(h);
    prof_record(h, size - HAK_CANARY_SIZE);
    return h;
  }
  uint8_t* b = hak_heap_alloc(heap, size + PROF_PAD);
  if (b == NULL) return NULL;
  hak_page_mark_inner(b + PROF_PAD);
  prof_record(b + PROF_PAD, size - HAK_CANARY_SIZE);
  return b + PROF_PAD;
}

/* A huge block made without the fast path (calloc's): counted down, and
 * sampled when due. */
void hak_prof_huge(void* p, size_t size) {
  hak_heap_t* heap = hak_tls_heap;
  if (heap->kind < HAK_HEAP_THREAD || !hak_prof_due(heap, size)) return;
  hak_prof_arm(heap);
  if (prof_sampling()) prof_record(p, size);
}

/* A block freed or moved by realloc: forget its sample, if it has one. */
void hak_prof_forget(const void* p) {
  prof_stack_t* stack;
  size_t size;
  hak_prof_lock();
  sample_remove(p, &stack, &size);
  hak_prof_unlock();
}

/* A huge block moved by realloc keeps its sample, at its new size. */
void hak_prof_moved(const void* from, const void* to, size_t size) {
  prof_stack_t* stack;
  size_t old_size;
  hak_prof_lock();
  if (sample_remove(from, &stack, &old_size)) {
    stack->alloc_count--;
    stack->alloc_bytes -= old_size;
    sample_add(to, size, stack);
  }
  hak_prof_unlock();
}

/* ---- the profile ------------------------------------------------------------- */

/* A buffered writer that needs nothing but write(2): it runs in a signal
 * handler and at exit. */
typedef struct prof_out_s {
  int fd;
  int err; /* the first write's failure (0: none) */
  size_t len;
  char buf[4096];
} prof_out_t;

static void out_flush(prof_out_t* o) {
  size_t done = 0;
  while (done < o->len) {
    ssize_t n = write(o->fd, o->buf + done, o->len - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (o->err == 0) o->err = n < 0 ? errno : EIO;
      break;
    }
    done += (size_t)n;
  }
  o->len = 0;
}

static void out_bytes(prof_out_t* o, const char* s, size_t n) {
  while (n > 0) {
    if (o->len == sizeof o->buf) out_flush(o);
    size_t k = sizeof o->buf - o->len;
    if (k > n) k = n;
    memcpy(o->buf + o->len, s, k);
    o->len += k;
    s += k;
    n -= k;
  }
}

static void out_str(prof_out_t* o, const char* s) { out_bytes(o, s, strlen(s)); }

/* v's digits in base, at the end of tmp; returns where they start. */
static size_t num_digits(uint64_t v, unsigned base, char tmp[24]) {
  size_t i = 24;
  do {
    tmp[--i] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v != 0);
  return i;
}

static void out_num(prof_out_t* o, uint64_t v, unsigned base) {
  char tmp[24];
  size_t i = num_digits(v, base, tmp);
  out_bytes(o, tmp + i, 24 - i);
}

/* "live_count: live_bytes [alloc_count: alloc_bytes]" */
static void out_counts(prof_out_t* o, size_t lc, size_t lb, size_t ac, size_t ab) {
  out_num(o, lc, 10);
  out_str(o, ": ");
  out_num(o, lb, 10);
  out_str(o, " [");
  out_num(o, ac, 10);
  out_str(o, ": ");
  out_num(o, ab, 10);
  out_str(o, "]");
}

/* The path of a profile: template with each "%p" replaced by the process
 * id (so that the processes of a program each write their own). */
static void expand_path(const char* template, char* out, size_t cap) {
  char pid[24];
  size_t first = num_digits((uint64_t)getpid(), 10, pid);
  size_t n = 0;
  for (const char* t = template; *t != '\0' && n + 1 < cap; t++) {
    if (t[0] == '%' && t[1] == 'p') {
      for (size_t d = first; d < sizeof pid && n + 1 < cap; d++) out[n++] = pid[d];
      t++;
    } else {
      out[n++] = *t;
    }
  }
  out[n] = '\0';
}

/* Writes the profile into path (NULL: HAKMEM_PROF's file, else
 * hakmem.PID.heap).  Called with prof_lock held. */
static bool prof_write_now(const char* path) {
  char name[256];
  if (path == NULL) {
    bool file = HAK_POLICY(prof) == HAK_PROF_FILE && hak_prof_path[0] != '\0';
    expand_path(file ? hak_prof_path : "hakmem.%p.heap", name, sizeof name);
    path = name;
  }
  prof_out_t o;
  o.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  o.err = 0;
  o.len = 0;
  if (o.fd < 0) return false;
  size_t lc = 0, lb = 0, ac = 0, ab = 0;
  for (size_t i = 0; i < PROF_STACK_BUCKETS; i++)
    for (prof_stack_t* s = hak_prof_stack_buckets[i]; s != NULL; s = s->next) {
      lc += s->live_count;
      lb += s->live_bytes;
      ac += s->alloc_count;
      ab += s->alloc_bytes;
    }
  out_str(&o, "heap profile: ");
  out_counts(&o, lc, lb, ac, ab);
  out_str(&o, " @ heap_v2/");
  out_num(&o, (uint64_t)HAK_POLICY(prof_rate), 10);
  out_str(&o, "\n");
  for (size_t i = 0; i < PROF_STACK_BUCKETS; i++)
    for (prof_stack_t* s = hak_prof_stack_buckets[i]; s != NULL; s = s->next) {
      out_counts(&o, s->live_count, s->live_bytes, s->alloc_count, s->alloc_bytes);
      out_str(&o, " @");
      for (uint32_t f = 0; f < s->depth; f++) {
        out_str(&o, " 0x");
        out_num(&o, (uint64_t)(uintptr_t)s->frames[f], 16);
      }
      out_str(&o, "\n");
    }
  out_str(&o, "\nMAPPED_LIBRARIES:\n");
  int maps = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (maps >= 0) {
    out_flush(&o);
    ssize_t n;
    while ((n = read(maps, o.buf, sizeof o.buf)) > 0 || (n < 0 && errno == EINTR)) {
      if (n < 0) continue;
      o.len = (size_t)n;
      out_flush(&o);
    }
    close(maps);
  }
  out_flush(&o);
  int err = o.err; /* (a full disk: the profile is cut short) */
  if (close(o.fd) != 0 && err == 0) err = errno;
  errno = err;
  return err == 0;
}

HAK_API int hak_prof_write(const char* path) {
  hak_process_init();
  if (path != NULL && path[0] == '\0') return EINVAL;
  hak_prof_lock();
  bool ok = prof_write_now(path);
  int err = errno;
  hak_prof_unlock();
  return ok ? 0 : err;
}

/* At exit, while profiling: a process that sampled nothing writes nothing
 * (a shell that runs the program under study must not overwrite the
 * program's profile). */
void hak_prof_at_exit(void) {
  if (HAK_POLICY(prof) == HAK_PROF_OFF) return;
  hak_prof_lock();
  if (samples_taken > 0) (void)prof_write_now(NULL);
  hak_prof_unlock();
}
