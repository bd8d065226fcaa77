/* test_fork_locks: each of hakmem's locks held by another thread at the
 * moment of fork.  The fork handlers must make fork wait for it, so that the
 * child finds it free; a lock they leave out stays held in the child by a
 * thread that is not there, and the child's first use of it waits forever
 * (an alarm ends such a child and fails the test).  Unlike test_fork and
 * test_fork_start, which fork at random moments, this takes each lock
 * itself (internal functions), so a missing handler fails every run.
 * Linked with hakmem_api (the hak_* API beside glibc) and src/internal.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "internal.h"

enum { CHILD_ALARM = 10, HOLD_MS = 100 };

typedef struct lock_s {
  const char* name;
  void (*lock)(void);
  void (*unlock)(void);
} lock_t;

static const lock_t locks[] = {
    {"policy", hak_policy_lock, hak_policy_unlock},
    {"heaps", hak_heaps_lock, hak_heaps_unlock},
    {"segments", hak_segments_lock, hak_segments_unlock},
    {"huge", hak_huge_lock, hak_huge_unlock},
    {"stats", hak_stats_lock, hak_stats_unlock},
};

static atomic_int held;

static void* holder(void* arg) {
  const lock_t* l = arg;
  l->lock();
  atomic_store(&held, 1);
  struct timespec ts = {0, HOLD_MS * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
  l->unlock();
  return NULL;
}

static void* child_thread(void* arg) {
  void* p = hak_malloc(1000); /* a heap of its own */
  hak_free(p);
  return arg;
}

/* Whatever takes one of the locks: a new thread's heap, a new segment, a
 * huge block, a policy change, the statistics, a trim. */
static int child_work(void) {
  pthread_t th;
  if (pthread_create(&th, NULL, child_thread, NULL) != 0 || pthread_join(th, NULL) != 0) return 2;
  enum { N = 40 };
  void* b[N];
  for (int i = 0; i < N; i++) /* 40 MiB: new segments */
    if ((b[i] = hak_malloc(1 << 20)) == NULL) return 3;
  for (int i = 0; i < N; i++) hak_free(b[i]);
  void* huge = hak_malloc(64u << 20);
  if (huge == NULL) return 4;
  hak_free(huge);
  if (hak_option_set("PURGE_DELAY_MS", 50) != 0) return 5;
  hak_stats_reset();
  hak_stats_t st;
  hak_stats_get(&st);
  hak_trim();
  return 0;
}

static void fork_while_held(const lock_t* l) {
  atomic_store(&held, 0);
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, holder, (void*)l) == 0);
  while (!atomic_load(&held)) sched_yield();
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    alarm(CHILD_ALARM);
    _exit(child_work());
  }
  int st = 0;
  pid_t w;
  do {
    w = waitpid(pid, &st, 0);
  } while (w < 0 && errno == EINTR);
  REQUIRE(w == pid);
  if (WIFSIGNALED(st)) {
    fprintf(stderr, "check failed: the %s lock held at fork: child killed by signal %d%s\n", l->name, WTERMSIG(st),
            WTERMSIG(st) == SIGALRM ? " (stuck on it)" : "");
    hak_test_failures++;
  } else if (WEXITSTATUS(st) != 0) {
    fprintf(stderr, "check failed: the %s lock held at fork: child exited with status %d\n", l->name,
            WEXITSTATUS(st));
    hak_test_failures++;
  }
  pthread_join(th, NULL);
}

int main(void) {
  hak_free(hak_malloc(1)); /* start-up: the fork handlers are registered */
  for (size_t i = 0; i < sizeof locks / sizeof locks[0]; i++) fork_while_held(&locks[i]);
  return hak_test_result("test_fork_locks");
}
