/* Process and thread life: one-time start-up (no allocation, so it is safe
 * from any first malloc, even inside the dynamic loader's or another
 * library's constructor), the thread-exit hook, fork handling, and the
 * statistics line at exit. */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

_Atomic bool hak_fork_handlers_on;

/* fork: hold every lock across the fork so the child finds them consistent. */
static void fork_prepare(void) {
  /* The handlers are in, for the child too: a fork between libc taking them
   * and their registrar saying so would otherwise leave the child to
   * register them a second time. */
  atomic_store_explicit(&hak_fork_handlers_on, true, memory_order_release);
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

/* libc's registration of fork handlers: override.c's, which calls libc's
 * own past its stand-in for programs (__register_atfork), where the
 * drop-in names are linked; pthread_atfork where they are not. */
__attribute__((weak)) int hak_libc_register_atfork(void (*prepare)(void), void (*parent)(void),
                                                   void (*child)(void)) {
  return pthread_atfork(prepare, parent, child);
}

/* Once: a thread that finds another registering waits for it, so that no
 * thread takes a lock before the handlers are in (hak_fork_watch); the
 * registering thread itself may come back here, from a calloc of libc's
 * registration.  The registrar's process is kept with it: a fork while
 * another thread registered leaves the child's thread to register itself
 * (it would wait for a thread the child does not have). */
void hak_fork_handlers_register(void) {
  static _Atomic pid_t registrar_pid;
  static _Atomic uintptr_t registrar;
  if (atomic_load_explicit(&hak_fork_handlers_on, memory_order_acquire)) return;
  pid_t me = getpid(), seen = 0;
  uintptr_t self = hak_thread_id();
  while (!atomic_compare_exchange_strong(&registrar_pid, &seen, me)) {
    if (seen != me) continue; /* the parent's, cut off by the fork: take it over */
    if (atomic_load(&registrar) == self) return; /* (from within the registration) */
    while (!atomic_load_explicit(&hak_fork_handlers_on, memory_order_acquire)) sched_yield();
    return;
  }
  atomic_store(&registrar, self);
  hak_libc_register_atfork(fork_prepare, fork_parent, fork_child);
  atomic_store_explicit(&hak_fork_handlers_on, true, memory_order_release);
}

/* A thread begins to use hakmem: the process has more than one thread if
 * libc says so, or if another thread came first (one made without
 * pthread_create, which libc does not see). */
void hak_fork_watch_thread(void) {
  static _Atomic uintptr_t first_thread;
  uintptr_t none = 0, self = hak_thread_id();
  if (!atomic_compare_exchange_strong(&first_thread, &none, self) && none != self)
    hak_fork_handlers_register();
  hak_fork_watch();
}

/* override.c's calloc where it is linked (this weak one answers where it is
 * not: the hak_* API beside another malloc). */
__attribute__((weak)) void* hak_drop_in_calloc(void) { return NULL; }

/* Whether the process's calloc (the dynamic linker's global lookup: the
 * library binds its own calls to itself) is hakmem's: not where a program
 * dlopens hakmem.  Only then does pthread_create's calloc come to
 * hak_fork_watch. */
static bool calloc_is_the_process_calloc(void) {
  void* mine = hak_drop_in_calloc();
  return mine != NULL && dlsym(RTLD_DEFAULT, "calloc") == mine;
}

__attribute__((constructor(101))) static void hak_constructor(void) {
  hak_process_init();
  if (HAK_PROF && HAK_POLICY(prof) != HAK_PROF_OFF) {
    hak_prof_prepare();
    hak_prof_signal_update();
  }
  if (!HAK_LAZY_FORK_HANDLERS || !calloc_is_the_process_calloc()) hak_fork_handlers_register();
  hak_fork_watch(); /* another library's constructor may have made threads */
}

__attribute__((destructor(101))) static void hak_destructor(void) {
  hak_prof_at_exit();
  if (HAK_POLICY(stats) != HAK_STATS_OFF) hak_stats_at_exit(stats_fd >= 0 ? stats_fd : 2);
}
