# The course's two commands:  make lab   (open the course)   and   make test   (run every test).
# Each sets itself up first: a virtual environment in .venv with the course installed.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PORT   ?= 8888
LAB_ARGS ?=

.PHONY: setup lab test test-graded release check-release clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[course]'
	$(BIN)/python -m ipykernel install --prefix $(VENV) --name python3 --display-name "Python 3 (gqa-flash)"
	touch $@

# Open the course: JupyterLab on notebooks/.
lab: setup
	$(BIN)/jupyter lab --notebook-dir=notebooks --port=$(PORT) $(LAB_ARGS)

# Run every test with the solutions: the course's own checks and the graded tests.
test: setup
	GQA_FLASH_IMPL=solutions $(BIN)/python -m pytest tests

# The graded tests alone, against your own files in gqa_flash/.
test-graded: setup
	GQA_FLASH_IMPL=student $(BIN)/python -m pytest tests/graded

# Write the student files from solutions/ (instructors).
release: setup
	$(BIN)/python -m gqa_flash.release

check-release: setup
	$(BIN)/python -m gqa_flash.release --check

clean:
	rm -rf $(VENV) .pytest_cache
