/* Statistics: counters kept on slow paths and in the OS layer (and, in the
 * observing build, on the fast paths), gathered on request into hak_stats_t:
 * hak_stats_get, hak_stats_print, the report at exit (HAKMEM_STATS=on, or
 * json:PATH), malloc_stats.  Nothing here runs unless asked. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

_Static_assert(HAK_STATS_CLASSES == HAK_STAT_CLASSES, "hakmem.h's class count");

hak_counters_t hak_counters;

/* The counters at the last hak_stats_reset (gauges are not kept here). */
HAK_BSS_LAST hak_stats_t hak_stats_baseline;
static bool have_baseline;
static pthread_mutex_t baseline_lock = PTHREAD_MUTEX_INITIALIZER;

/* Held across fork (init.c): a child whose parent forked while another
 * thread was in hak_stats_get or hak_stats_reset (malloc_info, malloc_stats)
 * would wait on it forever.  Nothing is taken under it. */
void hak_stats_lock(void) { pthread_mutex_lock(&baseline_lock); }
void hak_stats_unlock(void) { pthread_mutex_unlock(&baseline_lock); }

#define LOAD(f) atomic_load_explicit(&hak_counters.f, memory_order_relaxed)

/* Committed memory: the segments' share is counted here as units are taken
 * and purged; huge blocks count their mappings. */
static size_t committed_now(void) { return LOAD(committed_bytes) + LOAD(huge_live_bytes); }

static void peak_raise(_Atomic size_t* field, size_t now) {
  size_t peak = atomic_load_explicit(field, memory_order_relaxed);
  while (now > peak && !atomic_compare_exchange_weak_explicit(field, &peak, now, memory_order_relaxed,
                                                              memory_order_relaxed)) {
  }
}

static void peak_update(void) {
  size_t now = committed_now();
  peak_raise(&hak_counters.peak_committed_bytes, now);
  peak_raise(&hak_counters.budget_peak_bytes, now);
}

/* What the most ever committed at once, and an eighth more, leaves above
 * what is committed now: the room that memory kept backed apart from these
 * counts (the huge arena's free granules) may fill.  (Without the eighth,
 * big purged granules it took again soon after: 14% more page faults.) */
size_t hak_committed_headroom(void) {
  size_t now = committed_now();
  size_t peak = LOAD(budget_peak_bytes);
  peak += peak / 8;
  return peak > now ? peak - now : 0;
}

/* The huge arena flushed (malloc_trim, a mapping refused): the headroom
 * starts again from what is committed now. */
void hak_committed_peak_restart(void) {
  atomic_store_explicit(&hak_counters.budget_peak_bytes, committed_now(), memory_order_relaxed);
}

void hak_committed_add(size_t bytes) {
  hak_count(committed_bytes, bytes);
  peak_update();
}

void hak_committed_sub(size_t bytes) { hak_uncount(committed_bytes, bytes); }

void hak_usage_get(hak_usage_t* usage) {
  memset(usage, 0, sizeof *usage);
  hak_segments_usage(usage);
  usage->huge_blocks = LOAD(huge_live);
  usage->huge_bytes = LOAD(huge_live_bytes);
}

/* ---- gathering -------------------------------------------------------------- */

static void add_heap(hak_heap_t* heap, void* arg) {
  hak_stats_t* st = arg;
  hak_class_stats_t* cls = st->classes;
  const hak_heap_stats_t* s = &heap->stats;
  st->remote_frees += __atomic_load_n(&s->remote_frees, __ATOMIC_RELAXED);
#define SUM(field, from) cls[c].field += __atomic_load_n(&s->from[c], __ATOMIC_RELAXED)
  for (unsigned c = 0; c < HAK_STAT_CLASSES; c++) {
    SUM(refills, refills);
    SUM(retires, retires);
#if HAK_OBSERVE
    SUM(remote_frees, remote_in);
    SUM(alloc_current, alloc_current);
    SUM(alloc_partial, alloc_partial);
    SUM(alloc_refill, alloc_refill);
    SUM(free_current, free_current);
    SUM(free_partial, free_partial);
    SUM(free_empty, free_empty);
    SUM(free_remote, free_remote);
#endif
  }
#undef SUM
}

