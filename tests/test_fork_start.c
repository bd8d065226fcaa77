/* test_fork_start: a fork at the moment a program's first threads take
 * hakmem's locks for the first time, while another library's prepare
 * handler runs.  glibc's fork releases its list of handlers while it runs
 * each one, and skips handlers registered meanwhile: an allocator that
 * registered its own only once a second thread exists (to spare the libc
 * pages that pthread_atfork maps in) would let such a thread hold a lock
 * the fork does not take, and the child would wait on it forever.  Each
 * trial is a fresh process (this program run again), since the moment
 * comes once per process.  A trial's child that deadlocks is ended by its
 * alarm and fails the test. */
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
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("malloc");
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
