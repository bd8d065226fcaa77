/* Thread exit corners, linked with hakmem:
 * - a thread-specific-data destructor that runs after hakmem's own exit hook
 *   allocates, writes and frees (served by the global heap), and blocks it
 *   leaves are freed later by another thread;
 * - after fork, a thread the child creates (which may reuse the thread
 *   pointer of a parent thread that does not exist in the child) frees a
 *   block that the parent thread allocated, then both keep allocating. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static pthread_key_t late_key;
static void* volatile late_block;
static volatile int late_ok;

static void late_destructor(void* v) {
  /* Allocate in every size range, check, keep one block for main. */
  size_t sizes[] = {16, 200, 5000, 70000, 300000, 3u << 20};
  int ok = 1;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    unsigned char* p = malloc(sizes[i]);
    if (p == NULL) { ok = 0; continue; }
    memset(p, 0x5A, sizes[i]);
    if (p[sizes[i] - 1] != 0x5A) ok = 0;
    free(p);
  }
  char* keep = malloc(100);
  if (keep == NULL) ok = 0; else strcpy(keep, "left by a destructor");
  late_block = keep;
  late_ok = ok;
}

static void* with_late_destructor(void* arg) {
  /* The key is created after hakmem's (which exists since the first malloc),
   * so its destructor runs after hakmem abandoned this thread's heap. */
  free(malloc(10));
  pthread_setspecific(late_key, (void*)1);
  return NULL;
}

static void test_late_destructor(void) {
  REQUIRE(pthread_key_create(&late_key, late_destructor) == 0);
  for (int round = 0; round < 50; round++) {
    pthread_t t;
    late_ok = 0;
    late_block = NULL;
    pthread_create(&t, NULL, with_late_destructor, NULL);
    pthread_join(t, NULL);
    CHECK(late_ok);
    CHECK(late_block != NULL && strcmp((char*)late_block, "left by a destructor") == 0);
    free(late_block);
  }
}

/* ---- fork and thread-pointer reuse ---------------------------------------- */

static pthread_mutex_t hold = PTHREAD_MUTEX_INITIALIZER;
static void* parent_blocks[64];

static void* parent_thread(void* arg) {
  for (int i = 0; i < 64; i++) {
    parent_blocks[i] = malloc(3000);
    memset(parent_blocks[i], i, 3000);
  }
  pthread_mutex_lock(&hold); /* stays alive until the parent's forks are done */
  pthread_mutex_unlock(&hold);
  return NULL;
}

/* The first of the child's threads frees the parent thread's blocks. */
static void* child_thread(void* arg) {
  void* mine[64];
  for (int i = 0; i < 64; i++) mine[i] = malloc(3000);
  if (arg != NULL)
    for (int i = 0; i < 64; i++) free(parent_blocks[i]);
  for (int i = 0; i < 64; i++) {
    memset(mine[i], 0x77, 3000);
    free(mine[i]);
  }
  for (int i = 0; i < 10000; i++) free(malloc(3000 + (i % 7) * 16));
  return NULL;
}

static void test_fork_thread_reuse(void) {
  pthread_mutex_lock(&hold);
  pthread_t t;
  pthread_create(&t, NULL, parent_thread, NULL);
  while (__atomic_load_n(&parent_blocks[63], __ATOMIC_ACQUIRE) == NULL) usleep(1000);
  for (int round = 0; round < 5; round++) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      alarm(20);
      for (int k = 0; k < 4; k++) {
        pthread_t c;
        pthread_create(&c, NULL, child_thread, k == 0 ? &c : NULL);
        pthread_join(c, NULL);
      }
      /* The child's own heap must still be consistent. */
      void* p[1000];
      for (int i = 0; i < 1000; i++) p[i] = malloc(3000);
      for (int i = 0; i < 1000; i++) free(p[i]);
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  pthread_mutex_unlock(&hold);
  pthread_join(t, NULL);
  for (int i = 0; i < 64; i++) {
    unsigned char* b = parent_blocks[i];
    CHECK(b[0] == (unsigned char)i && b[2999] == (unsigned char)i);
    free(b);
  }
}

int main(void) {
  test_late_destructor();
  test_fork_thread_reuse();
  return hak_test_result("test_thread_exit");
}
