/* Messages on stderr without allocating: used where the heap may be broken. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Writes all of s; false if a write failed (errno says why). */
bool hak_write_fd(int fd, const char* s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    s += w;
    n -= (size_t)w;
  }
  return true;
}

void hak_write_stderr(const char* s) { hak_write_fd(2, s); }

static size_t put_decimal(char* buf, size_t len, unsigned v) {
  char digits[12];
  int n = 0;
  do {
    digits[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n) buf[len++] = digits[--n];
  return len;
}

/* "hakmem: <what> 0x<p>", then abort, as glibc does for a bad free. */
void hak_fatal(const char* what, const void* p) { hak_fatal_class(what, p, -1); }

void hak_fatal_class(const char* what, const void* p, int cls) {
  char buf[256];
  size_t len = 0;
  const char* prefix = "hakmem: ";
  for (const char* s = prefix; *s && len < 200; s++) buf[len++] = *s;
  for (const char* s = what; *s && len < 200; s++) buf[len++] = *s;
  buf[len++] = ' ';
  buf[len++] = '0';
  buf[len++] = 'x';
  uintptr_t v = (uintptr_t)p;
  char hex[16];
  int nd = 0;
  do {
    hex[nd++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  while (nd) buf[len++] = hex[--nd];
  if (cls >= 0) {
    for (const char* s = " (class "; *s; s++) buf[len++] = *s;
    len = put_decimal(buf, len, (unsigned)cls);
    buf[len++] = ')';
  }
  buf[len++] = '\n';
  buf[len] = 0;
  hak_write_stderr(buf);
  abort();
}

#if HAK_DEBUG
void hak_assert_fail(const char* expr, const char* file, int line) {
  char num[16];
  num[put_decimal(num, 0, (unsigned)line)] = 0;
  hak_write_stderr("hakmem: assertion failed: ");
  hak_write_stderr(expr);
  hak_write_stderr(" at ");
  hak_write_stderr(file);
  hak_write_stderr(":");
  hak_write_stderr(num);
  hak_write_stderr("\n");
  abort();
}
#endif
