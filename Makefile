# The two quick-start commands: `make run` and `make test`. Each sets up what it needs first.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench-store clean

# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu: PyTorch's CPU-only wheels (PyPI's Linux torch
# brings the CUDA libraries, several GB), as the Dockerfile's CPU variant does.
TORCH_INDEX_URL ?=

$(STAMP): pyproject.toml client/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	@echo "memstore: installing into $(VENV) (PyTorch and its libraries: a few minutes on a first run, without output)"
	$(BIN)/pip install --quiet --upgrade pip
	@if [ -n "$(TORCH_INDEX_URL)" ]; then \
		$(BIN)/pip install --quiet --index-url "$(TORCH_INDEX_URL)" torch==2.14.1 torchvision==0.29.1; \
	fi
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet -e './client[langchain]'
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/memstore serve

# TEST_WORKERS=2: two pytest processes (pytest-xdist), each with its own embedded server, a test file
# to a process, in about 14 minutes instead of 16 to 29. Not the default: tests that race the other
# process's load have failed there now and then.
TEST_WORKERS ?= 0

test: $(STAMP)
	$(BIN)/pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench-store: $(STAMP)
	$(BIN)/python -m bench.store --json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
