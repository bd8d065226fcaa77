// test_cxx: every form of the global operator new/delete resolves into
// hakmem and works (plain, array, nothrow, sized, aligned, sized+aligned,
// nothrow+aligned); failures go through the new_handler and end in
// std::bad_alloc or nullptr; the standard containers and std::thread run on
// top of it.
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "harness.h"
#include "test_util.h"

namespace {

const char* const kOperators[] = {
    "_Znwm",
    "_Znam",
    "_ZnwmRKSt9nothrow_t",
    "_ZnamRKSt9nothrow_t",
    "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t",
    "_ZnwmSt11align_val_tRKSt9nothrow_t",
    "_ZnamSt11align_val_tRKSt9nothrow_t",
    "_ZdlPv",
    "_ZdaPv",
    "_ZdlPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t",
    "_ZdlPvm",
    "_ZdaPvm",
    "_ZdlPvSt11align_val_t",
    "_ZdaPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t",
    "_ZdaPvmSt11align_val_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t",
    "_ZdaPvSt11align_val_tRKSt9nothrow_t",
};

void fill_check(void* p, size_t n, uint64_t key, const char* what) {
  if (p == nullptr) {
    std::fprintf(stderr, "check failed: %s(%zu) returned nullptr\n", what, n);
    hak_test_failures++;
    return;
  }
  hak_pattern_fill(p, n, key);
  if (hak_pattern_check(p, n, key) != n) {
    std::fprintf(stderr, "check failed: %s(%zu) block does not hold content\n", what, n);
    hak_test_failures++;
  }
}

void test_symbols() {
  HAK_REQUIRE_SYMBOL_IN_HAKMEM("_Znwm");
  for (const char* s : kOperators) HAK_REQUIRE_SYMBOL_IN_HAKMEM(s);
}

void test_plain_forms() {
  static const size_t sizes[] = {0, 1, 24, 1000, 4096, 100000, (size_t)5 << 20};
  for (size_t n : sizes) {
    void* p = ::operator new(n);
    CHECK(p != nullptr && hak_is_aligned(p, __STDCPP_DEFAULT_NEW_ALIGNMENT__));
    fill_check(p, n, 1, "operator new");
    ::operator delete(p);

    p = ::operator new(n);
    fill_check(p, n, 2, "operator new");
    ::operator delete(p, n);

    p = ::operator new[](n);
    CHECK(p != nullptr && hak_is_aligned(p, __STDCPP_DEFAULT_NEW_ALIGNMENT__));
    fill_check(p, n, 3, "operator new[]");
    ::operator delete[](p);

    p = ::operator new[](n);
    fill_check(p, n, 4, "operator new[]");
    ::operator delete[](p, n);

    p = ::operator new(n, std::nothrow);
    CHECK(p != nullptr);
    fill_check(p, n, 5, "operator new(nothrow)");
    ::operator delete(p, std::nothrow);

    p = ::operator new[](n, std::nothrow);
    CHECK(p != nullptr);
    fill_check(p, n, 6, "operator new[](nothrow)");
    ::operator delete[](p, std::nothrow);
  }
  // Zero-size requests give distinct pointers.
  void* a = ::operator new(0);
  void* b = ::operator new(0);
  CHECK(a != b);
  ::operator delete(a);
  ::operator delete(b);
  ::operator delete(nullptr);
  ::operator delete[](nullptr);
  ::operator delete(nullptr, std::align_val_t(64));

  // New-expressions.
  int* one = new int(42);
  hak_escape(one);
  CHECK(*one == 42);
  delete one;
  int* arr = new int[1000]();
  hak_escape(arr);
  CHECK(std::all_of(arr, arr + 1000, [](int v) { return v == 0; }));
  delete[] arr;
}

struct alignas(64) Over64 {
  unsigned char b[100];
};
struct alignas(4096) OverPage {
  unsigned char b[5000];
};
struct Tracked {
  std::string s;
  ~Tracked() {}
};

void test_aligned_forms() {
  for (size_t a = 16; a <= ((size_t)1 << 20); a <<= 1) {
    const size_t sizes[] = {1, a, 3 * a + 5, 100000};
    std::align_val_t al{a};
    for (size_t n : sizes) {
      void* p = ::operator new(n, al);
      if (!hak_is_aligned(p, a)) {
        std::fprintf(stderr, "check failed: operator new(%zu, align %zu) = %p\n", n, a, p);
        hak_test_failures++;
      }
      fill_check(p, n, a + 1, "aligned operator new");
      ::operator delete(p, al);

      p = ::operator new[](n, al);
      CHECK(hak_is_aligned(p, a));
      fill_check(p, n, a + 2, "aligned operator new[]");
      ::operator delete[](p, al);

      p = ::operator new(n, al);
      CHECK(hak_is_aligned(p, a));
      fill_check(p, n, a + 3, "aligned operator new");
      ::operator delete(p, n, al);

      p = ::operator new[](n, al);
      CHECK(hak_is_aligned(p, a));
      fill_check(p, n, a + 4, "aligned operator new[]");
      ::operator delete[](p, n, al);

      p = ::operator new(n, al, std::nothrow);
      CHECK(p != nullptr && hak_is_aligned(p, a));
      fill_check(p, n, a + 5, "aligned nothrow operator new");
      ::operator delete(p, al, std::nothrow);

      p = ::operator new[](n, al, std::nothrow);
      CHECK(p != nullptr && hak_is_aligned(p, a));
      fill_check(p, n, a + 6, "aligned nothrow operator new[]");
      ::operator delete[](p, al, std::nothrow);
    }
  }
  // Over-aligned types through new-expressions.
  Over64* o = new Over64[37];
  hak_escape(o);
  CHECK(hak_is_aligned(o, 64));
  std::memset(o, 1, sizeof(Over64) * 37);
  delete[] o;
  OverPage* pg = new OverPage;
  hak_escape(pg);
  CHECK(hak_is_aligned(pg, 4096));
  std::memset(pg, 2, sizeof *pg);
  delete pg;
  Tracked* t = new Tracked[10];
  for (int i = 0; i < 10; i++) t[i].s = std::string(100 + i, 'a');
  delete[] t;
}

// A size no allocator can provide.
volatile size_t g_huge = (size_t)1 << 62;
int g_handler_calls;

void handler_uninstalls_after_3() {
  if (++g_handler_calls >= 3) std::set_new_handler(nullptr);
}
void handler_throws_after_2() {
  if (++g_handler_calls >= 2) throw std::bad_alloc();
}

void test_new_handler() {
  // The handler is called until it uninstalls itself; then bad_alloc.
  g_handler_calls = 0;
  std::set_new_handler(handler_uninstalls_after_3);
  bool caught = false;
  try {
    char* p = new char[g_huge];
    hak_escape(p);
    delete[] p;
  } catch (const std::bad_alloc&) {
    caught = true;
  }
  CHECK(caught);
  CHECK(g_handler_calls == 3);
  CHECK(std::get_new_handler() == nullptr);

  // The handler throws bad_alloc itself.
  g_handler_calls = 0;
  std::set_new_handler(handler_throws_after_2);
  caught = false;
  try {
    void* p = ::operator new(g_huge);
    hak_escape(p);
    ::operator delete(p);
  } catch (const std::bad_alloc&) {
    caught = true;
  }
  CHECK(caught);
  CHECK(g_handler_calls == 2);

  // Aligned new goes through the handler too.
  g_handler_calls = 0;
  std::set_new_handler(handler_uninstalls_after_3);
  caught = false;
  try {
    void* p = ::operator new(g_huge, std::align_val_t(4096));
    hak_escape(p);
    ::operator delete(p, std::align_val_t(4096));
  } catch (const std::bad_alloc&) {
    caught = true;
  }
  CHECK(caught);
  CHECK(g_handler_calls == 3);

  // nothrow forms with a handler: the handler runs, then nullptr.
  g_handler_calls = 0;
  std::set_new_handler(handler_uninstalls_after_3);
  void* p = ::operator new(g_huge, std::nothrow);
  CHECK(p == nullptr);
  CHECK(g_handler_calls == 3);
  // A handler that throws inside a nothrow form: the form still returns
  // nullptr (it must not let the exception escape its noexcept frame, which
  // would terminate the program; run in a child so that the rest goes on).
  static const struct {
    const char* name;
    void* (*call)();
  } throwing_nothrow[] = {
      {"operator new(size, nothrow)", [] { return ::operator new(g_huge, std::nothrow); }},
      {"operator new[](size, nothrow)", [] { return ::operator new[](g_huge, std::nothrow); }},
      {"operator new(size, align, nothrow)",
       [] { return ::operator new(g_huge, std::align_val_t(64), std::nothrow); }},
      {"operator new[](size, align, nothrow)",
       [] { return ::operator new[](g_huge, std::align_val_t(64), std::nothrow); }},
  };
  for (const auto& t : throwing_nothrow) {
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      g_handler_calls = 0;
      std::set_new_handler(handler_throws_after_2);
      void* r = t.call();
      _exit(r == nullptr && g_handler_calls == 2 ? 0 : 3);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::fprintf(stderr,
                   "check failed: %s with a new_handler that throws bad_alloc: %s (want nullptr)\n",
                   t.name,
                   WIFSIGNALED(st) ? (WTERMSIG(st) == SIGABRT ? "std::terminate / abort"
                                                              : "killed by a signal")
                                   : "wrong result or handler call count");
      hak_test_failures++;
    }
  }
  std::set_new_handler(nullptr);

