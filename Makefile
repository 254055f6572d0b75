# colony — top-level wrapper around CMake.
#   make         build (RelWithDebInfo) into build/
#   make test    build + run every test through CTest (each with a timeout)
#   make demo    build the tour only (examples/tour) and run it
#   make install [PREFIX=dir]   install (default prefix: CMake's, /usr/local)
#   make bench   build + run the benchmarks side by side with Go (bench/run.sh)
#   make asan / make tsan / make ucontext   the sanitizer and fallback suites
#   make aarch64   cross-build for AArch64 and run every test under qemu-user
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all deps test demo bench asan tsan ucontext aarch64 install clean

all: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

deps:
	@sh scripts/deps.sh

test: all
	cd $(BUILD) && ctest --output-on-failure -j 2

# The tour needs only the library and itself; cmake's own make prints no
# directory lines and no progress when told so.
demo: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	@MAKEFLAGS= cmake --build $(BUILD) -j $(JOBS) --target tour -- --no-print-directory >$(BUILD)/demo-build.log 2>&1 || \
		{ cat $(BUILD)/demo-build.log; exit 1; }
	@"$(abspath $(BUILD))/tour"

bench: all
	-@sh scripts/deps.sh bench # the charts are optional: bench/plot.sh skips without gnuplot
	sh bench/run.sh $(BUILD)

asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DCMAKE_C_COMPILER=clang -DCOLONY_SANITIZE=address -DCOLONY_BUILD_BENCH=OFF"

tsan:
	$(MAKE) test BUILD=build-tsan CMAKE_FLAGS="-DCMAKE_C_COMPILER=clang -DCOLONY_SANITIZE=thread -DCOLONY_BUILD_BENCH=OFF"

ucontext:
	$(MAKE) test BUILD=build-ucontext CMAKE_FLAGS="-DCOLONY_UCONTEXT=ON -DCOLONY_BUILD_BENCH=OFF"

aarch64:
	@sh scripts/deps.sh aarch64
	$(MAKE) test BUILD=build-aarch64 CMAKE_FLAGS="-DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/cmake/aarch64-linux-gnu.cmake -DCOLONY_BUILD_BENCH=OFF"

install: all
	cmake --install $(BUILD) $(if $(PREFIX),--prefix "$(PREFIX)")

clean:
	rm -rf build build-asan build-tsan build-ucontext build-aarch64
