# Custody — see README.md. `make run` mounts a demo protected directory; `make test` runs every test.
SHELL := /bin/bash
SWIFT ?= swift
BUILD_FLAGS ?=
BIN := .build/debug
RELEASE_BIN := .build/release

# Debian packages: what building and testing need, and what `make bench` compares against.
BUILD_PACKAGES := pkg-config gcc fuse3 libfuse3-dev liburing-dev libsodium-dev libssl-dev libsystemd-dev libpam0g-dev libtss2-dev
TEST_PACKAGES := man-db lintian attr acl sqlite3 util-linux curl rsync git socat python3 python3-pip dbus python3-dbusmock pamtester swtpm swtpm-tools tpm2-tools
# From PyPI: the OpenAPI fuzzer scripts/checks/api-fuzz.sh runs against a live daemon, and ansible-core
# for the collection's tests (scripts/checks/ansible-test.sh).
PIP_TEST_PACKAGES := schemathesis==4.32.5 ansible-core==2.19.14
BENCH_PACKAGES := gocryptfs fio sqlite3 curl python3 gnuplot-nox libfuse3-dev

# promtool (which checks the metrics' format) from Debian's prometheus package, unpacked here
# rather than installed: installing the package would start a Prometheus server.
PROMTOOL := .build/tools/promtool

DEMO_DIR ?= $(if $(XDG_RUNTIME_DIR),$(XDG_RUNTIME_DIR)/custody-demo,$(CURDIR)/demo)

.PHONY: all deps pip-deps promtool bench-deps build release static run test test-unit soak test-install install uninstall man deb bench bench-guard bench-format bench-scale bench-wipe fuzz fuzz-http clean

# Where `make install` puts things (DESTDIR for staging).
PREFIX ?= /usr/local
DESTDIR ?=
SYSCONFDIR ?= /etc
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
MANDIR ?= $(PREFIX)/share/man
STATIC_BIN := .build-static/release
# The system's PAM module directory (Debian: /usr/lib/<triplet>/security).
PAMDIR ?= $(shell pkg-config --variable=libdir pam 2>/dev/null || echo /usr/lib)/security
CC ?= cc

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

# Python packages the tests use, installed for the python3 on the PATH when missing.
pip-deps:
	@python3 -c 'import schemathesis, ansible' 2>/dev/null || { echo "installing from PyPI: $(PIP_TEST_PACKAGES)"; \
		python3 -m pip install --quiet $(PIP_TEST_PACKAGES) 2>/dev/null || python3 -m pip install --quiet --break-system-packages $(PIP_TEST_PACKAGES); }

bench-deps: deps
	$(call install_missing,$(BENCH_PACKAGES))

build: deps $(BIN)/pam_custody.so
	$(SWIFT) build $(BUILD_FLAGS)

# The PAM module (C: it is loaded into login, sshd, gdm …, which carry no Swift runtime).
$(BIN)/pam_custody.so: pam/pam_custody.c | deps
	@mkdir -p $(BIN)
	$(CC) -O2 -g -Wall -Wextra -Werror -fPIC -shared -fvisibility=default -o $@ $< -lpam

release: deps
	$(SWIFT) build -c release $(BUILD_FLAGS)

# Mounts $(DEMO_DIR)/backing at $(DEMO_DIR)/Work in the foreground with a demo managed account
# (scripts/demo.sh); Ctrl-C unmounts. A second run reuses the demo state.
run: build
	@bash scripts/demo.sh "$(BIN)" "$(DEMO_DIR)"

test: build pip-deps $(PROMTOOL)
	$(SWIFT) test --disable-swift-testing $(BUILD_FLAGS)
	$(SWIFT) test --package-path Client --disable-swift-testing $(BUILD_FLAGS)
	bash scripts/checks/client-package.sh $(SWIFT)
	$(BIN)/custody-fuzz-http fuzz/http
	bash scripts/checks/api-fuzz.sh
	bash scripts/checks/man-test.sh $(BIN)
	bash scripts/checks/ansible-test.sh $(BIN)
	$(MAKE) --no-print-directory test-install
	bash scripts/checks/deb-test.sh

# The unit tests alone (no mounts, no daemons, nothing installed): the quick loop while working.
test-unit: build
	$(SWIFT) test --disable-swift-testing $(BUILD_FLAGS) --skip IntegrationTests
	$(SWIFT) test --package-path Client --disable-swift-testing $(BUILD_FLAGS)

# The mount and lifecycle test classes again and again (scripts/checks/soak.sh; not part of `make test`):
# SOAK_ROUNDS rounds (default 20), each failure reported with its log.
soak: build
	bash scripts/checks/soak.sh

