// C++ runtime corners under hakmem: thread_local objects whose destructors
// allocate and free at thread exit, and exceptions thrown and caught in many
// threads at once (libstdc++ allocates each exception with malloc and keeps an
// emergency pool, itself allocated at start-up).  Linked with hakmem.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

static std::atomic<int> destructed{0};
static std::atomic<int> caught{0};
static std::atomic<int> failures{0};

struct PerThread {
  std::vector<std::string> words;
  ~PerThread() {
    // Allocates while the thread is being torn down.
    std::string joined;
    for (const auto& w : words) joined += w;
    std::vector<char> copy(joined.begin(), joined.end());
    if (copy.size() != joined.size()) failures++;
    destructed++;
  }
};

static thread_local PerThread per_thread;

static void work(int id) {
  for (int i = 0; i < 200; i++) per_thread.words.push_back(std::string(20 + i % 50, char('a' + id % 26)));
  for (int i = 0; i < 2000; i++) {
    try {
      if (i % 2 == 0) throw std::runtime_error(std::string(100 + i % 300, 'x'));
      throw std::vector<int>(i % 64 + 1, id);
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).size() != size_t(100 + i % 300)) failures++;
      caught++;
    } catch (const std::vector<int>& v) {
      if (v.size() != size_t(i % 64 + 1) || v[0] != id) failures++;
      caught++;
    }
  }
}

int main() {
  Dl_info info;
  void* sym = dlsym(RTLD_DEFAULT, "_Znwm");
  if (sym == nullptr || dladdr(sym, &info) == 0 || info.dli_fname == nullptr ||
      std::string(info.dli_fname).find("libhakmem") == std::string::npos) {
    std::fprintf(stderr, "test_cxx_tls: operator new is not hakmem's\n");
    return 1;
  }
  const int rounds = 10, threads = 8;
  for (int r = 0; r < rounds; r++) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++) pool.emplace_back(work, r * threads + t);
    for (auto& t : pool) t.join();
  }
  int want = rounds * threads;
  bool ok = destructed == want && caught == want * 2000 && failures == 0;
  if (!ok)
    std::fprintf(stderr, "test_cxx_tls: destructed %d/%d, caught %d/%d, failures %d\n",
                 destructed.load(), want, caught.load(), want * 2000, failures.load());
  std::printf("test_cxx_tls: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