  // Without a handler: bad_alloc from every throwing form, nullptr from the
  // nothrow forms.
  int thrown = 0;
  try {
    char* q = new char[g_huge];
    hak_escape(q);
  } catch (const std::bad_alloc&) {
    thrown++;
  }
  try {
    hak_escape(::operator new(g_huge));
  } catch (const std::bad_alloc&) {
    thrown++;
  }
  try {
    hak_escape(::operator new(hak_opaque(SIZE_MAX)));
  } catch (const std::bad_alloc&) {
    thrown++;
  }
  try {
    hak_escape(::operator new[](g_huge, std::align_val_t(256)));
  } catch (const std::bad_alloc&) {
    thrown++;
  }
  // Rounding the size up to the alignment must not wrap around.
  try {
    hak_escape(::operator new(hak_opaque(SIZE_MAX - 100), std::align_val_t(1 << 20)));
    std::fprintf(stderr, "check failed: operator new(SIZE_MAX - 100, align 1 MiB) did not throw\n");
  } catch (const std::bad_alloc&) {
    thrown++;
  }
  CHECK(thrown == 5);
  CHECK(::operator new(g_huge, std::nothrow) == nullptr);
  CHECK(::operator new[](g_huge, std::nothrow) == nullptr);
  CHECK(::operator new(g_huge, std::align_val_t(32), std::nothrow) == nullptr);
  CHECK(::operator new[](hak_opaque(SIZE_MAX), std::align_val_t(32), std::nothrow) == nullptr);

