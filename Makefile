# specfleet: `make demo` runs the embedded CPU suite end to end; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
ENGINE := .cache/engine-venv
MODELS := .cache/models
WHEELHOUSE := .cache/wheelhouse
BIN := $(VENV)/bin
PIP_ARGS ?=
# Byte-compiles a virtualenv's packages with one worker per core (run by the virtualenv's own Python).
COMPILE := 'import compileall, sysconfig; compileall.compile_dir(sysconfig.get_path("purelib"), quiet=2, workers=0)'

.PHONY: demo test test-deps test-fast lint pyc venv engine models wheelhouse llamacpp host-deps rootfs testhosts testhosts-down \
	clean

# The demo names its run (RUN_ID=... to choose), so that `where` shows this run even when another one ends first.
DEMO_RUN_ID := $(or $(RUN_ID),$(shell date -u +%Y%m%dT%H%M%SZ))

demo: pyc engine models
	$(BIN)/ansible-playbook bench.yml -l local -e run_id=$(DEMO_RUN_ID)
	@$(BIN)/specfleet where results/$(DEMO_RUN_ID)

# What the tests need is installed first, side by side (the two virtualenvs, the Debian packages, the test hosts'
# rootfs and llama.cpp's server do not depend on each other), and the lint runs beside the engine's install (it needs
# only .venv). llama.cpp's server is built once per source and flags outside the clone (`llamacpp`): a first build
# costs about 7 minutes of both cores. Two workers; tests that share a resource stay together (tests/conftest.py
# says which). Ends with the time per folder and the 15 slowest tests.
test: test-deps pyc
	$(BIN)/python -m pytest -n 2 -rfEs --durations=15 tests

test-deps:
	$(MAKE) -j 4 host-deps venv engine models wheelhouse rootfs lint gguf-models

# What is not slow (no engine, no test hosts, no role runs), on two workers as `make test` runs them: about a minute.
test-fast: pyc
	$(BIN)/python -m pytest -n 2 -m "not slow" -rfEs tests

# The project's own modules compiled beside their sources. Where PYTHONDONTWRITEBYTECODE is set nothing is cached,
# and every process compiles what it imports: each Ansible task runs in a worker process of its own, and the
# project's plugins import the controller's modules there. A source edited later is compiled again, as usual.
pyc: venv
	$(BIN)/python -m compileall -q -j 0 agent controller collector plugins tests tools benchmarks

lint: venv
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint --offline --profile production
	$(BIN)/ruff check agent controller collector plugins roles tests tools benchmarks

venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile $(PIP_ARGS) -r requirements-dev.txt
	$(BIN)/pip install -q --no-compile $(PIP_ARGS) --no-deps -e .
	$(BIN)/python -c $(COMPILE)
	touch $@

# vLLM's CPU build, installed from the offline wheelhouse (downloaded once, installed from local files: the test
# hosts install from the same wheelhouse). The CUDA-only torchvision/torchaudio/torchcodec it pulls in break its
# import. Both virtualenvs are compiled after pip, on every core (pip compiles one file after another; and where
# PYTHONDONTWRITEBYTECODE is set, nothing compiled now is compiled ever: every process would compile its imports).
# A file in newer Python than this one (torch ships such tests) is skipped, as pip skips it.
engine: $(ENGINE)/.installed
$(ENGINE)/.installed: requirements-engine.txt $(WHEELHOUSE)/.complete
	test -x $(ENGINE)/bin/pip || $(PYTHON) -m venv $(ENGINE)
	$(ENGINE)/bin/pip install -q --no-compile $(PIP_ARGS) --no-index --find-links $(WHEELHOUSE) -r requirements-engine.txt
	$(ENGINE)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(ENGINE)/bin/python -c $(COMPILE)
	touch $@

# `models` also converts them to GGUF where llama.cpp's source is unpacked (see `gguf-models`).
LLAMACPP_SRC := .cache/llama.cpp/src
models: $(MODELS)/.built $(if $(wildcard $(LLAMACPP_SRC)),$(MODELS)/gguf/.built)
$(MODELS)/.built: tools/build_tiny_models.py tools/tiny_drafters.py $(ENGINE)/.installed
	$(ENGINE)/bin/python tools/build_tiny_models.py $(MODELS)
	touch $@

# The tiny models as GGUF for llama.cpp's llama-server (target, draft, dflash, eagle3 .gguf in $(MODELS)/gguf),
# converted by the converter of the llama.cpp source the server is built from (tools/tiny_gguf.py says how).
.PHONY: gguf-models
gguf-models: $(MODELS)/gguf/.built
$(MODELS)/gguf/.built: tools/tiny_gguf.py tools/tiny_drafters.py $(MODELS)/.built .cache/llama.cpp/llama-server
	PYTHONPATH=$(LLAMACPP_SRC)/gguf-py:$(LLAMACPP_SRC) $(ENGINE)/bin/python tools/tiny_gguf.py $(LLAMACPP_SRC) $(MODELS)
	touch $@

