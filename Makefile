# stratagem: `make demo` and `make test` are all a fresh machine needs.
BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
DEB_PACKAGES := openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools libeigen3-dev \
                libboost-test-dev nlohmann-json3-dev python3-torch python3-h5py python3-numpy \
                libopenblas0-pthread python3-pil chromium cmake g++ make

.PHONY: deps build test test-long test-asan test-portability demo bench bench-gpu format clean fuzz fuzz-build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	else echo "make deps: all Debian packages present"; fi

$(BUILD)/Makefile:
	cmake -S . -B $(BUILD) $(CMAKE_ARGS)

build: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

# libFuzzer targets (test/fuzz/): built with clang++-14 in $(BUILD)-fuzz; `make test` builds
# them here so that its fuzz.smoke test only runs them.
FUZZ_SECONDS ?= 600
fuzz-build:
	@if command -v clang++-14 >/dev/null; then FUZZ_BUILD=$(CURDIR)/$(BUILD)-fuzz JOBS=$(JOBS) \
	  bash test/fuzz/run.sh build; else echo "fuzz: skipped: clang++-14 not found"; fi

fuzz: deps
	FUZZ_BUILD=$(CURDIR)/$(BUILD)-fuzz JOBS=$(JOBS) bash test/fuzz/run.sh run $(FUZZ_SECONDS)

test: deps build fuzz-build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE long $(CTEST_ARGS)

# The long tests: all 100 kill points (several minutes).
test-long: deps build
	cd $(BUILD) && ctest --output-on-failure -L long $(CTEST_ARGS)

test-asan: deps
	$(MAKE) build BUILD=build-asan CMAKE_ARGS="-DSTRATAGEM_ASAN=ON"
	cd build-asan && ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) \
	  -L 'unit|mpi|runtime' -LE long $(CTEST_ARGS)

# The runtime and reference tests built for other instruction sets and run on other OpenBLAS
# kernel paths (test/support/portability.sh): about an hour on 2 cores.
test-portability: deps
	BUILD=$(BUILD) JOBS=$(JOBS) bash test/support/portability.sh

demo: deps build
	STRATAGEM_BIN=$(CURDIR)/$(BUILD)/stratagem bash jobs/demo.sh

bench: deps build
	STRATAGEM_BIN=$(CURDIR)/$(BUILD)/stratagem bash test/bench/run.sh

# Training throughput and MFU on one GPU beside the simulator's forecast (test/gpu/bench_gpu.sh);
# says "skipped" without a GPU. On the GPU machine, test/gpu/check.sh runs it with the rest.
bench-gpu: deps build
	STRATAGEM_BIN=$(CURDIR)/$(BUILD)/stratagem bash test/gpu/bench_gpu.sh

format:
	find src include sim test -name '*.[ch]pp' -o -name '*.cu' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(BUILD)-fuzz build-asan $(BUILD)-port-*
