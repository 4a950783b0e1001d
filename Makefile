# The course's two commands:  make lab   (open the course)   and   make test   (run every test).
# course.mk holds what a student runs (lab, test-graded, grade); this file adds the instructor's targets.
# Each sets itself up first: a virtual environment in .venv with the course installed.

include course.mk

.PHONY: test test-lint test-pytest test-nbval test-browser test-gradescope autograder release check-release student-edition

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
BROWSER_NOTEBOOKS ?= 00_setup_and_map,04_triton_kernel
test-pytest: setup
	VENV=$(VENV) bash tests/browser/install.sh
	bash tests/grader/install_bubblewrap.sh
	GQA_FLASH_IMPL=solutions GQA_FLASH_BROWSER_NOTEBOOKS=$(BROWSER_NOTEBOOKS) \
	  $(BIN)/python -m pytest tests -n $(WORKERS) --dist loadfile

test-nbval: setup
	GQA_FLASH_IMPL=solutions $(BIN)/python -m pytest --nbval-lax --nbval-current-env notebooks -p no:cacheprovider

# The course in JupyterLab in headless Chromium, with the solutions and with the stubs.
test-browser: setup
	VENV=$(VENV) bash tests/browser/install.sh
	GQA_FLASH_BROWSER_NOTEBOOKS= $(BIN)/python -m pytest -m browser tests/browser

# Gradescope's autograder zip: make autograder [EXTRA_TESTS=hidden/]. It prints the total points to set the
# assignment to on Gradescope: 100 (plus hidden tests'), not 160, the tests' maxima with the bonus.
autograder: setup
	$(BIN)/python -m gqa_flash.course.grader --gradescope-bundle autograder.zip $(if $(EXTRA_TESTS),--extra-tests $(EXTRA_TESTS))

# Write the student files from solutions/ (instructors).
release: setup
	$(BIN)/python tools/release.py

check-release: setup
	$(BIN)/python tools/release.py --check

# The student edition: what you publish to students (no solutions/, no mutants, no instructor tools),
# stubs fresh from solutions/, notebooks cleared, a README for students. make student-edition DEST=dir
# writes a new one (DEST empty or missing); UPDATE=1 re-releases into an edition you publish (rewrites
# the course's files, removes those it dropped, keeps .git and your own files, says what changed);
# FORCE=1 replaces all DEST holds, .git included.
# One line: make echoes a recipe as written, and a continued one ended in a line of two spaces.
EDITION_MODE = $(if $(filter-out 0,$(UPDATE)), --update)$(if $(filter-out 0,$(FORCE)), --force)
student-edition: setup
	@test -n "$(DEST)" || { echo "make student-edition: say where, e.g. DEST=../gqa-flash-student"; exit 2; }
	$(BIN)/python tools/student_edition.py "$(DEST)"$(EDITION_MODE)

# Gradescope's autograder in Gradescope's own layout, in a temporary folder: setup.sh builds a fresh
# virtual environment (torch from TORCH_INDEX_URL, PyTorch's CPU index by default; TORCH_REQUIREMENT
# picks the version), then run_autograder grades three submissions. Minutes, and a torch download:
# not part of make test.
test-gradescope: setup
	GQA_FLASH_TEST_GRADESCOPE=1 $(BIN)/python -m pytest tests/grader/test_gradescope_layout.py -p no:cacheprovider -s
