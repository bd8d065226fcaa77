/* Configuration: every option in one table, read from the environment once,
 * at start, into an immutable policy snapshot that the slow paths read;
 * hak_option_set publishes a new snapshot.  No option is looked up anywhere
 * else, and none on a fast path.  Runs before the heap is usable, so nothing
 * here allocates. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

extern char** environ;

/* Snapshots are published in turn from a ring and never freed: a slot is
 * rewritten only after HAK_POLICY_RING - 1 later publications, so the
 * snapshot a slow path holds stays whole while it runs.  Fields are read and
 * written as relaxed atomics: a reader asleep through all those publications
 * would read fields of two snapshots, each in its range. */
#define HAK_POLICY_RING 16
static hak_policy_t snapshots[HAK_POLICY_RING];
static unsigned snapshot_count; /* publications so far */
static pthread_mutex_t publish_lock = PTHREAD_MUTEX_INITIALIZER;
_Atomic(const hak_policy_t*) hak_policy_now = &snapshots[0];

/* An option: HAKMEM_<name>, an integer in [min, max] or one of its names
 * (names[i] stands for min + i); with path, its last name is written
 * NAME:PATH and the path is kept there. */
typedef struct hak_option_s {
  const char* name;
  size_t offset; /* of its field in hak_policy_t */
  int32_t def, min, max;
  const char* const* names;
  const char* description;
  char* path;
} hak_option_t;

HAK_BSS_LAST char hak_stats_path[256];

#define FIELD(f) offsetof(hak_policy_t, f)
static const char* const purge_names[] = {"dontneed", "free", NULL};
static const char* const thp_names[] = {"system", "on", "off", NULL};
static const char* const bool_names[] = {"off", "on", NULL};
static const char* const stats_names[] = {"off", "on", "json", NULL};
static const char* const prof_names[] = {"off", "on", "file", NULL};

static const hak_option_t options[] = {
    {"PURGE_DELAY_MS", FIELD(purge_delay_ms), 100, -1, 3600000, NULL,
     "milliseconds a free 64 KiB unit stays backed before its memory is given back; 0: at once; "
     "-1: never (malloc_trim still does)", NULL},
    {"PURGE", FIELD(purge_mode), HAK_PURGE_DONTNEED, 0, 1, purge_names,
     "how memory is given back: dontneed (MADV_DONTNEED: RSS falls at once) or free (MADV_FREE: "
     "the kernel takes the pages when it needs memory)", NULL},
    {"THP", FIELD(thp), HAK_THP_SYSTEM, 0, 2, thp_names,
     "transparent huge pages for segments and huge blocks: system (the kernel's setting), "
     "on (MADV_HUGEPAGE), off (MADV_NOHUGEPAGE)", NULL},
    {"STATS", FIELD(stats), HAK_STATS_OFF, 0, 2, stats_names,
     "statistics at exit: on (a report on stderr), json:PATH (the same as JSON into PATH)",
     hak_stats_path},
    {"VERBOSE", FIELD(verbose), 0, 0, 1, bool_names, "print the effective configuration on stderr at start", NULL},
    {"LEARN", FIELD(learn), 0, 0, 1, bool_names,
     "the learner: moves the purge delay between 10 and 1000 ms, from how much memory it gives back "
     "unused against how much is faulted in again soon after (needs a delay above 0)", NULL},
    {"PROF", FIELD(prof), HAK_PROF_OFF, 0, 2, prof_names,
     "the sampling heap profiler: on (the live heap's profile into hakmem.PID.heap in the working "
     "directory at exit, by a process that took samples), file:PATH (into PATH; %p: the process id); "
     "read it with `hakmem prof` or pprof", hak_prof_path},
    {"PROF_RATE", FIELD(prof_rate), 524288, 1, 1073741824, NULL,
     "the profiler's mean gap between samples, in bytes allocated: smaller is more precise and slower", NULL},
    {"PROF_SIGNAL", FIELD(prof_signal), 0, 0, 64, NULL,
     "a signal on which the profiler also writes its profile (for example 12, SIGUSR2); 0: none", NULL},
};
#define OPTION_COUNT (sizeof options / sizeof options[0])

static void warn(const char* what, const char* var) {
  char buf[256];
  snprintf(buf, sizeof buf, "hakmem: %s: %.160s (ignored)\n", what, var);
  hak_write_stderr(buf);
}

