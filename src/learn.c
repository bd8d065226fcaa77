/* The learner (HAKMEM_LEARN=on): tunes the purge delay while the program
 * runs.  A delay too short gives back memory that the program soon takes
 * again, each page of it faulted in anew; too long a delay keeps memory that
 * nobody uses.  The slow paths count both (always, they are cheap where they
 * sit): units given back for staying free the delay, and units taken again
 * within twice the delay of being so given back ("refaulted": a delay up to
 * three times as long would have kept them).  Once per window
 * (HAK_LEARN_PERIOD_MS, or twice the delay if longer), on some thread's page
 * event (never on a fast path), the learner looks at what was counted since
 * its last decision: when a quarter or more of what the delay gave back came
 * back, it doubles the delay; when almost nothing did, twice in a row, it
 * shortens it by a third; always within [HAK_LEARN_DELAY_MIN_MS,
 * HAK_LEARN_DELAY_MAX_MS].  A change is a new policy snapshot, which every
 * slow path reads from its next event on. */
#include <pthread.h>

#include "internal.h"

/* Time between decisions, and the units of evidence (1 MiB) a decision needs. */
#define HAK_LEARN_PERIOD_MS 100
#define HAK_LEARN_EVIDENCE 16

static pthread_mutex_t learn_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint32_t next_step_ms; /* read unlocked */
static size_t seen_idle, seen_refaulted; /* the counters at the last decision */

/* Held across fork (init.c). */
void hak_learn_lock(void) { pthread_mutex_lock(&learn_lock); }
void hak_learn_unlock(void) { pthread_mutex_unlock(&learn_lock); }

/* Clean units of seg are being taken for a page: those the delay gave back
 * less than twice the delay ago are refaults.  The clock is read only for a
 * unit stamped (most clean units are fresh). */
void hak_learn_note_reuse(hak_segment_t* seg, uint32_t clean_units) {
  int32_t delay = HAK_POLICY(purge_delay_ms);
  uint32_t now_ms = 0;
  size_t refaulted = 0;
  for (; clean_units != 0; clean_units &= clean_units - 1) {
    unsigned u = (unsigned)__builtin_ctz(clean_units);
    uint32_t purged = seg->unit_purged_ms[u];
    if (purged == 0) continue;
    seg->unit_purged_ms[u] = 0;
    if (now_ms == 0) now_ms = hak_now_ms();
    if (delay > 0 && (int32_t)(now_ms - purged) <= 2 * delay) refaulted++;
  }
  if (refaulted != 0) hak_count(refaulted_units, refaulted);
}

/* The next delay, from the units given back (idle) and those taken again
 * soon (refaulted) since the last decision.  Quick to lengthen (a refault
 * costs time), slow to shorten: two decisions in a row must find almost no
 * refault, so that a window that saw the purges but not yet the reuse that
 * follows them does not shorten it. */
static int32_t next_delay(int32_t delay, size_t idle, size_t refaulted) {
  static int shorten_votes;
  int32_t next = delay;
  if (refaulted * 4 >= idle) {
    next = delay > HAK_LEARN_DELAY_MAX_MS / 2 ? HAK_LEARN_DELAY_MAX_MS : 2 * delay;
    shorten_votes = 0;
  } else if (refaulted * 16 <= idle) {
    if (++shorten_votes >= 2) {
      next = delay - delay / 3;
      shorten_votes = 0;
    }
  } else {
    shorten_votes = 0;
  }
  if (next < HAK_LEARN_DELAY_MIN_MS) next = HAK_LEARN_DELAY_MIN_MS;
  if (next > HAK_LEARN_DELAY_MAX_MS) next = HAK_LEARN_DELAY_MAX_MS;
  return next;
}

void hak_learn_step(uint32_t now_ms) {
  uint32_t next_step = atomic_load_explicit(&next_step_ms, memory_order_relaxed);
  if (next_step != 0 && (int32_t)(now_ms - next_step) < 0) return; /* (0: none yet, whatever the clock) */
  if (pthread_mutex_trylock(&learn_lock) != 0) return; /* another thread is deciding */
  int32_t delay = HAK_POLICY(purge_delay_ms);
  /* A window at least twice the delay: long enough to see the refaults of its purges. */
  uint32_t period = delay > HAK_LEARN_PERIOD_MS / 2 ? 2 * (uint32_t)delay : HAK_LEARN_PERIOD_MS;
  atomic_store_explicit(&next_step_ms, now_ms + period, memory_order_relaxed);
  size_t idle = atomic_load_explicit(&hak_counters.idle_purged_units, memory_order_relaxed) - seen_idle;
  size_t refaulted = atomic_load_explicit(&hak_counters.refaulted_units, memory_order_relaxed) - seen_refaulted;
  /* 0 and -1 (purge at once, never) are the user's choice, not a tuning. */
  if (delay > 0 && idle + refaulted >= HAK_LEARN_EVIDENCE) {
    seen_idle += idle;
    seen_refaulted += refaulted;
    int32_t next = next_delay(delay, idle, refaulted);
    if (next != delay) {
      hak_policy_publish_delay(next);
      hak_count(learner_changes, 1);
    }
  }
  pthread_mutex_unlock(&learn_lock);
}
