# hakmem: top-level commands.  `make` builds build/libhakmem.so and
# build/libhakmem.a; `make test` runs every test; `make bench` compares
# hakmem with its peers.
CMAKE_GEN := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
JOBS ?= 2

.PHONY: all release debug observe secure ubsan tsan clang install test test-release test-debug test-observe test-secure test-ubsan test-tsan test-clang deps clean

all: release

release:
	cmake -S . -B build $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build -j $(JOBS)

debug:
	cmake -S . -B build-debug $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Debug -DHAK_DEBUG=ON -DHAK_VALGRIND=ON >/dev/null
	cmake --build build-debug -j $(JOBS)

# The observing build: per-operation counters in the statistics
# (build-observe/libhakmem.so; HAKMEM_STATS=on shows them).
observe:
	cmake -S . -B build-observe $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release -DHAK_OBSERVE=ON >/dev/null
	cmake --build build-observe -j $(JOBS)

# The hardened drop-in: build/libhakmem-secure.so (docs/DESIGN.md, "secure").
secure:
	cmake -S . -B build $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build -j $(JOBS) --target hakmem_secure

# Every library hardened, for the whole test suite (build-secure/).
secure-all:
	cmake -S . -B build-secure $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release -DHAK_SECURE=ON >/dev/null
	cmake --build build-secure -j $(JOBS)

ubsan:
	cmake -S . -B build-ubsan $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHAK_SANITIZE=undefined >/dev/null
	cmake --build build-ubsan -j $(JOBS)

tsan:
	cmake -S . -B build-tsan $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHAK_SANITIZE=thread >/dev/null
	cmake --build build-tsan -j $(JOBS)

clang:
	cmake -S . -B build-clang $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
	cmake --build build-clang -j $(JOBS)

# make install [PREFIX=/usr/local] [DESTDIR=staging dir]: the release build's
# libraries (libhakmem.so with its soname links, libhakmem.a,
# libhakmem-secure.so), include/hakmem.h, hakmem.pc, the CMake package and the
# hakmem command (README.md, "Install").
PREFIX ?= /usr/local
install: release
	DESTDIR="$(DESTDIR)" cmake --install build --prefix "$(PREFIX)"

deps:
	bash scripts/install-deps.sh test

# Release (gcc and clang), debug and secure run the whole suite; UBSan the
# whole suite too; TSan the multi-thread tests through the hak_* API (label
# "tsan"); the observing build the statistics tests (label "observe").
test: deps
	$(MAKE) test-release test-clang test-debug test-secure test-observe test-ubsan test-tsan test-fuzz

test-release: release
	cd build && ctest --output-on-failure -j $(JOBS)

test-debug: debug
	cd build-debug && ctest --output-on-failure -j $(JOBS)

test-observe: observe
	cd build-observe && ctest --output-on-failure -j $(JOBS) -L observe

test-secure: secure-all
	cd build-secure && ctest --output-on-failure -j $(JOBS)

test-ubsan: ubsan
	cd build-ubsan && ctest --output-on-failure -j $(JOBS) -L ubsan

test-tsan: tsan
	cd build-tsan && ctest --output-on-failure -j $(JOBS) -L tsan

test-clang: clang
	cd build-clang && ctest --output-on-failure -j $(JOBS)

# The long set of real programs (the quick set is in make test): those of
# make test again, and redis-server driven by redis-cli and redis-benchmark.
.PHONY: test-real
test-real: release
	bash scripts/install-deps.sh real
	cd build && ctest --output-on-failure -R '^real_'
	python3 tests/real/run_real.py --lib build/libhakmem.so --work build/tests/real_work/redis redis

# Fuzzing (tests/fuzz/README.md): the libFuzzer target build-fuzz/fuzz_hak,
# built with clang by tests/fuzz/Makefile.  test-fuzz (part of make test) runs
# the committed corpus once, then FUZZ_TEST_SECONDS of fuzzing, and the
# corpus once more on the secure build (build-fuzz-secure); make fuzz runs
# FUZZ_SECONDS, keeping new inputs in build-fuzz/corpus; make fuzz-merge
# minimizes them into tests/fuzz/corpus.  Any finding fails the target.
.PHONY: fuzz-build test-fuzz fuzz fuzz-merge
FUZZ_SECONDS ?= 600
FUZZ_TEST_SECONDS ?= 60
fuzz-build:
	$(MAKE) -C tests/fuzz build

test-fuzz:
	$(MAKE) -C tests/fuzz test FUZZ_TEST_SECONDS=$(FUZZ_TEST_SECONDS)
	$(MAKE) -C tests/fuzz replay FUZZ_DEFS=-DHAK_SECURE=1 FUZZ_OUT=$(CURDIR)/build-fuzz-secure

fuzz: deps
	$(MAKE) -C tests/fuzz fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)

fuzz-merge:
	$(MAKE) -C tests/fuzz merge

clean:
	rm -rf build build-debug build-observe build-secure build-ubsan build-tsan build-clang build-fuzz build-fuzz-secure

# Benchmarks (bench/): hakmem side by side with its peers, same binaries via
# LD_PRELOAD, interleaved.
.PHONY: bench bench-instr
bench: release
	bash scripts/install-deps.sh bench
	python3 bench/compare.py

bench-instr: release
	bash scripts/install-deps.sh bench
	python3 bench/instr.py

# The same comparison in 3 runs of 0.5 s per cell (within 10 minutes on 2 cores).
.PHONY: bench-quick soak
bench-quick: release
	bash scripts/install-deps.sh bench
	python3 bench/compare.py --quick

# Memory: RSS after a 1 GiB phase is freed (and after malloc_trim), and the
# system calls of a long random_mixed run against a short one (strace); about
# 2 minutes.  MEMORY_ARGS adds flags, e.g. MEMORY_ARGS="--only-rss --runs 5".
.PHONY: bench-memory
bench-memory: release
	bash scripts/install-deps.sh bench
	python3 bench/memory.py $(MEMORY_ARGS)

# Real programs (python3, gcc, sqlite3, sort, a C++ program) under hakmem and
# each peer, interleaved: whole-process time and peak RSS, output checked
# against glibc's; about 10 minutes.  REAL_ARGS adds flags, e.g.
# REAL_ARGS="--only hakmem,glibc --workloads sqlite3,sort-8M --runs 3".
.PHONY: bench-real
bench-real: release
	bash scripts/install-deps.sh bench
	python3 bench/real.py $(REAL_ARGS)

# random_mixed under hakmem for DURATION seconds (default 600), RSS and
# throughput sampled every second; not part of `make bench`.  SOAK_ARGS adds
# flags, e.g. SOAK_ARGS="--only hakmem,mimalloc --preset mixed-8k".
DURATION ?= 600
soak: release
	python3 bench/soak.py --duration $(DURATION) $(SOAK_ARGS)
