/* test_fork: the main thread forks repeatedly while worker threads allocate
 * and free continuously (and hand blocks to each other).  Each child
 * allocates, reallocates and frees blocks of every size, frees blocks that
 * the parent's threads allocated before the fork, starts a thread of its own,
 * sometimes forks again, and _exit(0)s.  The first fork comes before any
 * thread exists; the last phase keeps the huge-block lock busy.  A deadlock
 * in a child (a lock held across fork) is caught by an alarm in the child
 * and a watchdog in the parent, so it fails the test instead of hanging it. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "test_util.h"

enum { WORKERS = 4, FORKS = 20, XS = 64, CHILD_ALARM = 20, PARENT_ALARM = 120 };

static atomic_int stop;
static atomic_long worker_failures;
static atomic_long worker_ops;
static _Atomic(uintptr_t) xs[XS]; /* blocks handed between threads */

/* Blocks carry their size in the first 8 bytes. */
static unsigned char* make(size_t n) {
  if (n < 16) n = 16;
  unsigned char* p = malloc(n);
  if (!p) return NULL;
  memcpy(p, &n, sizeof n);
  hak_pattern_fill(p + 8, n - 8, (uintptr_t)p);
  return p;
}

static int ok_block(const unsigned char* p) {
  size_t n;
  memcpy(&n, p, sizeof n);
  return n >= 16 && hak_pattern_check(p + 8, n - 8, (uintptr_t)p) == n - 8;
}

static void* worker(void* arg) {
  hak_rng r;
  hak_rng_seed(&r, (uint64_t)(intptr_t)arg);
  unsigned char* local[64] = {0};
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    for (int k = 0; k < 256; k++) {
      int i = (int)(hak_rng_next(&r) % 64);
      if (local[i]) {
        if (!ok_block(local[i])) atomic_fetch_add(&worker_failures, 1);
        if (hak_rng_next(&r) & 1) {
          uintptr_t got = atomic_exchange(&xs[hak_rng_next(&r) % XS], (uintptr_t)local[i]);
          local[i] = (unsigned char*)got;
        } else {
          free(local[i]);
          local[i] = NULL;
        }
      } else {
        unsigned u = (unsigned)(hak_rng_next(&r) % 100);
        size_t n = u < 90   ? hak_rng_range(&r, 16, 512)
                   : u < 99 ? hak_rng_range(&r, 513, 16384)
                            : hak_rng_range(&r, 16385, 1 << 20);
        local[i] = make(n);
        if (!local[i]) atomic_fetch_add(&worker_failures, 1);
      }
    }
    atomic_fetch_add(&worker_ops, 256);
  }
  for (int i = 0; i < 64; i++) free(local[i]);
  return NULL;
}

/* What a child does; returns the exit status. */
static void* child_thread(void* arg) {
  (void)arg;
  int bad = 0;
  for (int i = 0; i < 2000; i++) {
    unsigned char* p = make((size_t)(i * 37 % 4000) + 16);
    if (!p || !ok_block(p)) bad++;
    free(p);
  }
  return (void*)(intptr_t)bad;
}

static int child_work(int depth) {
  int bad = 0;
  /* Blocks allocated by the parent's threads before the fork. */
  for (int s = 0; s < XS; s++) {
    unsigned char* p = (unsigned char*)atomic_exchange(&xs[s], 0);
    if (p) {
      if (!ok_block(p)) bad |= 1;
      free(p);
    }
  }
  /* Small and large, malloc, calloc, realloc. */
  unsigned char* keep[200];
  for (int i = 0; i < 200; i++) {
    size_t n = (size_t)(i % 40 == 39 ? (i + 1) * 10000 : i * 13 + 16);
    keep[i] = make(n);
    if (!keep[i]) bad |= 2;
  }
  for (int i = 0; i < 200; i += 2) {
    if (keep[i] && !ok_block(keep[i])) bad |= 4;
    free(keep[i]);
    keep[i] = NULL;
  }
  static const size_t csz[] = {1, 100, 4096, 100000, 5 << 20};
  for (size_t i = 0; i < sizeof(csz) / sizeof(csz[0]); i++) {
    unsigned char* c = calloc(1, csz[i]);
    if (!c || !hak_all_bytes(c, csz[i], 0)) bad |= 8;
    unsigned char* g = c ? realloc(c, csz[i] * 3 + 7) : NULL;
    if (!g || !hak_all_bytes(g, csz[i], 0)) bad |= 16;
    free(g ? g : c);
  }
  unsigned char* p = NULL;
  for (size_t n = 16; n <= (8u << 20); n *= 4) {
    unsigned char* q = realloc(p, n);
    if (!q) {
      bad |= 32;
      break;
    }
    memset(q + n / 4, 0x3C, n - n / 4);
    if (p != NULL && !hak_all_bytes(q + n / 16, n / 4 - n / 16, 0x3C)) bad |= 64;
    p = q;
  }
  free(p);
  void* a = NULL;
  if (posix_memalign(&a, 4096, 10000) != 0 || !hak_is_aligned(a, 4096)) bad |= 128;
  free(a);
  /* A thread of the child's own. */
  pthread_t t;
  if (pthread_create(&t, NULL, child_thread, NULL) != 0) {
    bad |= 256;
  } else {
    void* res = NULL;
    pthread_join(t, &res);
    if (res) bad |= 512;
  }
  if (depth == 0) {
    /* A grandchild, forked from a child that has a thread history. */
    pid_t g = fork();
    if (g == 0) {
      alarm(CHILD_ALARM);
      _exit(child_work(1));
    }
    int st = 0;
    if (g < 0 || waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st) != 0) bad |= 1024;
  }
  for (int i = 1; i < 200; i += 2) {
    if (keep[i] && !ok_block(keep[i])) bad |= 4;
    free(keep[i]);
  }
  return bad ? 1 + (bad & 0x7f) : 0;
}