  // Allocation works again afterwards.
  std::vector<int> v(1000, 7);
  CHECK(v[999] == 7);
}

// A deterministic workload of strings and maps; the same function runs in
// threads and in the main thread, and the results must agree.
struct Result {
  uint64_t sum = 0;
  std::vector<std::string> keep;  // freed by another thread
};

Result workload(int seed) {
  Result r;
  hak_rng g;
  hak_rng_seed(&g, (uint64_t)seed);
  std::map<std::string, std::vector<int>> m;
  std::unordered_map<uint64_t, std::string> um;
  for (int i = 0; i < 20000; i++) {
    uint64_t x = hak_rng_next(&g);
    std::string k = "key-" + std::to_string(x % 5000);
    m[k].push_back((int)(x & 0xffff));
    um[x % 7919] = std::string((size_t)(x % 200), (char)('a' + x % 26));
    if (i % 500 == 0) r.keep.push_back(k + std::string((size_t)(x % 3000), 'z'));
  }
  for (auto& kv : m) {
    r.sum = r.sum * 31 + kv.first.size();
    for (int v : kv.second) r.sum += (uint64_t)v;
  }
  for (auto& kv : um) r.sum ^= hak_mix64(kv.first + kv.second.size());
  try {
    throw std::runtime_error(std::string(500, 'e'));
  } catch (const std::runtime_error& e) {
    r.sum += std::strlen(e.what());
  }
  return r;
}

void test_containers_threads() {
  const int kThreads = 6;
  std::vector<Result> got(kThreads);
  std::vector<std::thread> th;
  for (int i = 0; i < kThreads; i++) th.emplace_back([i, &got] { got[i] = workload(i + 1); });
  for (auto& t : th) t.join();
  for (int i = 0; i < kThreads; i++) {
    Result want = workload(i + 1);
    CHECK(got[i].sum == want.sum);
    CHECK(got[i].keep == want.keep);
  }
  // Strings built by other threads are freed here.
  got.clear();
}

}  // namespace

int main() {
  test_symbols();
  test_plain_forms();
  test_aligned_forms();
  test_new_handler();
  test_containers_threads();
  return hak_test_result("test_cxx");
}
