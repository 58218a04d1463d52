# Custody — see README.md. `make run` mounts a demo protected directory; `make test` runs every test.
SHELL := /bin/bash
SWIFT ?= swift
BUILD_FLAGS ?=
BIN := .build/debug
RELEASE_BIN := .build/release

# Debian packages: what building and testing need, and what `make bench` compares against.
BUILD_PACKAGES := pkg-config fuse3 libfuse3-dev libssl-dev libsodium-dev
TEST_PACKAGES := attr sqlite3 util-linux curl rsync git
BENCH_PACKAGES := gocryptfs fio sqlite3 curl python3

DEMO_DIR ?= $(if $(XDG_RUNTIME_DIR),$(XDG_RUNTIME_DIR)/custody-demo,$(CURDIR)/demo)

.PHONY: all deps bench-deps build release run test bench bench-format bench-wipe fuzz clean

all: build

# Installs whatever of the listed packages is missing (as root, or through sudo).
define install_missing
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

deps:
	$(call install_missing,$(BUILD_PACKAGES) $(TEST_PACKAGES))

bench-deps: deps
	$(call install_missing,$(BENCH_PACKAGES))

build: deps
	$(SWIFT) build $(BUILD_FLAGS)

release: deps
	$(SWIFT) build -c release $(BUILD_FLAGS)

# Mounts $(DEMO_DIR)/backing at $(DEMO_DIR)/Work in the foreground; Ctrl-C unmounts.
run: build
	@mkdir -p "$(DEMO_DIR)/backing" "$(DEMO_DIR)/Work" "$(DEMO_DIR)/state"
	@chmod 700 "$(DEMO_DIR)/state"
	@if grep -q " $(DEMO_DIR)/Work " /proc/self/mountinfo; then fusermount3 -uz "$(DEMO_DIR)/Work"; fi
	@echo "Custody demo: files written to $(DEMO_DIR)/Work are stored in $(DEMO_DIR)/backing."
	@echo "Use it from another terminal; press Ctrl-C here (or run 'fusermount3 -u $(DEMO_DIR)/Work') to stop."
	@echo "Control it with: CUSTODY_SOCKET=$(DEMO_DIR)/control.sock $(BIN)/custodyctl status"
	$(BIN)/custodyd --state "$(DEMO_DIR)/state" --socket "$(DEMO_DIR)/control.sock" "$(DEMO_DIR)/backing" "$(DEMO_DIR)/Work"

test: build
	$(SWIFT) test --disable-swift-testing $(BUILD_FLAGS)

bench: bench-deps release
	python3 bench/bench.py

# Selective wipe of a third of a 20,000-file tree (time to key destruction and to the end).
bench-wipe: release
	bash bench/wipe.sh 20000

# Throughput of the protected file format alone (release build, file in /dev/shm).
bench-format: release
	.build/release/custody-format-bench 256 /dev/shm

clean:
	rm -rf .build

# Fuzzes the header parser and block decoder with libFuzzer. FUZZ_SECONDS (default 600).
FUZZ_SECONDS ?= 600
fuzz: deps
	$(SWIFT) build -c release --scratch-path .build-fuzz --product custody-fuzz \
		--sanitize=fuzzer -Xswiftc -parse-as-library -Xswiftc -DFUZZING
	mkdir -p fuzz/corpus
	.build-fuzz/release/custody-fuzz fuzz/corpus -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=10 -print_final_stats=1
