// A C++ library that a C program (test_cxx_late) loads with dlopen after
// start-up: its operator new is hakmem's, bound before libstdc++ came.
#include <cstddef>
#include <new>

static int handler_calls;

static void count_and_give_up() {
  handler_calls++;
  std::set_new_handler(nullptr);
}

// 1 if operator new of size bytes throws std::bad_alloc.
extern "C" int plugin_new_throws(std::size_t size) {
  try {
    ::operator delete(::operator new(size));
    return 0;
  } catch (const std::bad_alloc&) {
    return 1;
  }
}

// How many times the nothrow operator new of size bytes called the
// new_handler (which gives up after its first call) before it returned
// NULL; -1 if it returned a block.
extern "C" int plugin_nothrow_handler_calls(std::size_t size) {
  handler_calls = 0;
  std::set_new_handler(count_and_give_up);
  void* p = ::operator new(size, std::nothrow);
  std::set_new_handler(nullptr);
  if (p != nullptr) {
    ::operator delete(p);
    return -1;
  }
  return handler_calls;
}
