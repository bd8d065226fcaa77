/* free() of a pointer hakmem does not own, of one that is not the start of
 * a block, or of the block freed just before (a double free, also from
 * another thread), is reported on stderr in one line naming the address, and
 * the program aborts; so is realloc of such a pointer in the secure build.  Each case runs in a child process.  Linked with hakmem. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "test_util.h"

static char address_text[64];

static void free_stack(void) {
  int x[4];
  void* volatile p = x;
  snprintf(address_text, sizeof address_text, "%p", (void*)p);
  write(2, "", 0);
  free(p);
}

static void free_interior(void) {
  char* p = malloc(100);
  snprintf(address_text, sizeof address_text, "%p", (void*)(p + 8));
  free(p + 8);
}

static void free_glibc_style_foreign(void) {
  static char not_heap[64];
  snprintf(address_text, sizeof address_text, "%p", (void*)not_heap);
  free(not_heap);
}

static void free_interior_huge(void) {
  char* p = malloc((size_t)8 << 20);
  snprintf(address_text, sizeof address_text, "%p", (void*)(p + 4096));
  free(p + 4096);
}

/* Double frees: the block freed last, freed again. */
static void double_free_small(void) {
  char* p = malloc(64);
  free(p);
  free(p);
}

static void double_free_mid(void) {
  char* p = malloc(40000);
  free(p);
  free(p);
}

/* A huge block (from the arena) freed twice: its granules are free, and the
 * second free finds no block there (it was reported as a foreign pointer). */
static void double_free_huge(void) {
  char* p = malloc((size_t)3 << 20);
  free(p);
  free(p);
}

/* A block of a page found full: its first free goes through the slow path. */
static void double_free_full_page(void) {
  enum { N = 8192 };
  static void* b[N];
  for (int i = 0; i < N; i++) b[i] = malloc(48);
  free(b[0]);
  free(b[0]);
}

static void* free_twice(void* p) {
  free(p);
  free(p);
  return NULL;
}

/* Freed twice by another thread than its owner: both go to the owner's
 * remote list, where the second would link the block to itself. */
static void double_free_remote(void) {
  pthread_t t;
  void* p = malloc(64);
  pthread_create(&t, NULL, free_twice, p);
  pthread_join(t, NULL);
  free(malloc(64)); /* the owner collects */
}

#if HAK_SECURE
/* The secure build's realloc makes free's checks before it keeps or grows a block: a block
 * freed just before, reallocated to a size it holds (it was returned as it
 * was, to be handed out again by malloc), a small and a large block; a
 * pointer inside a block, kept or grown in place (a large block grew from
 * it).  Each child ends cleanly if realloc lets it through. */
static void realloc_freed_small(void) {
  char* p = malloc(100);
  free(p);
  hak_escape(realloc(p, 90));
  _exit(0); /* (not reached: the realloc is reported) */
}

static void realloc_freed_large(void) {
  char* p = malloc(300000);
  char* keep = malloc(300000); /* (the page of p, freed, stays a page) */
  free(p);
  hak_escape(realloc(p, 290000));
  hak_escape(keep);
  _exit(0);
}

static void realloc_interior(void) {
  char* p = malloc(100);
  hak_escape(realloc(p + 16, 50));
  _exit(0);
}

/* A write past the end of a large block, then its growth in place, which
 * lays the canary anew at its new end: the write must be found first. */
static void realloc_overrun_large(void) {
  char* p = malloc(300000);
  p[malloc_usable_size(p)] = 0;
  hak_escape(realloc(p, 500000));
  _exit(0);
}

static void realloc_interior_large(void) {
  char* p = malloc(300000);
  hak_escape(realloc(p + 4096, 600000));
  _exit(0);
}
#endif

static void check_reported(const char* name, void (*fn)(void), const char* fault) {
  char err[1024];
  /* The address is computed in the child; recompute it the same way here for
   * the stack case is impossible, so the child's message is checked for the
   * fault text and a 0x address on one line. */
  int status = hak_run_child(fn, err, sizeof err);
  if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT)) {
    fprintf(stderr, "%s: child did not abort (status %d), stderr: %s\n", name, status, err);
    hak_test_failures++;
    return;
  }
  if (strstr(err, "hakmem: ") == NULL || strstr(err, fault) == NULL || strstr(err, "0x") == NULL) {
    fprintf(stderr, "%s: unexpected report: %s\n", name, err);
    hak_test_failures++;
  }
  if (strchr(err, '\n') != strrchr(err, '\n')) {
    fprintf(stderr, "%s: report is not one line: %s\n", name, err);
    hak_test_failures++;
  }
}

int main(void) {
  check_reported("stack", free_stack, "not allocated by hakmem");
  check_reported("static", free_glibc_style_foreign, "not allocated by hakmem");
  check_reported("interior", free_interior, "invalid pointer");
  check_reported("interior-huge", free_interior_huge, "invalid pointer");
  check_reported("double-small", double_free_small, "double free of");
#if HAK_SECURE
  check_reported("double-small-class", double_free_small, "(class 4)"); /* 64 bytes and the canary */
#else
  check_reported("double-small-class", double_free_small, "(class 3)");
#endif
  check_reported("double-mid", double_free_mid, "double free of");
  check_reported("double-full-page", double_free_full_page, "double free of");
  check_reported("double-huge", double_free_huge, "double free of a huge block");
  check_reported("double-remote", double_free_remote, "double free of");
#if HAK_SECURE /* (the release build's realloc does not look: docs/BENCHMARKS.md) */
  check_reported("realloc-freed-small", realloc_freed_small, "double free of");
  check_reported("realloc-freed-large", realloc_freed_large, "0x");
  check_reported("realloc-interior", realloc_interior, "invalid pointer");
  check_reported("realloc-interior-large", realloc_interior_large, "invalid pointer");
  check_reported("realloc-overrun-large", realloc_overrun_large, "write past the end");
#endif
  /* And a valid free after all that still works in this process. */
  void* p = malloc(10);
  free(p);
  return hak_test_result("test_invalid_free");
}