# Man pages from the argument parser's definitions (swift-argument-parser's generate-manual
# plugin): custodyctl(1) and custodyd(8) into man/ (blank lines become paragraph breaks, which
# mdoc wants); custody.toml(5) is written by hand there.
# scripts/checks/man-test.sh checks in `make test` that they say what --help says.
MAN_DATE ?= $(shell git log -1 --format=%cs 2>/dev/null || date +%F)
MAN_OUT := .build/plugins/GenerateManual/outputs
man: build
	$(SWIFT) package plugin generate-manual --configuration debug --date $(MAN_DATE) --authors "The Custody developers"
	sed 's/^$$/.Pp/' $(MAN_OUT)/custodyctl/custodyctl.1 > man/custodyctl.1
	$(SWIFT) package plugin generate-manual --configuration debug --date $(MAN_DATE) --section 8 --authors "The Custody developers"
	sed 's/^$$/.Pp/' $(MAN_OUT)/custodyd/custodyd.8 > man/custodyd.8

promtool: $(PROMTOOL)

$(PROMTOOL):
	@mkdir -p .build/tools/package
	cd .build/tools/package && rm -f prometheus_*.deb && apt-get download prometheus 2>/dev/null || { apt-get update -qq && apt-get download prometheus; }
	dpkg-deb --fsys-tarfile .build/tools/package/prometheus_*.deb | tar -x -O ./usr/bin/promtool > $@.part
	chmod 0755 $@.part && mv $@.part $@
	rm -rf .build/tools/package

# Installs into a temporary DESTDIR, verifies the systemd units there and runs the installed
# binaries with the Swift toolchain's libraries hidden (scripts/checks/install-test.sh).
test-install: static $(BIN)/pam_custody.so
	bash scripts/checks/install-test.sh

# Release binaries with the Swift runtime linked in, so they run without the toolchain.
static: deps
	$(SWIFT) build -c release --static-swift-stdlib --scratch-path .build-static --product custodyd
	$(SWIFT) build -c release --static-swift-stdlib --scratch-path .build-static --product custodyctl