/* The process's resident set now, from /proc (no allocation). */
static size_t rss_now(void) {
  char buf[128];
  int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  size_t resident = 0;
  const char* p = strchr(buf, ' ');
  for (p = p ? p + 1 : buf; *p >= '0' && *p <= '9'; p++) resident = resident * 10 + (size_t)(*p - '0');
  return resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* Everything now, counters since start (no baseline subtracted). */
static void gather(hak_stats_t* st) {
  memset(st, 0, sizeof *st);
  st->observed = HAK_OBSERVE ? 1 : 0;
  st->mmap_calls = LOAD(mmap_calls);
  st->munmap_calls = LOAD(munmap_calls);
  st->madvise_calls = LOAD(madvise_calls);
  st->mremap_calls = LOAD(mremap_calls);
  st->purged_bytes = LOAD(purged_bytes);
  st->reserved_bytes = LOAD(mapped_bytes);
  st->huge_allocs = LOAD(huge_allocs);
  st->huge_live = LOAD(huge_live);
  st->huge_live_bytes = LOAD(huge_live_bytes);
  st->committed_bytes = LOAD(committed_bytes) + st->huge_live_bytes + hak_huge_cached_bytes();
  st->peak_committed_bytes = LOAD(peak_committed_bytes);
  if (st->peak_committed_bytes < st->committed_bytes) st->peak_committed_bytes = st->committed_bytes;
  st->heaps = LOAD(heaps);
  st->lookup_failures = LOAD(lookup_failures);
  st->purge_delay_ms = HAK_POLICY(purge_delay_ms);
  st->idle_purged_bytes = LOAD(idle_purged_units) << HAK_UNIT_SHIFT;
  st->refaulted_bytes = LOAD(refaulted_units) << HAK_UNIT_SHIFT;
  st->learner_changes = LOAD(learner_changes);

  hak_usage_t u;
  hak_usage_get(&u);
  st->segments = u.segments;
  st->cached_segments = u.cached_segments;
  st->live_bytes = u.in_use_bytes + u.huge_bytes;
  hak_heaps_each(add_heap, st);
  for (unsigned c = 0; c < HAK_STAT_CLASSES; c++) {
    st->classes[c].block_size = c < HAK_CLASSES ? hak_class_size[c] : 0;
    st->classes[c].live_blocks = u.class_live[c];
    st->classes[c].pages = u.class_pages[c];
  }

  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0) {
    st->minor_faults = (size_t)ru.ru_minflt;
    st->major_faults = (size_t)ru.ru_majflt;
    st->peak_rss_bytes = (size_t)ru.ru_maxrss * 1024;
  }
  st->rss_bytes = rss_now();
  if (st->peak_rss_bytes < st->rss_bytes) st->peak_rss_bytes = st->rss_bytes; /* (the kernel's peak lags) */
}

HAK_API void hak_stats_get(hak_stats_t* out) {
  if (out == NULL) return;
  hak_process_init();
  gather(out);
  pthread_mutex_lock(&baseline_lock);
  if (!have_baseline) {
    pthread_mutex_unlock(&baseline_lock);
    return;
  }
  /* Counters since the reset; gauges (live, committed, RSS, ...) as they are. */
#define SINCE(f) out->f -= out->f >= hak_stats_baseline.f ? hak_stats_baseline.f : out->f
  SINCE(mmap_calls);
  SINCE(munmap_calls);
  SINCE(madvise_calls);
  SINCE(mremap_calls);
  SINCE(purged_bytes);
  SINCE(huge_allocs);
  SINCE(lookup_failures);
  SINCE(remote_frees);
  SINCE(minor_faults);
  SINCE(major_faults);
  SINCE(idle_purged_bytes);
  SINCE(refaulted_bytes);
  SINCE(learner_changes);
  for (unsigned c = 0; c < HAK_STAT_CLASSES; c++) {
    SINCE(classes[c].refills);
    SINCE(classes[c].retires);
    SINCE(classes[c].remote_frees);
    SINCE(classes[c].alloc_current);
    SINCE(classes[c].alloc_partial);
    SINCE(classes[c].alloc_refill);
    SINCE(classes[c].free_current);
    SINCE(classes[c].free_partial);
    SINCE(classes[c].free_empty);
    SINCE(classes[c].free_remote);
  }
#undef SINCE
  pthread_mutex_unlock(&baseline_lock);
}

