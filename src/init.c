/* Process and thread life: one-time start-up (no allocation, so it is safe
 * from any first malloc, even inside the dynamic loader's or another
 * library's constructor), the thread-exit hook, fork handling, and the
 * statistics line at exit. */
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static _Atomic int init_state; /* 0 not started, 1 running, 2 done */
static pthread_key_t thread_key;
static bool thread_key_ok;
static int stats_fd = -1; /* a copy of stderr: programs often close fd 2 before exit */

static void thread_exit_hook(void* value) {
  hak_heap_t* heap = value;
  if (heap != NULL && heap == hak_tls_heap) hak_thread_heap_done(heap);
}

/* The environment is read once, here, without allocating. */
static void read_options(void) {
  hak_policy_init();
  if (HAK_POLICY(stats) != HAK_STATS_OFF) stats_fd = fcntl(2, F_DUPFD_CLOEXEC, 3);
}

void hak_process_init(void) {
  if (likely(atomic_load_explicit(&init_state, memory_order_acquire) == 2)) return;
  int expected = 0;
  if (atomic_compare_exchange_strong(&init_state, &expected, 1)) {
#if HAK_SECURE
    hak_secure_init(); /* before the first block is carved */
#endif
    hak_classes_init();
    read_options();
    thread_key_ok = pthread_key_create(&thread_key, thread_exit_hook) == 0;
    atomic_store_explicit(&init_state, 2, memory_order_release);
  } else {
    while (atomic_load_explicit(&init_state, memory_order_acquire) != 2) sched_yield();
  }
}

void hak_thread_register(hak_heap_t* heap) {
  if (thread_key_ok) pthread_setspecific(thread_key, heap);
}

/* fork: hold every lock across the fork so the child finds them consistent. */
static void fork_prepare(void) {
  hak_prof_lock();
  hak_learn_lock(); /* before the policy lock: a decision publishes under it */
  hak_policy_lock();
  hak_heaps_lock();
  hak_segments_lock();
  hak_huge_lock();
  hak_stats_lock(); /* a leaf: nothing is taken under it */
}
static void fork_parent(void) {
  hak_stats_unlock();
  hak_huge_unlock();
  hak_segments_unlock();
  hak_heaps_unlock();
  hak_policy_unlock();
  hak_learn_unlock();
  hak_prof_unlock();
}
static void fork_child(void) {
  hak_segments_fork_child(hak_tls_heap);
  hak_stats_unlock();
  hak_huge_unlock();
  hak_segments_unlock();
  hak_heaps_unlock();
  hak_policy_unlock();
  hak_learn_unlock();
  hak_prof_unlock();
}

__attribute__((constructor(101))) static void hak_constructor(void) {
  hak_process_init();
  if (HAK_PROF && HAK_POLICY(prof) != HAK_PROF_OFF) {
    hak_prof_prepare();
    hak_prof_signal_update();
  }
  pthread_atfork(fork_prepare, fork_parent, fork_child);
}

__attribute__((destructor(101))) static void hak_destructor(void) {
  hak_prof_at_exit();
  if (HAK_POLICY(stats) != HAK_STATS_OFF) hak_stats_at_exit(stats_fd >= 0 ? stats_fd : 2);
}
