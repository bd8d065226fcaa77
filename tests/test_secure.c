/* The secure build (build/libhakmem-secure.so, linked in): each misuse is
 * reported in one line naming the fault and the address, then the program
 * aborts: double frees anywhere in the free lists (small, mid, large, from
 * another thread), frees of interior and stack pointers, a write past the end
 * of a block (the canary), a write into a freed block (an encoded link that
 * no longer decodes); guard pages after segment headers and around huge
 * blocks fault; fresh blocks come in random order and links are not stored
 * in the clear.  Each case runs in a child process. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "harness.h"
#include "test_util.h"

#define SEG_SIZE ((uintptr_t)2 << 20)

/* The address in the report is the block's: the child sends it through a
 * pipe before the faulty free. */
static int address_pipe = -1;
static void note_and_send(const void* p) {
  if (address_pipe < 0) return;
  char buf[64];
  int n = snprintf(buf, sizeof buf, "%p", p);
  if (write(address_pipe, buf, (size_t)n) != n) _exit(3);
  close(address_pipe);
}

/* The four cases glibc catches. */
static void double_free_small(void) {
  void* a = malloc(40);
  void* b = malloc(40);
  note_and_send(a);
  free(a);
  free(b); /* a is no longer the head of the free list */
  free(a);
}

static void double_free_mid(void) {
  void* a = malloc(5000);
  void* b = malloc(5000);
  void* c = malloc(5000);
  free(a);
  free(b);
  free(c);
  free(a);
}

static void free_interior(void) {
  char* p = malloc(100);
  free(p + 16);
}

static void free_stack(void) {
  int x[4];
  void* volatile p = x;
  free(p);
}

/* A large block (single-block page) freed twice with other frees between. */
static void double_free_large(void) {
  void* a = malloc(300 << 10);
  void* b = malloc(300 << 10);
  free(a);
  free(b);
  free(a);
}

static void* free_one(void* p) {
  free(p);
  return NULL;
}

/* Freed by another thread, then again by its owner after other frees. */
static void double_free_remote(void) {
  void* a = malloc(64);
  void* b = malloc(64);
  pthread_t t;
  pthread_create(&t, NULL, free_one, a);
  pthread_join(t, NULL);
  free(b);
  free(a);
}

/* One byte written past the usable end of a small and of a mid block. */
static void overflow_small(void) {
  char* p = hak_launder(malloc(24)); /* (hidden from UBSan's object-size check) */
  p[malloc_usable_size(p)] = 'x';
  free(p);
}

static void overflow_mid(void) {
  char* p = hak_launder(malloc(3000));
  memset(p, 'y', malloc_usable_size(p) + 4);
  free(p);
}

/* A use after free plants a pointer in a freed block: taking the block out
 * of the free list follows the link, which no longer decodes. */
static void write_after_free(void) {
  void** p = malloc(64);
  void* q = malloc(64);
  free(p);
  *p = q; /* what an attacker would plant: a real block's address */
  void* volatile r = malloc(64);
  (void)r;
  void* volatile s = malloc(64);
  (void)s;
}

static void write_guard_after_header(void) {
  char* p = malloc(64);
  volatile char* guard = (char*)(((uintptr_t)p & ~(SEG_SIZE - 1)) + 4096);
  *guard = 1;
}

static void write_before_huge(void) {
  volatile char* p = hak_launder(malloc(3 << 20));
  p[-1] = 1;
}

static void write_after_huge(void) {
  char* p = hak_launder(malloc((3 << 20) + 100));
  volatile char* end = p + malloc_usable_size(p);
  end[-1] = 1; /* the last usable byte is fine */
  end[0] = 1;
}

/* A huge block whose run held a larger block before, and one grown in place
 * by realloc, still end at a guard (the arena keeps guards in place across
 * blocks and moves the tail guard). */
static void write_after_reused_huge(void) {
  free(hak_launder(malloc(9 << 20)));
  char* p = hak_launder(malloc((3 << 20) + 100));
  volatile char* end = p + malloc_usable_size(p);
  end[-1] = 1;
  end[0] = 1;
}

static void write_after_grown_huge(void) {
  char* p = hak_launder(malloc(3 << 20));
  p = hak_launder(realloc(p, 7 << 20));
  volatile char* end = p + malloc_usable_size(p);
  end[-1] = 1;
  end[0] = 1;
}

