// cxx_workload: a multi-threaded C++ program with deterministic output,
// run as is and under LD_PRELOAD=libhakmem.so (it is not linked with hakmem).
// Worker threads build std::map, std::unordered_map, std::string and
// std::vector data and print checksums; strings also travel between threads
// through a queue, so that they are freed by a thread other than their
// allocator.
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

uint64_t fnv(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 2654435761u + 12345) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

// A bounded queue of strings shared by all workers.
class Queue {
 public:
  void push(std::unique_ptr<std::string> s) {
    std::unique_lock<std::mutex> l(m_);
    full_.wait(l, [this] { return q_.size() < 256; });
    q_.push_back(std::move(s));
    empty_.notify_one();
  }
  std::unique_ptr<std::string> pop() {
    std::unique_lock<std::mutex> l(m_);
    empty_.wait(l, [this] { return !q_.empty(); });
    auto s = std::move(q_.front());
    q_.pop_front();
    full_.notify_one();
    return s;
  }

 private:
  std::mutex m_;
  std::condition_variable full_, empty_;
  std::deque<std::unique_ptr<std::string>> q_;
};

struct Out {
  uint64_t map_sum = 0, umap_sum = 0, str_sum = 0, queue_sum = 0;
  size_t map_size = 0, umap_size = 0;
};

void worker(int id, int rounds, Queue& q, Out& out) {
  Rng r((uint64_t)id + 1);
  std::map<std::string, std::vector<int>> m;
  std::unordered_map<uint64_t, std::string> um;
  std::string text;
  for (int i = 0; i < 150000; i++) {
    uint64_t x = r.next();
    std::string key = "k" + std::to_string(x % 9973) + "-" + std::to_string(id);
    auto& v = m[key];
    v.push_back((int)(x & 0xfff));
    if (v.size() > 20) v.erase(v.begin(), v.begin() + 10);
    um[x % 4099] += std::string(1 + x % 7, (char)('a' + x % 26));
    if (um[x % 4099].size() > 300) um.erase(x % 4099);
    if (i % 7 == 0) text += key;
    if (text.size() > 100000) text = text.substr(50000);
  }
  for (auto& kv : m) {
    out.map_sum = out.map_sum * 1000003 + fnv(kv.first);
    for (int v : kv.second) out.map_sum += (uint64_t)v;
  }
  // unordered_map iteration order is not fixed: combine commutatively.
  for (auto& kv : um) out.umap_sum += fnv(kv.second, kv.first);
  out.map_size = m.size();
  out.umap_size = um.size();
  out.str_sum = fnv(text);
  // Strings made here are freed by whichever thread pops them; the sum of
  // what everybody pops is order-independent.  Each thread alternates one
  // push and one pop, so the queue never holds more than one string per
  // thread and a pop always has something to wait for.
  for (int i = 0; i < rounds; i++) {
    uint64_t x = r.next();
    q.push(std::make_unique<std::string>((size_t)(x % 2000), (char)('A' + x % 26)));
    auto s = q.pop();
    out.queue_sum += s->size() * 31 + (unsigned char)(s->empty() ? 0 : (*s)[0]);
  }
}

}  // namespace

int main() {
  const int kThreads = 6;
  const int kPerThread = 20000;
  Queue q;
  std::vector<Out> outs(kThreads);
  std::vector<std::thread> th;
  for (int i = 0; i < kThreads; i++)
    th.emplace_back(worker, i, kPerThread, std::ref(q), std::ref(outs[i]));
  for (auto& t : th) t.join();
  uint64_t total = 0, queue_total = 0;
  for (int i = 0; i < kThreads; i++) {
    const Out& o = outs[i];
    std::printf("thread %d: map %zu %016llx umap %zu %016llx text %016llx\n", i, o.map_size,
                (unsigned long long)o.map_sum, o.umap_size, (unsigned long long)o.umap_sum,
                (unsigned long long)o.str_sum);
    total ^= o.map_sum ^ o.umap_sum ^ o.str_sum;
    queue_total += o.queue_sum;
  }
  std::printf("queue %llu\n", (unsigned long long)queue_total);
  std::printf("total %016llx\n", (unsigned long long)total);
  return 0;
}