# llama.cpp's llama-server, built by the llamacpp role on the local host once per source digest and cmake flags in
# the user's cache, outside the clone (a fresh clone reuses it); .cache/llama.cpp/llama-server and
# .cache/llama.cpp/src (llama.cpp's tree: convert_hf_to_gguf.py, gguf-py) link to it. When built, a run changes
# nothing. Missing build packages are installed as root; otherwise the run names them.
LLAMACPP := .cache/llama.cpp
LLAMACPP_CACHE := $${XDG_CACHE_HOME:-$$HOME/.cache}/specfleet/llama.cpp
# `llamacpp` always asks the role (cheap once built); a target needing the server names $(LLAMACPP)/llama-server,
# made when missing.
LLAMACPP_PLAY := $(BIN)/ansible-playbook playbooks/llamacpp.yml -l local -e "llamacpp_cache_dir=$(LLAMACPP_CACHE)" \
	-e llamacpp_link_dir=$(CURDIR)/$(LLAMACPP) \
	-e llamacpp_install_system_packages=$$([ "$$(id -u)" = 0 ] && echo true || echo false)
llamacpp: venv host-deps
	$(LLAMACPP_PLAY)
$(LLAMACPP)/llama-server: | venv host-deps
	$(LLAMACPP_PLAY)

# Debian packages the host-level tests use (test hosts: debootstrap + systemd-nspawn; LXC passthrough; the HTML
# report's browser test: chromium + chromium-driver) and llama.cpp's build (installed here, before the llamacpp role
# looks for them: one apt at a time).
HOST_DEPS := debootstrap systemd-container lxc chromium chromium-driver cmake ninja-build g++
host-deps:
	@missing=$$(for p in $(HOST_DEPS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
		else echo "missing Debian packages (tests that need them will skip): $$missing"; fi; \
	fi

# Offline wheelhouse of the CPU engine: what `engine` installs here and the `engine_venv` role on hosts with no
# index (the test hosts). The engine's venv provides the pip that downloads it. It also holds llama.cpp's source,
# the llamacpp role's pinned sdist (URL and sha256 read from the role's defaults, checked before it is kept), from
# which the test hosts build llama-server (group_vars/testhosts.yml).
LLAMACPP_PIN = $(BIN)/python -c 'import sys, yaml; print(yaml.safe_load(open("roles/llamacpp/defaults/main.yml"))[sys.argv[1]])'
wheelhouse: $(WHEELHOUSE)/.complete
$(WHEELHOUSE)/.complete: requirements-engine.txt roles/llamacpp/defaults/main.yml | venv
	test -x $(ENGINE)/bin/pip || $(PYTHON) -m venv $(ENGINE)
	$(ENGINE)/bin/pip download -q $(PIP_ARGS) -r requirements-engine.txt pip setuptools wheel -d $(WHEELHOUSE)
	url=$$($(LLAMACPP_PIN) llamacpp_sdist_url) && sha=$$($(LLAMACPP_PIN) llamacpp_sdist_sha256) && \
	out=$(WHEELHOUSE)/$${url##*/} && { echo "$$sha  $$out" | sha256sum -c --status - 2>/dev/null || { \
	curl -fsSL --retry 3 -o $$out.part "$$url" && echo "$$sha  $$out.part" | sha256sum -c --quiet - && \
	mv $$out.part $$out; }; }
	touch $@

# Two Debian hosts with systemd and SSH (systemd-nspawn, needs root), group `testhosts` of the inventory; their
# systemd enforces the units' DevicePolicy=/DeviceAllow= (cgroup v2 inside, see tests/hosts/README.md).
testhosts: venv models wheelhouse
	$(BIN)/python tests/hosts/testhosts.py up --count 2 --state .work/testhosts --device-policy \
		--bind-ro $(CURDIR)/$(MODELS):/opt/models --bind-ro $(CURDIR)/$(WHEELHOUSE):/wheelhouse

# The test hosts' Debian rootfs (debootstrap once, cached in .cache/testhosts; `testhosts` builds it when missing).
rootfs: host-deps
	@if [ "$$(id -u)" = 0 ]; then $(PYTHON) tests/hosts/testhosts.py rootfs; \
	else echo "not root: no test hosts' rootfs (tests that need the test hosts will skip)"; fi

testhosts-down:
	$(BIN)/python tests/hosts/testhosts.py down --state .work/testhosts

clean:
	rm -rf .work results
