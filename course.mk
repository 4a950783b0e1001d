# What a student runs, shared by the instructor's Makefile and the student edition's (which
# `make student-edition` writes): setup, lab, test-graded, grade, submission, clean; and grade-submissions,
# the instructor's and the TA's (it works in the student edition too, which holds no solutions/).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PORT   ?= 8888
WORKERS ?= 2
# JupyterLab refuses to run as root unless told to (containers, CI).
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: setup lab test-graded grade submission grade-submissions clean

# A word after the target that no target has is most often pytest's option: in `make test-graded -k causal`
# make takes -k as its own and "causal" as a target. Stop before any test runs, and say where options go.
define check_goals
@for goal in $(MAKECMDGOALS); do case "$$goal" in setup|lab|test-graded|grade|submission|grade-submissions|clean|\
test|test-*|autograder|release|check-release|student-edition) ;; *) echo "make: no target '$$goal'. Options for \
pytest go in ARGS, e.g. make test-graded MODULE=$(or $(MODULE),forward) ARGS=\"-k $$goal -v\"" >&2; exit 2 ;; \
esac; done
endef

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

# The graded tests alone, against your own files in gqa_flash/; ends with the points table.
# MODULE=naive (or MODULE="naive online_softmax") grades those modules only. A module still holding
# its stub is one line, "not started"; the run fails only for failures in the modules you started.
test-graded: setup
	$(check_goals)
	GQA_FLASH_IMPL=student GQA_FLASH_MODULE="$(MODULE)" $(BIN)/python -m pytest tests/graded $(ARGS)

# Grade your files as the instructor's grader does (MODULE= as above; add ARGS="--out results.json")
grade: setup
	$(check_goals)
	$(BIN)/python -m gqa_flash.course.grader $(if $(strip $(MODULE)),--only "$(strip $(MODULE))") $(ARGS)

# The zip you hand in: your graded files from gqa_flash/, flat; a file still its stub is left out, and named.
# Writes submission.zip here (OUT=path.zip to choose), then says what went in and how to hand it in.
submission: setup
	$(BIN)/python -m gqa_flash.course.grader.handin $(if $(strip $(OUT)),--out "$(strip $(OUT))")

# Grade students' submissions with this course's .venv (instructors and TAs): one, or a batch.
#   make grade-submissions SUBMISSIONS=alice.zip [OUT=results.json]          its table (and Gradescope's results.json)
#   make grade-submissions SUBMISSIONS="submissions/*" CSV=grades.csv OUT=results/ [JOBS=4]
#   make grade-submissions CSV=grades.csv OUT=results/ REGRADE="alice bob"   grade those rows of the CSV again
# SUBMISSIONS: zips, folders or .py files, as the shell reads them (quote a name with spaces inside: '"A B.zip"').
# MODULE= as for grade; ARGS= any other option of python -m gqa_flash.course.grader (--workdir, --timeout, --extra-tests).
GRADE_SUBMISSIONS_ARGS = $(strip $(SUBMISSIONS) $(if $(strip $(CSV)),--csv "$(strip $(CSV))") \
  $(if $(strip $(OUT)),--out "$(strip $(OUT))") $(if $(strip $(JOBS)),--jobs $(strip $(JOBS))) \
  $(if $(strip $(MODULE)),--only "$(strip $(MODULE))") $(ARGS) $(if $(strip $(REGRADE)),--regrade $(REGRADE)))
# (Whether any were named is make's question, not the shell's: a name quoted inside the value would split
# a shell test.)
grade-submissions: setup
ifeq ($(strip $(SUBMISSIONS)$(REGRADE)),)
	@echo "make grade-submissions: say which, e.g. SUBMISSIONS=alice.zip, or SUBMISSIONS='submissions/*'" \
	  "CSV=grades.csv OUT=results/"; exit 2
else
	$(BIN)/python -m gqa_flash.course.grader $(GRADE_SUBMISSIONS_ARGS)
endif

clean:
	rm -rf $(VENV) .pytest_cache