HAK_API void hak_stats_reset(void) {
  hak_process_init();
  hak_stats_t now;
  gather(&now);
  pthread_mutex_lock(&baseline_lock);
  hak_stats_baseline = now;
  have_baseline = true;
  pthread_mutex_unlock(&baseline_lock);
  /* The peak restarts from what is committed now. */
  atomic_store_explicit(&hak_counters.peak_committed_bytes, committed_now(), memory_order_relaxed);
}

/* ---- the readable report ---------------------------------------------------- */

/* Lines are formatted into a buffer and handed to a writer: a file
 * descriptor at exit (no stdio, which the program may have torn down), a
 * FILE* for hak_stats_print. */
typedef struct out_s {
  int fd;
  FILE* file;
  int err; /* why a write to fd failed (0: none has) */
} out_t;

static void put(out_t* o, const char* s) {
  if (o->file != NULL)
    fputs(s, o->file);
  else if (o->err == 0 && !hak_write_fd(o->fd, s))
    o->err = errno != 0 ? errno : EIO;
}

/* bytes as "12.3 MiB" */
static const char* human(size_t v, char* buf, size_t cap) {
  static const char* const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double d = (double)v;
  int u = 0;
  while (d >= 1024 && u < 4) {
    d /= 1024;
    u++;
  }
  snprintf(buf, cap, u == 0 ? "%.0f %s" : "%.1f %s", d, unit[u]);
  return buf;
}

