# specfleet: `make demo` runs the embedded CPU suite end to end; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
ENGINE := .cache/engine-venv
MODELS := .cache/models
BIN := $(VENV)/bin
PIP_ARGS ?=

.PHONY: demo test unit integration lint venv engine models clean

demo: venv engine models
	$(BIN)/ansible-playbook bench.yml -l local $(if $(RUN_ID),-e run_id=$(RUN_ID))

test: venv engine models
	$(BIN)/python -m pytest tests
	$(MAKE) lint

unit: venv
	$(BIN)/python -m pytest tests/unit

integration: venv engine models
	$(BIN)/python -m pytest tests/integration

lint: venv
	$(BIN)/yamllint -s .
	$(BIN)/ansible-lint --offline --profile production
	$(BIN)/ruff check agent collector plugins tests tools benchmarks

venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(PIP_ARGS) -r requirements-dev.txt
	touch $@

# vLLM's CPU build: the CUDA-only torchvision/torchaudio/torchcodec it pulls in break its import.
engine: $(ENGINE)/.installed
$(ENGINE)/.installed: requirements-engine.txt
	$(PYTHON) -m venv $(ENGINE)
	$(ENGINE)/bin/pip install -q $(PIP_ARGS) -r requirements-engine.txt
	$(ENGINE)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

models: $(MODELS)/.built
$(MODELS)/.built: tools/build_tiny_models.py $(ENGINE)/.installed
	$(ENGINE)/bin/python tools/build_tiny_models.py $(MODELS)
	touch $@

clean:
	rm -rf .work results