static void check_reported(const char* name, void (*fn)(void), const char* fault) {
  char err[1024];
  int status = hak_run_child(fn, err, sizeof err);
  if (!(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT)) {
    fprintf(stderr, "%s: child did not abort (status %d), stderr: %s\n", name, status, err);
    hak_test_failures++;
    return;
  }
  /* The address by its form here; by value in check_address_named. */
  if (strncmp(err, "hakmem: ", 8) != 0 || strstr(err, fault) == NULL || strstr(err, " 0x") == NULL ||
      strchr(err, '\n') != err + strlen(err) - 1) {
    fprintf(stderr, "%s: expected one line \"hakmem: %s 0x...\", got: %s\n", name, fault, err);
    hak_test_failures++;
  }
}

static void check_segv(const char* name, void (*fn)(void)) {
  char err[256];
  int status = hak_run_child(fn, err, sizeof err);
  if (!(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV)) {
    fprintf(stderr, "%s: expected a fault on a guard page (status %d), stderr: %s\n", name, status, err);
    hak_test_failures++;
  }
}



/* The report of a non-head double free names the block's address. */
static void check_address_named(void) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  address_pipe = fds[1];
  char err[512];
  int status = hak_run_child(double_free_small, err, sizeof err);
  close(fds[1]);
  address_pipe = -1;
  char addr[64];
  hak_read_all(fds[0], addr, sizeof addr);
  CHECK(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
  char want[128];
  snprintf(want, sizeof want, "hakmem: double free of %s (class ", addr);
  if (addr[0] == 0 || strncmp(err, want, strlen(want)) != 0) {
    fprintf(stderr, "double-free address: expected \"%s...\", got: %s\n", want, err);
    hak_test_failures++;
  }
}

/* Fresh blocks of a page come in random order: of 64 fresh 48-byte blocks,
 * few follow the one before at the next address (all would, carved in
 * order), and two processes (each drawing its secrets) see different orders.
 * Blocks of 8 KiB, carved a few at a time (so that a page does not commit
 * many blocks ahead of use), are shuffled too. */
static void print_order(size_t size, int count) {
  char* first = malloc(size);
  size_t block = malloc_usable_size(first) + 8; /* the canary's word */
  char line[64 * 8];
  size_t len = 0;
  int in_order = 0;
  char* prev = first;
  for (int i = 0; i < count; i++) {
    char* p = malloc(size);
    if (p == prev + block) in_order++;
    len += (size_t)snprintf(line + len, sizeof line - len, "%d ", (int)((p - first) / (ptrdiff_t)block));
    prev = p;
  }
  printf("%d|%s\n", in_order, line);
}

static void check_random_order(const char* mode, int count, int most) {
  char a[1024], b[1024];
  CHECK(hak_run_self(mode, NULL, a, sizeof a) == 0);
  CHECK(hak_run_self(mode, NULL, b, sizeof b) == 0);
  int in_order = atoi(a);
  if (in_order > most) {
    fprintf(stderr, "random order (%s): %d of %d fresh blocks followed the previous one\n", mode, in_order, count);
    hak_test_failures++;
  }
  if (strcmp(a, b) == 0) {
    fprintf(stderr, "random order (%s): two processes carved the same order: %s\n", mode, a);
    hak_test_failures++;
  }
}

/* A freed block's link is not the next block's address in the clear. */
static void check_links_encoded(void) {
  void** p = malloc(64);
  void** q = malloc(64);
  free(q);
  free(p);                    /* p links to q */
  uintptr_t link = *(volatile uintptr_t*)p; /* a deliberate read after free */
  CHECK(link != (uintptr_t)q);
  CHECK(link != 0);
  CHECK(malloc(64) == (void*)p);
  CHECK(malloc(64) == (void*)q);
}

/* Ordinary use stays intact: usable sizes hold their bytes, realloc keeps
 * content, huge blocks come and go. */