static void report(out_t* o, const hak_stats_t* st) {
  char line[512], a[32], b[32], c[32], d[32];
  /* One greppable line first (tests/real and scripts read it). */
  snprintf(line, sizeof line,
           "hakmem: stats segments=%zu pages=%zu huge=%zu heaps=%zu mmap=%zu munmap=%zu madvise=%zu "
           "mremap=%zu reserved=%zu committed=%zu purged=%zu live=%zu\n",
           st->segments, (size_t)LOAD(pages), st->huge_allocs, st->heaps, st->mmap_calls, st->munmap_calls,
           st->madvise_calls, st->mremap_calls, st->reserved_bytes, st->committed_bytes, st->purged_bytes,
           st->live_bytes);
  put(o, line);
  snprintf(line, sizeof line, "hakmem: OS: %zu mmap, %zu munmap, %zu madvise, %zu mremap; reserved %s, "
           "committed %s (peak %s), purged %s in all\n",
           st->mmap_calls, st->munmap_calls, st->madvise_calls, st->mremap_calls,
           human(st->reserved_bytes, a, sizeof a), human(st->committed_bytes, b, sizeof b),
           human(st->peak_committed_bytes, c, sizeof c), human(st->purged_bytes, d, sizeof d));
  put(o, line);
  snprintf(line, sizeof line, "hakmem: live %s in blocks; committed / live %.2f; huge blocks %zu live (%s), "
           "%zu made in all; segments %zu held, %zu cached; heaps %zu; remote frees %zu; "
           "foreign pointers %zu\n",
           human(st->live_bytes, a, sizeof a),
           st->live_bytes ? (double)st->committed_bytes / (double)st->live_bytes : 0.0, st->huge_live,
           human(st->huge_live_bytes, b, sizeof b), st->huge_allocs, st->segments, st->cached_segments,
           st->heaps, st->remote_frees, st->lookup_failures);
  put(o, line);
  size_t arena_reserved, arena_dirty, arena_free;
  hak_huge_arena_info(&arena_reserved, &arena_dirty, &arena_free);
  snprintf(line, sizeof line, "hakmem: huge arena: %s reserved, %s of it free, %s of that still backed\n",
           human(arena_reserved, a, sizeof a), human(arena_free, b, sizeof b), human(arena_dirty, c, sizeof c));
  put(o, line);
  snprintf(line, sizeof line, "hakmem: process RSS %s, peak %s; page faults %zu minor, %zu major\n",
           human(st->rss_bytes, a, sizeof a), human(st->peak_rss_bytes, b, sizeof b), st->minor_faults,
           st->major_faults);
  put(o, line);
  char learner[48] = "";
  if (HAK_POLICY(learn)) snprintf(learner, sizeof learner, " (the learner's; %zu changes)", st->learner_changes);
  snprintf(line, sizeof line, "hakmem: purge delay %ld ms%s; given back after staying free that long %s, "
           "of which taken again within twice the delay %s\n",
           st->purge_delay_ms, learner, human(st->idle_purged_bytes, a, sizeof a),
           human(st->refaulted_bytes, b, sizeof b));
  put(o, line);
  /* (HAK_OBSERVE, what st->observed always is here: the release library
   * then carries neither of the observing build's strings.) */
  put(o, HAK_OBSERVE ? "hakmem: class   block    live  pages  refills  retires |  remote | alloc: current "
                        "partial  refill | free: current partial   empty  remote\n"
                      : "hakmem: class   block    live  pages  refills  retires\n");
  for (unsigned k = 0; k < HAK_STAT_CLASSES; k++) {
    const hak_class_stats_t* s = &st->classes[k];
    if (s->live_blocks == 0 && s->pages == 0 && s->refills == 0 && s->remote_frees == 0 &&
        s->alloc_current == 0 && s->free_current == 0 && s->free_partial == 0)
      continue;
    char name[16];
    if (k < HAK_CLASSES)
      snprintf(name, sizeof name, "%7zu", s->block_size);
    else
      snprintf(name, sizeof name, "  large");
    int n = snprintf(line, sizeof line, "hakmem: %5u %s %7zu %6zu %8zu %8zu", k, name, s->live_blocks,
                     s->pages, s->refills, s->retires);
    if (HAK_OBSERVE)
      snprintf(line + n, sizeof line - (size_t)n, " | %7zu | %14zu %7zu %7zu | %13zu %7zu %7zu %7zu",
               s->remote_frees, s->alloc_current, s->alloc_partial, s->alloc_refill, s->free_current,
               s->free_partial, s->free_empty, s->free_remote);
    strncat(line, "\n", sizeof line - strlen(line) - 1);
    put(o, line);
  }
}

