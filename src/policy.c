/* Configuration: every option in one table, read from the environment once,
 * at start, into hak_policy, the snapshot the slow paths read.  No option is
 * looked up anywhere else, and none on a fast path.  Runs before the heap is
 * usable, so nothing here allocates. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

extern char** environ;

hak_policy_t hak_policy;

/* An option: HAKMEM_<name>, an integer in [min, max] or one of its names
 * (names[i] stands for min + i). */
typedef struct hak_option_s {
  const char* name;
  int32_t* field;
  int32_t def, min, max;
  const char* const* names;
  const char* description;
} hak_option_t;

static const char* const purge_names[] = {"dontneed", "free", NULL};
static const char* const thp_names[] = {"system", "on", "off", NULL};
static const char* const bool_names[] = {"off", "on", NULL};

static const hak_option_t options[] = {
    {"PURGE_DELAY_MS", &hak_policy.purge_delay_ms, 100, -1, 3600000, NULL,
     "milliseconds a free 64 KiB unit stays backed before its memory is given back; 0: at once; "
     "-1: never (malloc_trim still does)"},
    {"PURGE", &hak_policy.purge_mode, HAK_PURGE_DONTNEED, 0, 1, purge_names,
     "how memory is given back: dontneed (MADV_DONTNEED: RSS falls at once) or free (MADV_FREE: "
     "the kernel takes the pages when it needs memory)"},
    {"THP", &hak_policy.thp, HAK_THP_SYSTEM, 0, 2, thp_names,
     "transparent huge pages for segments and huge blocks: system (the kernel's setting), "
     "on (MADV_HUGEPAGE), off (MADV_NOHUGEPAGE)"},
    {"STATS", &hak_policy.stats, 0, 0, 1, bool_names, "print a line of counters on stderr at exit"},
    {"VERBOSE", &hak_policy.verbose, 0, 0, 1, bool_names, "print the effective configuration on stderr at start"},
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
      if (strcmp(value, opt->names[i]) == 0) {
        *out = opt->min + i;
        return true;
      }
    }
  }
  char* end;
  long v = strtol(value, &end, 10);
  if (end == value || *end != '\0' || v < opt->min || v > opt->max) return false;
  *out = (int32_t)v;
  return true;
}

/* An option's value as it is written: its name if it has names. */
static void format_value(const hak_option_t* opt, int32_t v, char* out, size_t cap) {
  if (opt->names != NULL)
    snprintf(out, cap, "%s", opt->names[v - opt->min]);
  else
    snprintf(out, cap, "%d", (int)v);
}

static void print_policy(void) {
  char buf[256], value[32];
  for (size_t i = 0; i < OPTION_COUNT; i++) {
    format_value(&options[i], *options[i].field, value, sizeof value);
    snprintf(buf, sizeof buf, "hakmem: HAKMEM_%s=%s\n", options[i].name, value);
    hak_write_stderr(buf);
  }
}

/* The table as Markdown rows (docs/CONFIG.md is checked against them). */
void hak_policy_print_table(int fd) {
  char buf[512], def[32], range[96];
  for (size_t i = 0; i < OPTION_COUNT; i++) {
    const hak_option_t* opt = &options[i];
    format_value(opt, opt->def, def, sizeof def);
    if (opt->names != NULL) {
      size_t len = 0;
      for (int k = 0; opt->names[k] != NULL && len < sizeof range - 16; k++)
        len += (size_t)snprintf(range + len, sizeof range - len, "%s%s", k ? ", " : "", opt->names[k]);
    } else {
      snprintf(range, sizeof range, "%d to %d", (int)opt->min, (int)opt->max);
    }
    snprintf(buf, sizeof buf, "| `HAKMEM_%s` | `%s` | %s | %s |\n", opt->name, def, range, opt->description);
    hak_write_fd(fd, buf);
  }
}

void hak_policy_init(void) {
  for (size_t i = 0; i < OPTION_COUNT; i++) *options[i].field = options[i].def;
  if (environ == NULL) return;
  for (char** env = environ; *env != NULL; env++) {
    const char* var = *env;
    if (strncmp(var, "HAKMEM_", 7) != 0) continue;
    const char* name = var + 7;
    const char* eq = strchr(name, '=');
    if (eq == NULL) continue;
    size_t len = (size_t)(eq - name);
    const hak_option_t* opt = NULL;
    for (size_t i = 0; i < OPTION_COUNT; i++)
      if (strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0) opt = &options[i];
    int32_t v;
    if (opt == NULL)
      warn("unknown option", var);
    else if (!option_parse(opt, eq + 1, &v))
      warn("invalid value", var);
    else
      *opt->field = v;
  }
  if (hak_policy.verbose) print_policy();
}