static volatile pid_t current_child;

/* Waits for child number f (-1: the single-threaded fork); a failure counts. */
static void wait_child(pid_t pid, int f) {
  current_child = pid;
  int st = 0;
  pid_t w;
  do {
    w = waitpid(pid, &st, 0);
  } while (w < 0 && errno == EINTR);
  if (w != pid) {
    fprintf(stderr, "check failed: waitpid: %s\n", strerror(errno));
    hak_test_failures++;
  } else if (WIFSIGNALED(st)) {
    fprintf(stderr, "check failed: child %d killed by signal %d%s\n", f, WTERMSIG(st),
            WTERMSIG(st) == SIGALRM ? " (stuck: deadlock after fork?)" : "");
    hak_test_failures++;
  } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "check failed: child %d exited with status %d\n", f, WEXITSTATUS(st));
    hak_test_failures++;
  }
}

/* Forks child number f, which runs work(arg) under an alarm and exits with
 * its result, and waits for it.  Returns false if fork failed. */
static bool fork_and_wait(int f, int (*work)(int), int arg) {
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "fork failed: %s\n", strerror(errno));
    hak_test_failures++;
    return false;
  }
  if (pid == 0) {
    signal(SIGALRM, SIG_DFL);
    alarm(CHILD_ALARM);
    _exit(work(arg));
  }
  wait_child(pid, f);
  return true;
}

static void on_watchdog(int sig) {
  (void)sig;
  static const char msg[] = "test_fork: watchdog expired: a child or the parent is stuck\n";
  if (write(2, msg, sizeof msg - 1) < 0) {
  }
  /* Grandchildren end through their own alarm. */
  if (current_child > 0) kill(current_child, SIGKILL);
  _exit(1);
}

/* Phase two: threads that do nothing but take huge blocks and give them
 * back, so that one of them holds the huge-block lock much of the time, and
 * children that need that lock at once.  Without fork handlers a child
 * inherits the lock held and waits forever. */
enum { HUGE_FORKS = 60 };

static void* huge_worker(void* arg) {
  hak_rng r;
  hak_rng_seed(&r, (uint64_t)(intptr_t)arg);
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    size_t n = hak_rng_range(&r, (1u << 20) + 1, 6u << 20);
    unsigned char* p = malloc(n);
    if (!p) {
      atomic_fetch_add(&worker_failures, 1);
      continue;
    }
    p[0] = 1;
    p[n - 1] = 2;
    free(p);
    atomic_fetch_add(&worker_ops, 1);
  }
  return NULL;
}

static int huge_child(int unused) {
  (void)unused;
  for (size_t n = (1u << 20) + 1; n < (8u << 20); n += 3u << 19) {
    unsigned char* p = malloc(n);
    if (!p) return 1;
    memset(p, 0x5A, n);
    free(p);
  }
  return 0;
}

static void huge_phase(void) {
  atomic_store(&stop, 0);
  pthread_t th[2];
  for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&th[i], NULL, huge_worker, (void*)(intptr_t)(i + 100)) == 0);
  for (int f = 0; f < HUGE_FORKS; f++) {
    long before = atomic_load(&worker_ops);
    while (atomic_load(&worker_ops) < before + 8) sched_yield();
    if (!fork_and_wait(FORKS + f, huge_child, 0)) break;
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
}

int main(void) {
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("malloc");
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("free");
  signal(SIGALRM, on_watchdog);
  alarm(PARENT_ALARM);

  /* A fork while the process has one thread.  The child frees blocks of
   * every kind its parent allocated, starts its first thread and forks a
   * grandchild. */
  for (int s = 0; s < XS; s++) {
    size_t n = s % 8 == 7 ? (size_t)(s + 1) << 14 : (size_t)s * 61 + 16;
    unsigned char* p = make(n);
    REQUIRE(p != NULL);
    atomic_store(&xs[s], (uintptr_t)p);
  }
  REQUIRE(fork_and_wait(-1, child_work, 0));

  pthread_t th[WORKERS];
  for (int i = 0; i < WORKERS; i++)
    REQUIRE(pthread_create(&th[i], NULL, worker, (void*)(intptr_t)(i + 1)) == 0);

  for (int f = 0; f < FORKS; f++) {
    /* Let the workers run a little between forks (no timing is asserted). */
    long before = atomic_load(&worker_ops);
    while (atomic_load(&worker_ops) < before + 2048) sched_yield();
    if (!fork_and_wait(f, child_work, f % 4 == 0 ? 0 : 1)) break;
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < WORKERS; i++) pthread_join(th[i], NULL);
  huge_phase();
  alarm(0);
  for (int s = 0; s < XS; s++) {
    unsigned char* p = (unsigned char*)atomic_exchange(&xs[s], 0);
    if (p) {
      CHECK(ok_block(p));
      free(p);
    }
  }
  if (atomic_load(&worker_failures)) {
    fprintf(stderr, "check failed: %ld failures in the parent's workers\n",
            atomic_load(&worker_failures));
    hak_test_failures++;
  }
  return hak_test_result("test_fork");
}