/* Parses value into *out; false if it is neither a name nor an integer in range. */
static bool option_parse(const hak_option_t* opt, const char* value, int32_t* out) {
  if (opt->names != NULL) {
    for (int i = 0; opt->names[i] != NULL; i++) {
      size_t len = strlen(opt->names[i]);
      if (strncmp(value, opt->names[i], len) != 0) continue;
      bool last = opt->names[i + 1] == NULL;
      if (opt->path != NULL && last) { /* NAME:PATH, and only so */
        if (value[len] != ':' || value[len + 1] == '\0' || strlen(value + len + 1) >= 256) return false;
        strcpy(opt->path, value + len + 1);
      } else if (value[len] != '\0') {
        continue;
      }
      *out = opt->min + i;
      return true;
    }
  }
  char* end;
  long v = strtol(value, &end, 10);
  if (end == value || *end != '\0' || v < opt->min || v > opt->max) return false;
  *out = (int32_t)v;
  return true;
}

/* An option's value as it is written: its name if it has names (NAME:PATH
 * for the last one when a path was given). */
static void format_value(const hak_option_t* opt, int32_t v, char* out, size_t cap) {
  if (opt->names == NULL)
    snprintf(out, cap, "%d", (int)v);
  else if (opt->path != NULL && opt->path[0] != '\0' && opt->names[v - opt->min + 1] == NULL)
    snprintf(out, cap, "%s:%s", opt->names[v - opt->min], opt->path);
  else
    snprintf(out, cap, "%s", opt->names[v - opt->min]);
}

/* The values an option takes, as docs/CONFIG.md writes them: "a, b, c:PATH"
 * or "min to max". */
static void format_range(const hak_option_t* opt, char* out, size_t cap) {
  if (opt->names == NULL) {
    snprintf(out, cap, "%d to %d", (int)opt->min, (int)opt->max);
    return;
  }
  size_t len = 0;
  out[0] = '\0';
  for (int k = 0; opt->names[k] != NULL && len < cap - 16; k++)
    len += (size_t)snprintf(out + len, cap - len, "%s%s%s", k ? ", " : "", opt->names[k],
                            opt->path != NULL && opt->names[k + 1] == NULL ? ":PATH" : "");
}

static int32_t* option_field(hak_policy_t* policy, const hak_option_t* opt) {
  return (int32_t*)((char*)policy + opt->offset);
}

static int32_t option_value(const hak_policy_t* policy, const hak_option_t* opt) {
  return __atomic_load_n((const int32_t*)((const char*)policy + opt->offset), __ATOMIC_RELAXED);
}

#if HAK_SECURE
#define HAK_BUILD_SECURE "+secure"
#else
#define HAK_BUILD_SECURE ""
#endif
#if HAK_DEBUG
#define HAK_BUILD_DEBUG "+debug"
#else
#define HAK_BUILD_DEBUG ""
#endif
#if HAK_OBSERVE
#define HAK_BUILD_OBSERVE "+observe"
#else
#define HAK_BUILD_OBSERVE ""
#endif

/* HAKMEM_VERBOSE: the version, then one line per option, in a stable format
 * that tools/hakmem (`hakmem config`) reads: the value first, then fields
 * separated by tabs,
 *   hakmem: version=MAJOR.MINOR build=release, or secure, debug, observe joined by +
 *   hakmem: HAKMEM_<NAME>=<value>\tdefault=<default>\tvalues=<values>\tfrom=environment|default\tmeaning=<text>
 * (from=environment: the caller's environment set it to a valid value). */
static void print_policy(const hak_policy_t* policy, const bool* from_env) {
  char buf[768], value[300], def[32], range[96];
  const char* build = HAK_BUILD_SECURE HAK_BUILD_DEBUG HAK_BUILD_OBSERVE;
  snprintf(buf, sizeof buf, "hakmem: version=%d.%d build=%s\n", HAKMEM_VERSION_MAJOR, HAKMEM_VERSION_MINOR,
           build[0] ? build + 1 : "release");
  hak_write_stderr(buf);
  for (size_t i = 0; i < OPTION_COUNT; i++) {
    const hak_option_t* opt = &options[i];
    format_value(opt, option_value(policy, opt), value, sizeof value);
    format_value(opt, opt->def, def, sizeof def);
    format_range(opt, range, sizeof range);
    snprintf(buf, sizeof buf, "hakmem: HAKMEM_%s=%s\tdefault=%s\tvalues=%s\tfrom=%s\tmeaning=%s\n", opt->name,
             value, def, range, from_env[i] ? "environment" : "default", opt->description);
    hak_write_stderr(buf);
  }
}

