/* test_fork_start: when hakmem registers its fork handlers, and a fork at
 * the moment a program's first threads take hakmem's locks for the first
 * time, while another library's prepare handler runs.
 *
 * A process with one thread needs no handler, and pthread_atfork maps 64 KiB
 * of libc that such a program would not touch: hakmem registers them as the
 * first thread is made, from the calloc that glibc's pthread_create makes
 * before the thread exists.  Registered any later (as a second thread first
 * allocates), they would come too late: glibc's fork releases its list of
 * handlers while it runs each one, and skips handlers registered meanwhile,
 * so such a thread could hold a lock the fork does not take, and the child
 * would wait on it forever.  Each trial is a fresh process (this program
 * run again), since the moment comes once per process.  A trial's child
 * that deadlocks is ended by its alarm and fails the test. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "test_util.h"

enum { TRIALS = 30, CHILD_ALARM = 5 };

/* fork_probe.c, linked between libhakmem and libc. */
int fork_probe_hakmem_registrations(void);
int fork_probe_hakmem_first_at(void);

static atomic_int registrations_at_thread_start = -1;
static void* first_thread(void* arg) { /* allocates nothing */
  atomic_store(&registrations_at_thread_start, fork_probe_hakmem_registrations());
  return arg;
}

/* Before any thread: none (glibc 2.32 and later say whether a process has had
 * a second thread; hakmem registers at start where they do not).  The first
 * thread, which allocates nothing, starts with them registered, once. */
static void check_registration(void) {
  for (int i = 0; i < 64; i++) { /* both paths of malloc, calloc and free */
    void* volatile a = calloc(i + 1, 48);
    void* volatile b = malloc((size_t)i << 10);
    free(a);
    free(b);
  }
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  CHECK(fork_probe_hakmem_registrations() == 0);
#endif
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, first_thread, NULL) == 0);
  REQUIRE(pthread_join(t, NULL) == 0);
  CHECK(atomic_load(&registrations_at_thread_start) == 1);
  CHECK(fork_probe_hakmem_registrations() == 1);
}

/* A program's own fork handlers, registered before its first thread, that
 * allocate (a huge block, and large blocks that make pages): hakmem's go in
 * before them, so that their prepare handler runs before hakmem's takes its
 * locks and their parent and child handlers after hakmem's releases them. */
static void allocate_in_handler(void) {
  void* volatile huge = malloc(64u << 20);
  void* volatile large[64];
  for (int i = 0; i < 64; i++) large[i] = malloc(256 << 10);
  for (int i = 0; i < 64; i++) free(large[i]);
  free(huge);
}

static void* idle_thread(void* arg) { return arg; }

/* One fresh process: returns 0 if its child ended well. */
static int order_trial(void) {
  REQUIRE(pthread_atfork(allocate_in_handler, allocate_in_handler, allocate_in_handler) == 0);
  if (fork_probe_hakmem_first_at() != 0) return 3; /* not before the program's */
  pthread_t t;
  REQUIRE(pthread_create(&t, NULL, idle_thread, NULL) == 0);
  REQUIRE(pthread_join(t, NULL) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    alarm(CHILD_ALARM);
    allocate_in_handler();
    _exit(0);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return 1;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 2;
}

static atomic_int in_prepare, stop;

/* The other library's prepare handler: slow, so that the threads' first
 * locks fall within it. */
static void other_prepare(void) {
  atomic_store(&in_prepare, 1);
  usleep(20000);
}

/* Waits for the fork, then takes hakmem's locks (malloc_info takes the
 * heap pool's) without pause. */
static void* locker(void* arg) {
  FILE* out = arg;
  while (!atomic_load(&in_prepare) && !atomic_load(&stop)) sched_yield();
  while (!atomic_load(&stop)) malloc_info(0, out);
  return NULL;
}

static void* child_thread(void* arg) {
  (void)arg;
  void* volatile p = malloc(100);
  free(p);
  return NULL;
}

/* One trial: returns 0 if the child ended well. */
static int trial(void) {
  for (int i = 0; i < 8; i++) { /* the program has allocated before: its later calloc stays on the fast path */
    void* volatile v = calloc(18, 16);
    free(v);
  }
  FILE* out[2];
  for (int i = 0; i < 2; i++) REQUIRE((out[i] = fopen("/dev/null", "w")) != NULL);
  REQUIRE(pthread_atfork(other_prepare, NULL, NULL) == 0);
  pthread_t t[2];
  for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&t[i], NULL, locker, out[i]) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    alarm(CHILD_ALARM);
    pthread_t c;
    if (pthread_create(&c, NULL, child_thread, NULL) != 0) _exit(2);
    pthread_join(c, NULL);
    malloc_info(0, out[0]);
    _exit(0);
  }
  int st = 0;
  pid_t w = waitpid(pid, &st, 0);
  atomic_store(&stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  if (w != pid) return 1;
  if (WIFSIGNALED(st)) {
    fprintf(stderr, "child killed by signal %d%s\n", WTERMSIG(st),
            WTERMSIG(st) == SIGALRM ? " (a lock held across fork)" : "");
    return 1;
  }
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--trial") == 0) return trial();
  if (argc > 1 && strcmp(argv[1], "--order") == 0) return order_trial();
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("malloc");
  check_registration();
  {
    char out[4096];
    int rc = hak_run_self("--order", NULL, out, sizeof out);
    if (rc != 0) fprintf(stderr, "order trial: exit %d %s", rc, out);
    CHECK(rc == 0);
  }
  int failed = 0;
  for (int i = 0; i < TRIALS; i++) {
    char out[4096];
    if (hak_run_self("--trial", NULL, out, sizeof out) != 0) {
      fprintf(stderr, "trial %d: %s", i, out);
      failed++;
    }
  }
  if (failed) fprintf(stderr, "%d of %d trials failed\n", failed, TRIALS);
  CHECK(failed == 0);
  return hak_test_result("test_fork_start");
}
