# hakmem: top-level commands.  `make` builds build/libhakmem.so and
# build/libhakmem.a; `make test` runs every test; `make bench` compares
# hakmem with its peers.
CMAKE_GEN := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
JOBS ?= 2

.PHONY: all release debug ubsan tsan test test-release test-debug test-ubsan test-tsan deps clean

all: release

release:
	cmake -S . -B build $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build -j $(JOBS)

debug:
	cmake -S . -B build-debug $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=Debug -DHAK_DEBUG=ON >/dev/null
	cmake --build build-debug -j $(JOBS)

ubsan:
	cmake -S . -B build-ubsan $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHAK_SANITIZE=undefined >/dev/null
	cmake --build build-ubsan -j $(JOBS)

tsan:
	cmake -S . -B build-tsan $(CMAKE_GEN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHAK_SANITIZE=thread >/dev/null
	cmake --build build-tsan -j $(JOBS)

deps:
	bash scripts/install-deps.sh test

# Release and debug run the whole suite; UBSan the whole suite too; TSan the
# multi-thread tests through the hak_* API (label "tsan").
test: deps
	$(MAKE) test-release test-debug test-ubsan test-tsan

test-release: release
	cd build && ctest --output-on-failure -j $(JOBS)

test-debug: debug
	cd build-debug && ctest --output-on-failure -j $(JOBS)

test-ubsan: ubsan
	cd build-ubsan && ctest --output-on-failure -j $(JOBS) -L ubsan

test-tsan: tsan
	cd build-tsan && ctest --output-on-failure -j $(JOBS) -L tsan

clean:
	rm -rf build build-debug build-ubsan build-tsan

# Benchmarks (bench/): hakmem side by side with its peers, same binaries via
# LD_PRELOAD, interleaved.
.PHONY: bench bench-instr
bench: release
	bash scripts/install-deps.sh bench
	python3 bench/compare.py

bench-instr: release
	bash scripts/install-deps.sh bench
	python3 bench/instr.py