/* The table as Markdown rows (docs/CONFIG.md is checked against them). */
void hak_policy_print_table(int fd) {
  char buf[512], def[32], range[96];
  for (size_t i = 0; i < OPTION_COUNT; i++) {
    const hak_option_t* opt = &options[i];
    format_value(opt, opt->def, def, sizeof def);
    format_range(opt, range, sizeof range);
    snprintf(buf, sizeof buf, "| `HAKMEM_%s` | `%s` | %s | %s |\n", opt->name, def, range, opt->description);
    hak_write_fd(fd, buf);
  }
}

/* The option called name (with or without the HAKMEM_ prefix; len bytes). */
static const hak_option_t* option_find(const char* name, size_t len) {
  if (len > 7 && strncmp(name, "HAKMEM_", 7) == 0) {
    name += 7;
    len -= 7;
  }
  for (size_t i = 0; i < OPTION_COUNT; i++)
    if (strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0) return &options[i];
  return NULL;
}

/* Held across fork (init.c), so that the child finds it free. */
void hak_policy_lock(void) { pthread_mutex_lock(&publish_lock); }
void hak_policy_unlock(void) { pthread_mutex_unlock(&publish_lock); }

/* Publishes a copy of the current snapshot with the field at offset set to value. */
static void publish(size_t offset, int32_t value) {
  pthread_mutex_lock(&publish_lock);
  const hak_policy_t* now = hak_policy();
  hak_policy_t* next = &snapshots[++snapshot_count % HAK_POLICY_RING];
  for (size_t i = 0; i < OPTION_COUNT; i++) {
    int32_t v = options[i].offset == offset ? value : option_value(now, &options[i]);
    __atomic_store_n(option_field(next, &options[i]), v, __ATOMIC_RELAXED);
  }
  atomic_store_explicit(&hak_policy_now, next, memory_order_release);
  pthread_mutex_unlock(&publish_lock);
}

void hak_policy_publish_delay(int32_t delay_ms) { publish(FIELD(purge_delay_ms), delay_ms); }

void hak_policy_init(void) {
  hak_policy_t* policy = &snapshots[0];
  bool from_env[OPTION_COUNT] = {false};
  for (size_t i = 0; i < OPTION_COUNT; i++) *option_field(policy, &options[i]) = options[i].def;
  for (char** env = environ; env != NULL && *env != NULL; env++) {
    const char* var = *env;
    if (strncmp(var, "HAKMEM_", 7) != 0) continue;
    const char* eq = strchr(var, '=');
    if (eq == NULL) continue;
    const hak_option_t* opt = option_find(var, (size_t)(eq - var));
    int32_t v;
    if (opt == NULL)
      warn("unknown option", var);
    else if (!option_parse(opt, eq + 1, &v))
      warn("invalid value", var);
    else {
      *option_field(policy, opt) = v;
      from_env[opt - options] = true;
    }
  }
  if (!HAK_PROF && policy->prof != HAK_PROF_OFF) {
    hak_write_stderr("hakmem: HAKMEM_PROF needs the profiling library, libhakmem-prof.so "
                     "(hakmem run --prof): off\n");
    policy->prof = HAK_PROF_OFF;
  }
  atomic_store_explicit(&hak_policy_now, policy, memory_order_release);
  if (policy->verbose) print_policy(policy, from_env);
}

HAK_API int hak_option_get(const char* name, long* value) {
  hak_process_init();
  const hak_option_t* opt = name ? option_find(name, strlen(name)) : NULL;
  if (opt == NULL || value == NULL) return EINVAL;
  *value = option_value(hak_policy(), opt);
  return 0;
}

HAK_API int hak_option_set(const char* name, long value) {
  hak_process_init();
  const hak_option_t* opt = name ? option_find(name, strlen(name)) : NULL;
  if (opt == NULL) return EINVAL;
  if (value < opt->min || value > opt->max) return ERANGE;
  if (opt->offset == FIELD(prof) && value != HAK_PROF_OFF) {
    if (!HAK_PROF) return ENOTSUP; /* (libhakmem-prof.so) */
    hak_prof_prepare();
  }
  publish(opt->offset, (int32_t)value);
  if (HAK_PROF && (opt->offset == FIELD(prof) || opt->offset == FIELD(prof_signal))) hak_prof_signal_update();
  return 0;
}