static void report_json(out_t* o, const hak_stats_t* st) {
  char line[640];
  snprintf(line, sizeof line,
           "{\"observed\": %d, \"os\": {\"mmap\": %zu, \"munmap\": %zu, \"madvise\": %zu, \"mremap\": %zu, "
           "\"reserved_bytes\": %zu, \"committed_bytes\": %zu, \"peak_committed_bytes\": %zu, "
           "\"purged_bytes\": %zu},\n",
           st->observed, st->mmap_calls, st->munmap_calls, st->madvise_calls, st->mremap_calls,
           st->reserved_bytes, st->committed_bytes, st->peak_committed_bytes, st->purged_bytes);
  put(o, line);
  snprintf(line, sizeof line,
           " \"live_bytes\": %zu, \"fragmentation\": %.4f, \"huge\": {\"allocs\": %zu, \"live\": %zu, "
           "\"live_bytes\": %zu}, \"segments\": %zu, \"cached_segments\": %zu, \"heaps\": %zu, "
           "\"remote_frees\": %zu, \"lookup_failures\": %zu,\n",
           st->live_bytes, st->live_bytes ? (double)st->committed_bytes / (double)st->live_bytes : 0.0,
           st->huge_allocs, st->huge_live, st->huge_live_bytes, st->segments, st->cached_segments, st->heaps,
           st->remote_frees, st->lookup_failures);
  put(o, line);
  snprintf(line, sizeof line,
           " \"process\": {\"rss_bytes\": %zu, \"peak_rss_bytes\": %zu, \"minor_faults\": %zu, "
           "\"major_faults\": %zu},\n \"purge\": {\"delay_ms\": %ld, \"idle_purged_bytes\": %zu, "
           "\"refaulted_bytes\": %zu, \"learner_changes\": %zu},\n \"classes\": [",
           st->rss_bytes, st->peak_rss_bytes, st->minor_faults, st->major_faults, st->purge_delay_ms,
           st->idle_purged_bytes, st->refaulted_bytes, st->learner_changes);
  put(o, line);
  for (unsigned k = 0; k < HAK_STAT_CLASSES; k++) {
    const hak_class_stats_t* s = &st->classes[k];
    snprintf(line, sizeof line,
             "%s\n  {\"class\": %u, \"block_size\": %zu, \"live_blocks\": %zu, \"pages\": %zu, \"refills\": %zu, "
             "\"retires\": %zu, \"remote_frees\": %zu, \"alloc_current\": %zu, \"alloc_partial\": %zu, "
             "\"alloc_refill\": %zu, \"free_current\": %zu, \"free_partial\": %zu, \"free_empty\": %zu, "
             "\"free_remote\": %zu}",
             k ? "," : "", k, s->block_size, s->live_blocks, s->pages, s->refills, s->retires, s->remote_frees,
             s->alloc_current, s->alloc_partial, s->alloc_refill, s->free_current, s->free_partial, s->free_empty,
             s->free_remote);
    put(o, line);
  }
  put(o, "\n ]}\n");
}

void hak_stats_report_fd(int fd) {
  hak_stats_t st;
  hak_stats_get(&st);
  out_t o = {fd, NULL, 0};
  report(&o, &st);
}

HAK_API void hak_stats_print(FILE* file) {
  hak_stats_t st;
  hak_stats_get(&st);
  out_t o = {2, file, 0};
  report(&o, &st);
  if (file != NULL) fflush(file);
}

/* Written whole under an exclusive lock, truncated only once it is held:
 * the processes of one program (fork, make -j) exiting together each write
 * the file in turn, never a mix of theirs (a review found a third of such
 * files broken).  (Not written aside and renamed: PATH may be /dev/stderr or
 * a pipe.)  -1 with errno if it could not be written whole. */
HAK_API int hak_stats_write_json(const char* path) {
  if (path == NULL) return -1;
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  struct stat sb;
  if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    if (ftruncate(fd, 0) != 0) {
      int err = errno;
      close(fd);
      errno = err;
      return -1;
    }
  }
  hak_stats_t st;
  hak_stats_get(&st);
  out_t o = {fd, NULL, 0};
  report_json(&o, &st);
  int err = o.err;
  if (close(fd) != 0 && err == 0) err = errno; /* (the lock goes with it) */
  if (err == 0) return 0;
  errno = err;
  return -1;
}

/* At exit, as HAKMEM_STATS asks: the report on fd (a copy of stderr), or JSON. */
void hak_stats_at_exit(int fd) {
  int mode = HAK_POLICY(stats);
  /* Blocks other threads freed into this thread's heap count as handed out
   * until it collects them: collected now, the report's live bytes are the
   * blocks still live. */
  hak_heap_t* heap = hak_tls_heap;
  if (heap->kind == HAK_HEAP_THREAD && hak_remote_pending(heap)) hak_remote_collect(heap);
  if (mode == HAK_STATS_ON)
    hak_stats_report_fd(fd);
  else if (mode == HAK_STATS_JSON) {
    /* Set to json by hak_option_set, with no path: the current directory. */
    const char* path = hak_stats_path[0] ? hak_stats_path : "hakmem-stats.json";
    if (hak_stats_write_json(path) != 0) {
      hak_write_fd(fd, "hakmem: HAKMEM_STATS: cannot write ");
      hak_write_fd(fd, path);
      hak_write_fd(fd, "\n");
    }
  }
}