install: static $(BIN)/pam_custody.so
	install -D -m 0755 $(STATIC_BIN)/custodyd "$(DESTDIR)$(PREFIX)/bin/custodyd"
	install -D -m 0755 $(STATIC_BIN)/custodyctl "$(DESTDIR)$(PREFIX)/bin/custodyctl"
	install -D -m 0644 $(BIN)/pam_custody.so "$(DESTDIR)$(PAMDIR)/pam_custody.so"
	install -d -m 0755 "$(DESTDIR)$(UNITDIR)"
	sed 's|/usr/local/bin/|$(PREFIX)/bin/|g; s|/usr/local/share/|$(PREFIX)/share/|g; s|/etc/custody/|$(SYSCONFDIR)/custody/|g' systemd/custodyd.service > "$(DESTDIR)$(UNITDIR)/custodyd.service"
	sed 's|/usr/local/share/|$(PREFIX)/share/|g' systemd/custodyd.socket > "$(DESTDIR)$(UNITDIR)/custodyd.socket"
	chmod 0644 "$(DESTDIR)$(UNITDIR)/custodyd.service" "$(DESTDIR)$(UNITDIR)/custodyd.socket"
	install -D -m 0644 systemd/custody.sysusers "$(DESTDIR)$(SYSUSERSDIR)/custody.conf"
	install -d -m 0755 "$(DESTDIR)$(SYSCONFDIR)/xdg/autostart"
	sed 's|/usr/local/bin/|$(PREFIX)/bin/|g' xdg/custody-agent.desktop > "$(DESTDIR)$(SYSCONFDIR)/xdg/autostart/custody-agent.desktop"
	chmod 0644 "$(DESTDIR)$(SYSCONFDIR)/xdg/autostart/custody-agent.desktop"
	install -D -m 0644 systemd/custody.tmpfiles "$(DESTDIR)$(TMPFILESDIR)/custody.conf"
	install -D -m 0644 config/custody.toml "$(DESTDIR)$(SYSCONFDIR)/custody/custody.toml.example"
	[ -e "$(DESTDIR)$(SYSCONFDIR)/custody/custody.toml" ] || install -m 0644 config/custody.toml "$(DESTDIR)$(SYSCONFDIR)/custody/custody.toml"
	install -d -m 0755 "$(DESTDIR)$(PREFIX)/share/doc/custody/docs"
	install -m 0644 README.md "$(DESTDIR)$(PREFIX)/share/doc/custody/"
	install -m 0644 docs/*.md docs/*.png docs/openapi.yaml "$(DESTDIR)$(PREFIX)/share/doc/custody/docs/"
	install -D -m 0644 docs/examples/pam.d-common-custody "$(DESTDIR)$(PREFIX)/share/doc/custody/docs/examples/pam.d-common-custody"
	install -D -m 0644 man/custodyctl.1 "$(DESTDIR)$(MANDIR)/man1/custodyctl.1"
	install -D -m 0644 man/custodyd.8 "$(DESTDIR)$(MANDIR)/man8/custodyd.8"
	install -D -m 0644 man/custody.toml.5 "$(DESTDIR)$(MANDIR)/man5/custody.toml.5"
	install -d -m 0755 "$(DESTDIR)$(PREFIX)/share/bash-completion/completions" "$(DESTDIR)$(PREFIX)/share/zsh/site-functions"
	$(STATIC_BIN)/custodyctl --generate-completion-script bash > "$(DESTDIR)$(PREFIX)/share/bash-completion/completions/custodyctl"
	$(STATIC_BIN)/custodyctl --generate-completion-script zsh > "$(DESTDIR)$(PREFIX)/share/zsh/site-functions/_custodyctl"
	@echo "installed under $(DESTDIR)$(PREFIX); then: systemd-sysusers, systemd-tmpfiles --create, systemctl daemon-reload, systemctl enable --now custodyd.socket custodyd.service"

# A Debian package (packaging/deb); scripts/checks/deb-test.sh checks it with lintian, installs it, runs
# the installed daemon and purges it.
deb: static $(BIN)/pam_custody.so
	@bash packaging/deb/build.sh .build/deb

# Removes what `make install` put there (the configuration file stays).
uninstall:
	rm -f "$(DESTDIR)$(PREFIX)/bin/custodyd" "$(DESTDIR)$(PREFIX)/bin/custodyctl" "$(DESTDIR)$(PAMDIR)/pam_custody.so"
	rm -f "$(DESTDIR)$(UNITDIR)/custodyd.service" "$(DESTDIR)$(UNITDIR)/custodyd.socket"
	rm -f "$(DESTDIR)$(SYSUSERSDIR)/custody.conf" "$(DESTDIR)$(TMPFILESDIR)/custody.conf"
	rm -f "$(DESTDIR)$(SYSCONFDIR)/custody/custody.toml.example" "$(DESTDIR)$(SYSCONFDIR)/xdg/autostart/custody-agent.desktop"
	rm -rf "$(DESTDIR)$(PREFIX)/share/doc/custody"
	rm -f "$(DESTDIR)$(MANDIR)/man1/custodyctl.1" "$(DESTDIR)$(MANDIR)/man8/custodyd.8" "$(DESTDIR)$(MANDIR)/man5/custody.toml.5"
	rm -f "$(DESTDIR)$(PREFIX)/share/bash-completion/completions/custodyctl" "$(DESTDIR)$(PREFIX)/share/zsh/site-functions/_custodyctl"

bench: bench-deps release
	python3 bench/bench.py
	python3 bench/guard.py

# What the guard costs a process that holds no managed data, on the raw disk: off, on with no
# holder, on while another process holds data (part of `make bench`).
bench-guard: bench-deps release
	python3 bench/guard.py

# How costs grow: trees of 10k, 100k and 1M files (create, ls -lR, find, du, a wipe of a third)
# and 1-8 parallel clients, raw disk against the mount; a table, JSON and a PNG in bench/runs/.
bench-scale: bench-deps release
	python3 bench/scale.py

# Selective wipe of a third of a 20,000-file tree (time to key destruction and to the end).
bench-wipe: release
	bash bench/wipe.sh 20000

# Throughput of the protected file format alone (release build, file in /dev/shm).
bench-format: release
	.build/release/custody-format-bench 256 /dev/shm

clean:
	rm -rf .build .build-static .build-fuzz

# Fuzzes the header parser and block decoder with libFuzzer. FUZZ_SECONDS (default 600).
FUZZ_SECONDS ?= 600
fuzz: deps
	$(SWIFT) build -c release --scratch-path .build-fuzz --product custody-fuzz \
		--sanitize=fuzzer -Xswiftc -parse-as-library -Xswiftc -DFUZZING
	mkdir -p fuzz/corpus
	.build-fuzz/release/custody-fuzz fuzz/corpus -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=10 -print_final_stats=1

# Fuzzes the control plane's input (HTTP parser, request checks, every route's JSON body, the
# front-daemon frames) with libFuzzer, starting from the committed corpus fuzz/http; new inputs go
# to fuzz/http-found (not committed). `make test` replays fuzz/http.
fuzz-http: deps
	$(SWIFT) build -c release --scratch-path .build-fuzz --product custody-fuzz-http \
		--sanitize=fuzzer -Xswiftc -parse-as-library -Xswiftc -DFUZZING
	mkdir -p fuzz/http-found
	.build-fuzz/release/custody-fuzz-http fuzz/http-found fuzz/http -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -timeout=10 -print_final_stats=1
