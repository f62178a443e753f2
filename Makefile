# The two commands users need: `make demo` and `make test`. Everything else is a step of those.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
CARGO_DIR := rust
# One target directory for cargo and maturin, so the release build happens once.
export CARGO_TARGET_DIR := $(CURDIR)/target
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1

.PHONY: bootstrap build install lint test test-rust test-python test-long demo clean

bootstrap:
	@./scripts/bootstrap

# One release build: the workspace (daemon and libraries), then the extension module into .venv
# (maturin reuses the same target directory and profile, so dependencies are not rebuilt).
build: bootstrap
	cd $(CARGO_DIR) && cargo build --release --workspace --locked
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin develop --release --locked -q
	install -m 0755 target/release/benchfsd $(VENV)/bin/benchfsd
	install -m 0755 target/release/benchfs-mount $(VENV)/bin/benchfs-mount
	$(call install_capi,$(CURDIR)/$(VENV))

# The C library (libbenchfs.so, benchfs.h, benchfs.pc; docs/capi.md) into a prefix: the .venv
# by `make build`, elsewhere by `make install PREFIX=/opt/benchfs`.
CAPI_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' $(CARGO_DIR)/Cargo.toml | head -n 1)
define install_capi
	install -d $(1)/lib/pkgconfig $(1)/include
	install -m 0755 target/release/libbenchfs.so $(1)/lib/libbenchfs.so
	install -m 0644 include/benchfs.h $(1)/include/benchfs.h
	sed -e 's|@PREFIX@|$(1)|' -e 's|@VERSION@|$(CAPI_VERSION)|' $(CARGO_DIR)/benchfs-capi/benchfs.pc.in \
		> $(1)/lib/pkgconfig/benchfs.pc
endef

install:
	@test -n "$(PREFIX)" || { echo "usage: make install PREFIX=/path" >&2; exit 2; }
	$(MAKE) build
	$(call install_capi,$(abspath $(PREFIX)))
	# The UCX libbenchfs.so runs on, where its rpath looks ($$ORIGIN/../ucx/lib).
	install -d $(abspath $(PREFIX))/ucx/lib $(abspath $(PREFIX))/ucx/etc
	cp -a $(VENV)/ucx/lib/*.so* $(VENV)/ucx/lib/ucx $(abspath $(PREFIX))/ucx/lib/
	cp -a $(VENV)/ucx/etc/ucx $(abspath $(PREFIX))/ucx/etc/

# The stub of the native module is checked against the built module itself (mypy's stubtest).
lint: build
	cd $(CARGO_DIR) && cargo fmt --all --check
	cd $(CARGO_DIR) && cargo clippy --release --workspace --all-targets --locked -- -D warnings
	$(VENV)/bin/ruff check python tests studies
	$(VENV)/bin/ruff format --check python tests studies
	cd python && ../$(PY) -m mypy.stubtest benchfs._core
	cd python && ../$(VENV)/bin/lint-imports ../pyproject.toml

test-rust: build
	cd $(CARGO_DIR) && cargo test --release --workspace --locked

test-python: build
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q

test: build lint test-rust test-python

test-long: build
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q -m long

demo: build
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/benchfs-run launch

clean:
	rm -rf target $(VENV) python/benchfs/*.so
