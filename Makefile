# The course's two commands:  make lab   (open the course)   and   make test   (run every test).
# Each sets itself up first: a virtual environment in .venv with the course installed.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PORT   ?= 8888
# JupyterLab refuses to run as root unless told to (containers, CI).
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: setup lab test test-lint test-pytest test-nbval test-graded test-browser grade autograder release check-release clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[course,dev]'
	$(BIN)/python -m ipykernel install --prefix $(VENV) --name python3 --display-name "Python 3 (gqa-flash)"
	touch $@

# Open the course: JupyterLab on notebooks/.
lab: setup
	$(BIN)/jupyter lab --notebook-dir=notebooks --port=$(PORT) $(LAB_ARGS)

# Run every test with the solutions, phase by phase: the linter, the course's own checks, the
# graded tests and the grader (pytest), the notebooks in a real browser (Chromium and Playwright
# are installed first), and every notebook under nbval (check cells must print what is stored).
# Every phase runs even when an earlier one failed, so one failure cannot hide the others;
# the last line names the phases that failed, and make test fails if any did.
TEST_PHASES := lint pytest nbval
test: setup
	@failed=""; \
	for phase in $(TEST_PHASES); do \
	  echo "=== make test: $$phase"; \
	  $(MAKE) --no-print-directory test-$$phase || failed="$$failed $$phase"; \
	done; \
	if [ -n "$$failed" ]; then echo "=== make test: FAILED:$$failed"; exit 1; fi; \
	echo "=== make test: every phase passed ($(TEST_PHASES))"

test-lint: setup
	$(BIN)/ruff check .

# pytest runs in $(WORKERS) processes (pytest-xdist), a test file per process at a time (module
# fixtures such as the graded mutants are built once). The browser test opens two notebooks here,
# the lab's first and the kernel's; make test-browser opens all of them.
WORKERS ?= 2
BROWSER_NOTEBOOKS ?= 00_setup_and_map,04_triton_kernel
test-pytest: setup
	VENV=$(VENV) bash tests/browser/install.sh
	GQA_FLASH_IMPL=solutions GQA_FLASH_BROWSER_NOTEBOOKS=$(BROWSER_NOTEBOOKS) \
	  $(BIN)/python -m pytest tests -n $(WORKERS) --dist loadfile

test-nbval: setup
	GQA_FLASH_IMPL=solutions $(BIN)/python -m pytest --nbval-lax --nbval-current-env notebooks -p no:cacheprovider

# The course in JupyterLab in headless Chromium, with the solutions and with the stubs.
test-browser: setup
	VENV=$(VENV) bash tests/browser/install.sh
	GQA_FLASH_BROWSER_NOTEBOOKS= $(BIN)/python -m pytest -m browser tests/browser

# The graded tests alone, against your own files in gqa_flash/.
test-graded: setup
	GQA_FLASH_IMPL=student $(BIN)/python -m pytest tests/graded

# Grade your files as the instructor's grader does (add ARGS="--out results.json")
grade: setup
	$(BIN)/python -m gqa_flash.grader $(ARGS)

# Gradescope's autograder zip: make autograder [EXTRA_TESTS=hidden/]
autograder: setup
	$(BIN)/python -m gqa_flash.grader --gradescope-bundle autograder.zip $(if $(EXTRA_TESTS),--extra-tests $(EXTRA_TESTS))

# Write the student files from solutions/ (instructors).
release: setup
	$(BIN)/python -m gqa_flash.grader.release

check-release: setup
	$(BIN)/python -m gqa_flash.grader.release --check

clean:
	rm -rf $(VENV) .pytest_cache