static void check_ordinary_use(void) {
  for (size_t n = 1; n <= (1 << 20); n = n * 3 + 1) {
    unsigned char* p = malloc(n);
    REQUIRE(p != NULL);
    size_t u = malloc_usable_size(p);
    CHECK(u >= n);
    memset(p, 0xab, u);
    size_t m = n * 2 + 5, kept = u < m ? u : m;
    p = realloc(p, m);
    REQUIRE(p != NULL);
    CHECK(p[0] == 0xab && p[kept - 1] == 0xab);
    free(p);
  }
  for (int i = 0; i < 20; i++) {
    char* h = malloc((size_t)(4 + i % 3) << 20);
    REQUIRE(h != NULL);
    memset(h, 1, malloc_usable_size(h));
    free(h);
  }
  /* Just below the largest block that is not huge, with the canary (the
   * fuzzer's finding: such a block became huge and its free aborted). */
  for (size_t n = 1; n <= 32; n++) {
    void* b = aligned_alloc((size_t)1 << 20, n);
    CHECK(b != NULL && ((uintptr_t)b & (((size_t)1 << 20) - 1)) == 0 && malloc_usable_size(b) >= n);
    free(b);
  }
  /* Huge blocks laid over the guards earlier ones left in the arena (kept
   * in place while their granules are free) can use every usable byte: a
   * block grown in place over a freed neighbour's granules, and one over
   * many freed blocks. */
  char* h[8];
  for (int i = 0; i < 8; i++) {
    h[i] = malloc(3 << 20);
    REQUIRE(h[i] != NULL);
    hak_pattern_fill(h[i], 3 << 20, (uint64_t)i);
  }
  free(h[1]);
  char* g = realloc(h[0], 7 << 20);
  REQUIRE(g != NULL);
  CHECK(hak_pattern_check(g, 3 << 20, 0) == 3 << 20);
  memset(g, 9, malloc_usable_size(g));
  free(g);
  for (int i = 2; i < 8; i++) free(h[i]);
  char* all = malloc(40 << 20);
  REQUIRE(all != NULL);
  memset(all, 3, malloc_usable_size(all));
  free(all);
  void* a = aligned_alloc(4096, 4096);
  CHECK(a != NULL && ((uintptr_t)a & 4095) == 0);
  memset(a, 2, malloc_usable_size(a));
  free(a);
}

static void check_guards(void) {
  check_segv("guard-after-header", write_guard_after_header);
  check_segv("guard-before-huge", write_before_huge);
  check_segv("guard-after-huge", write_after_huge);
  check_segv("guard-after-reused-huge", write_after_reused_huge);
  check_segv("guard-after-grown-huge", write_after_grown_huge);
}

/* Whether the page after a segment's header is a mapping of its own
 * (mprotect) rather than a guard marker inside the segment's mapping. */
static bool header_guard_is_mapping(void) {
  char* p = malloc(64);
  uintptr_t guard = ((uintptr_t)p & ~(uintptr_t)(SEG_SIZE - 1)) + 4096;
  free(p);
  FILE* f = fopen("/proc/self/maps", "r");
  char line[512];
  bool found = false;
  while (f != NULL && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo == guard && strcmp(perms, "---p") == 0) found = true;
  }
  if (f != NULL) fclose(f);
  return found;
}

/* The guards, seen from a process of their own (argv[1] "guards"; argv[2]
 * "mapping" or "marker": what the header's guard must be). */
static int run_guard_checks(const char* expect) {
  CHECK(header_guard_is_mapping() == (strcmp(expect, "mapping") == 0));
  check_guards();
  check_ordinary_use();
  return hak_test_result(expect);
}

/* On a kernel without guard markers (before Linux 6.13: madvise refuses
 * MADV_GUARD_INSTALL, here by a seccomp filter) the guards are mprotect's,
 * and hold the same. */
static void check_guards_without_markers(void) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_madvise, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 102 /* MADV_GUARD_INSTALL */, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof filter / sizeof filter[0]), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
      _exit(77);
    execl("/proc/self/exe", "test_secure", "guards", "mapping", (char*)NULL);
    _exit(4);
  }
  int status;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
    fprintf(stderr, "test_secure: note: no seccomp here, guards without markers not checked\n");
    return;
  }
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
    fprintf(stderr, "guards without markers: child status %d\n", status);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(int argc, char** argv) {
  if (argc > 2 && strcmp(argv[1], "guards") == 0) return run_guard_checks(argv[2]);
  if (argc > 1 && strcmp(argv[1], "order") == 0) {
    print_order(48, 64);
    return 0;
  }
  if (argc > 1 && strcmp(argv[1], "order-8k") == 0) {
    print_order(8192, 64);
    return 0;
  }
  check_reported("double-free-small", double_free_small, "double free of");
  check_reported("double-free-mid", double_free_mid, "double free of");
  check_reported("interior", free_interior, "invalid pointer");
  check_reported("stack", free_stack, "not allocated by hakmem");
  check_reported("double-free-large", double_free_large, "double free of");
  check_reported("double-free-remote", double_free_remote, "double free of");
  check_reported("overflow-small", overflow_small, "write past the end of the block");
  check_reported("overflow-mid", overflow_mid, "write past the end of the block");
  check_reported("write-after-free", write_after_free, "corrupted free list");
  check_guards();
  check_guards_without_markers();
  check_address_named();
  check_random_order("order", 64, 16);
  check_random_order("order-8k", 64, 48);
  check_links_encoded();
  check_ordinary_use();
  return hak_test_result("test_secure");
}
