/* A program with a known leak, for the profiler's end-to-end test
 * (check_prof_leak.py): leaky_function loses LEAKS blocks of 100-4099
 * bytes; churn_function allocates several times as much and frees it all;
 * keeper_function holds a smaller amount until the end, freed before exit.
 * It prints the bytes leaked.  An ordinary binary (no hakmem at link time,
 * built with -g so that addr2line names the functions). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEAKS 20000

__attribute__((noinline)) size_t leaky_function(void) {
  size_t total = 0;
  for (size_t i = 0; i < LEAKS; i++) {
    size_t n = 100 + (i * 7919) % 4000;
    char* volatile p = malloc(n);
    if (p == NULL) exit(1);
    memset(p, (int)i, n < 64 ? n : 64);
    total += n;
  }
  return total;
}

__attribute__((noinline)) void churn_function(size_t bytes) {
  for (size_t done = 0, i = 0; done < bytes; i++) {
    size_t n = 16 + (i * 13) % 3000;
    char* volatile p = malloc(n);
    if (p == NULL) exit(1);
    p[0] = 1;
    free(p);
    done += n;
  }
}

static void* keep[2000];
__attribute__((noinline)) void keeper_function(void) {
  for (int i = 0; i < 2000; i++) keep[i] = malloc(1000 + (size_t)i % 1000);
}

static void* worker(void* arg) {
  churn_function(64u << 20);
  return arg;
}

int main(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, worker, NULL) != 0) return 1;
  keeper_function();
  size_t leaked = leaky_function();
  churn_function(128u << 20);
  pthread_join(t, NULL);
  for (int i = 0; i < 2000; i++) free(keep[i]);
  printf("leaked %zu\n", leaked);
  return 0;
}
