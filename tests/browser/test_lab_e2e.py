"""The course as a student meets it: JupyterLab in a real browser, every notebook run from the page.

nbval and tests/given/test_notebooks.py run the notebooks through a kernel; this test
goes through the page a student sees. For each variant it starts JupyterLab
with the README's course command (``make lab``, on a free loopback port, with a
token of its own), opens Debian's Chromium through Playwright, and for every
``notebooks/*.ipynb``, one after another in that one server: double-clicks it in
the file browser, runs Run > Run All Cells, waits until the kernel is idle and
every code cell has its execution count, and reads the rendered page:

- no cell shows an error (JupyterLab renders one as an
  ``application/vnd.jupyter.stderr`` output holding a traceback), and every
  code cell ran (after an error, Run All leaves the cells below unrun);
- ``solutions``: the course with ``GQA_FLASH_IMPL=solutions``; every check cell
  (first line ``# NBVAL_CHECK_OUTPUT``) shows a PASS verdict and no FAIL (but
  the Triton primer's, :data:`PUZZLE_NOTEBOOKS`, show FAIL: their kernels are
  written in the notebook, which holds the stubs), and every plot cell (one
  that calls ``plt.show()``) shows its figure as an image;
- ``stubs``: ``make lab`` in a temporary copy of the course whose graded files
  are the stubs written afresh from solutions/ (so a student's own work in
  gqa_flash/ does not matter), on the same virtualenv; every notebook runs to
  its end, and every check of student code shows FAIL and never PASS.

The last check cell of each notebook is saved as a PNG under
``$GQA_FLASH_SCREENS`` (default ``/tmp/gqa_flash_screens``)/<variant>/, for a
person to look at; the folder is printed at the end of the run.

Nothing is written into the course: autosave is off (JupyterLab's settings live
in a temporary folder), notebooks are closed without saving, and the test
fails if the server log shows a save. Only 127.0.0.1 is contacted: the page's
requests to anywhere else are aborted. JupyterLab (its process group) and its
kernels are stopped at the end, pass or fail.

Needs /usr/bin/chromium and Playwright in the virtualenv (tests/browser/install.sh);
without them the test is skipped.  ``pytest -m browser tests/browser``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote, urlparse

import pytest

COURSE = Path(__file__).resolve().parents[2]
ALL_NOTEBOOKS = sorted((COURSE / "notebooks").glob("*.ipynb"))
# Notebooks whose exercises are kernels written in the notebook itself, not in gqa_flash/ (the Triton primer's
# puzzles): the file holds their stubs, so their checks show FAIL with the solutions too.
PUZZLE_NOTEBOOKS = ("03b_triton_primer",)


def _chosen_notebooks():
    """GQA_FLASH_BROWSER_NOTEBOOKS="00_setup_and_map,04_triton_kernel" runs those only (make test does, to
    stay quick: nbval and tests/given/test_notebooks.py run every notebook through a kernel anyway); default all."""
    wanted = [w.strip() for w in os.environ.get("GQA_FLASH_BROWSER_NOTEBOOKS", "").split(",") if w.strip()]
    if not wanted:
        return ALL_NOTEBOOKS
    unknown = sorted(set(wanted) - {p.stem for p in ALL_NOTEBOOKS})
    if unknown:
        raise pytest.UsageError(f"GQA_FLASH_BROWSER_NOTEBOOKS names no notebook {unknown}; "
                                f"there are {[p.stem for p in ALL_NOTEBOOKS]}")
    return [p for p in ALL_NOTEBOOKS if p.stem in wanted]


NOTEBOOKS = _chosen_notebooks()
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # the profile is a fresh --user-data-dir, passed by Playwright (launch_persistent_context)
SCREENS = Path(os.environ.get("GQA_FLASH_SCREENS", "/tmp/gqa_flash_screens"))
NOTEBOOK_TIMEOUT = float(os.environ.get("GQA_FLASH_BROWSER_TIMEOUT", "240"))  # seconds per notebook run
SERVER_TIMEOUT = 180  # seconds for `make lab` to answer
CHECK_MARK = "# NBVAL_CHECK_OUTPUT"
STUDENT_CHECK = re.compile(r"checks\.(check_\w+|progress)\(")  # checks.check_*() and checks.progress()
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the open notebook (one at a time)
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*\w*(Error|Exception|Interrupt)\b.*:", re.M)

# JupyterLab settings for the test's server (a temporary JUPYTERLAB_SETTINGS_DIR): never save a
# notebook behind our back, shut a notebook's kernel down when its tab closes, ask the net nothing.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"kernelShutdown": True},
    "@jupyterlab/apputils-extension/notification": {"checkForUpdates": False, "fetchNews": "false"},
}

playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed: run tests/browser/install.sh"
)
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"no {CHROMIUM}: run tests/browser/install.sh"),
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stub_course(dest: Path) -> Path:
    """A copy of the course (Makefile, course.mk, pyproject.toml, notebooks/, gqa_flash/) whose graded files are
    the stubs."""
    from gqa_flash.course.grader import stubs

    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for name in ("Makefile", "course.mk", "pyproject.toml"):
        shutil.copy2(COURSE / name, dest / name)  # copy2 keeps the mtime: make compares it with .venv/.installed
    shutil.copytree(COURSE / "notebooks", dest / "notebooks", ignore=ignore)
    shutil.copytree(COURSE / "gqa_flash", dest / "gqa_flash", ignore=ignore)
    for path, text in stubs.plan(COURSE / "solutions", dest / "gqa_flash").items():
        path.write_text(text)
    return dest


class Lab:
    """One JupyterLab server started by `make lab`, and one Chromium page on it."""

    def __init__(self, variant: str, course: Path, port: int, token: str, screens: Path, log: Path):
        self.variant, self.course, self.port, self.token = variant, course, port, token
        self.screens, self.log = screens, log
        self.base = f"http://127.0.0.1:{port}"
        self.page = None
        self.blocked: list[str] = []

    # --- the server's REST API (loopback, token) -------------------------------------------------
    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(self.base + path, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def notebook_cells(self, name: str) -> list[dict]:
        return self.api(f"/api/contents/{quote(name)}?content=1&type=notebook")["content"]["cells"]

    def shut_down_kernels(self) -> None:
        for kernel in self.api("/api/kernels"):
            self.api(f"/api/kernels/{kernel['id']}", method="DELETE")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    # --- the page ---------------------------------------------------------------------------------
    def menu(self, top: str, command: str) -> None:
        page = self.page
        page.locator(".lm-MenuBar-item").filter(
            has=page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(rf"^{top}$"))
        ).click()
        page.locator(f'.lm-Menu-item[data-command="{command}"]').click()

    def open_notebook(self, name: str, n_cells: int) -> None:
        page = self.page
        item = page.locator(".jp-DirListing-item").filter(
            has=page.locator(".jp-DirListing-itemText", has_text=re.compile(rf"^{re.escape(name)}$"))
        )
        item.dblclick(timeout=30_000)
        page.wait_for_function(
            """([n]) => {
                const panel = [...document.querySelectorAll('.jp-NotebookPanel')]
                    .find(p => !p.classList.contains('lm-mod-hidden'));
                return panel && panel.querySelectorAll('.jp-Notebook .jp-Cell').length === n;
            }""",
            arg=[n_cells], timeout=60_000,
        )
        # The kernel has started and is idle before we run anything. On a loaded machine JupyterLab can
        # open the notebook before it has listed the kernels, and then asks which kernel to start (seen
        # once under xdist): accept its choice, the course's kernel, as a student would.
        deadline = time.monotonic() + 120
        while True:
            self.accept_kernel_choice()
            idle = page.evaluate(
                """() => {
                    const panel = [...document.querySelectorAll('.jp-NotebookPanel')]
                        .find(p => !p.classList.contains('lm-mod-hidden'));
                    const ind = panel && panel.querySelector('.jp-Notebook-ExecutionIndicator');
                    return !!ind && ind.getAttribute('data-status') === 'idle';
                }"""
            )
            if idle:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"{name}: the kernel never became idle; dialogs: {self.dismiss_dialogs()}")
            time.sleep(0.25)

    def state(self) -> dict:
        """The open notebook as rendered: kernel status and, per cell, prompt, outputs and images."""
        return self.page.evaluate(
            """() => {
                const panel = [...document.querySelectorAll('.jp-NotebookPanel')]
                    .find(p => !p.classList.contains('lm-mod-hidden'));
                const ind = panel.querySelector('.jp-Notebook-ExecutionIndicator');
                const cells = [...panel.querySelectorAll('.jp-Notebook .jp-Cell')].map(cell => ({
                    code: cell.classList.contains('jp-CodeCell'),
                    prompt: (cell.querySelector('.jp-InputPrompt') || {}).textContent || '',
                    firstLine: (cell.querySelector('.cm-content .cm-line') || {}).textContent || '',
                    outputs: [...cell.querySelectorAll('.jp-OutputArea-output')].map(o => ({
                        mime: o.getAttribute('data-mime-type') || '',
                        text: o.textContent || '',
                    })),
                    images: [...cell.querySelectorAll('.jp-OutputArea-output img')].map(i => ({
                        complete: i.complete, width: i.naturalWidth, height: i.naturalHeight,
                    })),
                }));
                return {status: ind ? ind.getAttribute('data-status') : null, cells};
            }"""
        )

    def accept_kernel_choice(self) -> None:
        """Accept JupyterLab's "Select Kernel" dialog if it is open (its choice is the course's kernel)."""
        select = self.page.locator(".jp-Dialog").filter(has_text="Select Kernel")
        if select.count():
            select.first.locator(".jp-mod-accept").click()
            select.first.wait_for(state="detached", timeout=10_000)

    def focus_notebook(self) -> None:
        """Click the first cell's prompt: the notebook is then the current widget, in command mode.

        The "Select Kernel" dialog can open after the kernel already reads idle (seen under a loaded
        machine, 2026-12-06): accept it first, or it intercepts the click."""
        prompt = self.page.locator(f"{PANEL} .jp-Notebook .jp-Cell .jp-InputPrompt").first
        for attempt in range(3):
            self.accept_kernel_choice()
            try:
                prompt.click(timeout=10_000)
                return
            except playwright_api.TimeoutError:
                if attempt == 2:
                    raise

    def run_all_and_wait(self, timeout: float) -> dict:
        page = self.page
        # Clear the stored outputs first (Edit > Clear Outputs of All Cells), so that nothing read
        # below can come from the file rather than from this run.
        self.focus_notebook()
        self.menu("Edit", "editmenu:clear-all")
        page.wait_for_function(
            f"""() => {{
                const panel = document.querySelector('{PANEL}');
                return panel.querySelectorAll('.jp-OutputArea-output').length === 0 &&
                    [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
                        .every(p => !/[0-9*]/.test(p.textContent));
            }}""",
            timeout=15_000,
        )
        for attempt in range(3):  # Run > Run All Cells; click again if the run did not start
            self.focus_notebook()
            self.menu("Run", "runmenu:run-all")
            try:
                page.wait_for_function(
                    f"""() => [...document.querySelectorAll('{PANEL} .jp-CodeCell .jp-InputPrompt')]
                        .some(p => /[0-9*]/.test(p.textContent))""",
                    timeout=20_000,
                )
                break
            except playwright_api.TimeoutError:
                continue
        else:
            pytest.fail(f"{self.variant}: Run > Run All Cells did not start the notebook (3 clicks)")
        deadline = time.monotonic() + timeout
        settled = 0
        while True:
            time.sleep(1.0)
            dialogs = self.dismiss_dialogs()
            if dialogs:  # e.g. "Kernel Restarting: the kernel appears to have died"
                pytest.fail(f"{self.variant}: a dialog opened while the notebook ran: {dialogs}")
            st = self.state()
            prompts = [c["prompt"] for c in st["cells"] if c["code"]]
            running = any("*" in p for p in prompts)
            done_all = all(re.search(r"\[\d+\]", p) for p in prompts)
            errored = any(_errors_of(c) for c in st["cells"])
            # idle, nothing queued, and every cell ran (or an error stopped the run); twice in a row
            settled = settled + 1 if (st["status"] == "idle" and not running and (done_all or errored)) else 0
            if settled >= 2:
                return st
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{self.variant}: the notebook was still running after {timeout:.0f} s "
                    f"(kernel {st['status']}; prompts {prompts})"
                )

    def dismiss_dialogs(self) -> list[str]:
        """Cancel (Escape) any dialog left open; return what they said."""
        texts = []
        for _ in range(5):
            dialog = self.page.locator(".jp-Dialog")
            if not dialog.count():
                break
            texts.append(" | ".join(dialog.first.inner_text().split())[:500])
            self.page.keyboard.press("Escape")
            time.sleep(0.5)
        return texts

    def close_notebook(self) -> None:
        """Close the open notebook without saving; its kernel shuts down with it."""
        page = self.page
        try:
            self.dismiss_dialogs()
            self.menu("File", "filemenu:close-and-cleanup")
            deadline = time.monotonic() + 30
            # "Shut down the notebook?" and/or "Save your work": shut down, never save
            while page.locator(PANEL).count():
                if time.monotonic() > deadline:
                    raise TimeoutError("the notebook did not close")
                dialog = page.locator(".jp-Dialog")
                if not dialog.count():
                    time.sleep(0.2)
                    continue
                buttons = dialog.first.locator(".jp-Dialog-button")
                labels = [t.strip() for t in buttons.all_inner_texts()]
                pick = next((b for b in labels if b.lower() in ("discard", "don't save", "do not save")), None)
                pick = pick or next((b for b in labels if b.lower() in ("ok", "shut down", "close")), labels[-1])
                buttons.filter(has_text=re.compile(rf"^{re.escape(pick)}$")).first.click()
                dialog.first.wait_for(state="detached", timeout=10_000)
        finally:
            self.shut_down_kernels()  # whatever the page did, no kernel outlives its notebook


def _errors_of(cell: dict) -> list[str]:
    return [o["text"] for o in cell["outputs"]
            if o["mime"] == "application/vnd.jupyter.stderr" and TRACEBACK.search(o["text"])]


def _stop(proc: subprocess.Popen) -> None:
    """Stop `make lab` and JupyterLab: TERM to their process group, then KILL if they linger."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module", params=["solutions", "stubs"])
def lab(request, tmp_path_factory, browser_summary):
    variant = request.param
    tmp = tmp_path_factory.mktemp(f"lab_{variant}")
    venv = Path(sys.prefix) if (Path(sys.prefix) / "bin" / "jupyter").exists() else COURSE / ".venv"
    port, token = _free_port(), secrets.token_hex(24)

    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # let the package decide, as for a student
    env.pop("PYTHONPATH", None)
    for sub in ("settings", "workspaces", "runtime"):
        (tmp / sub).mkdir()
    env["JUPYTERLAB_SETTINGS_DIR"] = str(tmp / "settings")
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(tmp / "workspaces")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp / "runtime")
    for plugin, values in LAB_SETTINGS.items():
        path = tmp / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))

    lab_args = f"--no-browser --ServerApp.token={token} --ServerApp.ip=127.0.0.1"
    if os.geteuid() == 0:
        lab_args += " --allow-root"  # JupyterLab refuses to start as root without it (CI runs as root)
    # Both variants run `make lab` with the virtualenv that runs these tests (plain pytest or make test).
    make = ["make", "lab", f"PORT={port}", f"LAB_ARGS={lab_args}", f"VENV={venv}"]
    if variant == "solutions":
        course = COURSE
        env["GQA_FLASH_IMPL"] = "solutions"
    else:
        course = _stub_course(tmp_path_factory.mktemp("course"))
        make = ["make", "-C", str(course), *make[1:]]
        # The venv has the course installed in editable mode from the real course: the copy's
        # gqa_flash must come first on the kernel's path.
        env["GQA_FLASH_IMPL"] = "student"
        env["PYTHONPATH"] = str(course)
    # `setup` must see the venv as installed: otherwise `make lab` would reinstall it (for the stub copy,
    # from the copy) before the server starts, and the test would time out or fail on that instead.
    q = subprocess.run(["make", "-q", "-C", str(course), "setup", f"VENV={venv}"], env=env,
                       capture_output=True, text=True)
    if q.returncode == 2:  # make itself failed (a file of the copy missing, say), not an old .installed
        pytest.fail(f"make -q setup failed in {course}: {q.stderr.strip()}")
    if q.returncode != 0:
        pytest.fail(f"{venv}/.installed is older than {course}/pyproject.toml: run `make setup VENV={venv}` "
                    "first (make lab would otherwise reinstall the virtualenv before the server starts)")

    screens = SCREENS / variant
    shutil.rmtree(screens, ignore_errors=True)
    screens.mkdir(parents=True)
    log = tmp / "lab.log"
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(make, cwd=COURSE, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    lab = Lab(variant, course, port, token, screens, log)
    pw = context = None
    try:
        deadline = time.monotonic() + SERVER_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"`{' '.join(make)}` exited with {proc.returncode}:\n{lab.log_tail()}")
            try:
                lab.api("/api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer on port {port} in {SERVER_TIMEOUT} s:\n{lab.log_tail()}")
                time.sleep(0.5)
        server_s = time.monotonic() - started

        pw = playwright_api.sync_playwright().start()
        context = pw.chromium.launch_persistent_context(
            str(tmp / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000}, device_scale_factor=1,
        )

        def loopback_only(route):
            if urlparse(route.request.url).hostname == "127.0.0.1":
                route.continue_()
            else:
                lab.blocked.append(route.request.url)
                route.abort()

        context.route("**/*", loopback_only)
        lab.page = context.pages[0] if context.pages else context.new_page()
        lab.page.set_default_timeout(30_000)
        lab.page.goto(f"{lab.base}/lab?token={token}")
        lab.page.wait_for_selector(".jp-DirListing-item", timeout=120_000)
        browser_summary.append(
            f"{variant}: `{' '.join(make[:2])} ...` answered in {server_s:.0f} s; page ready after "
            f"{time.monotonic() - started:.0f} s; screenshots in {screens}"
        )
        yield lab
        saves = [line for line in log.read_text(errors="replace").splitlines() if "Saving file" in line]
        assert not saves, "JupyterLab saved a notebook during the test:\n" + "\n".join(saves)
    finally:
        try:
            if lab.page is not None:
                lab.shut_down_kernels()
        except OSError:
            pass
        if context is not None:
            context.close()
        if pw is not None:
            pw.stop()
        _stop(proc)
        if lab.blocked:
            browser_summary.append(f"{variant}: blocked {len(lab.blocked)} non-loopback requests, "
                                   f"e.g. {lab.blocked[0]}")
        browser_summary.append(f"{variant}: JupyterLab stopped; {time.monotonic() - started:.0f} s in all")


@pytest.mark.timeout(NOTEBOOK_TIMEOUT + SERVER_TIMEOUT + 180)  # the first one also starts the server
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_jupyterlab(lab, notebook, browser_summary):
    name = notebook.name
    file_cells = lab.notebook_cells(name)  # the server's copy, as the page loads it
    started = time.monotonic()
    lab.open_notebook(name, len(file_cells))
    try:
        st = lab.run_all_and_wait(NOTEBOOK_TIMEOUT)
        seconds = time.monotonic() - started
        cells = st["cells"]
        assert len(cells) == len(file_cells), f"{name}: {len(cells)} cells on the page, {len(file_cells)} in the file"

        problems = []
        checks, plots = [], []
        for i, (cell, src) in enumerate(zip(cells, file_cells)):
            source = src["source"] if isinstance(src["source"], str) else "".join(src["source"])
            if src["cell_type"] != "code":
                continue
            assert cell["code"], f"{name} cell {i}: a code cell in the file is not one on the page"
            for err in _errors_of(cell):
                problems.append(f"cell {i} shows an error:\n{err.strip()[-1500:]}")
            if not re.search(r"\[\d+\]", cell["prompt"]):
                problems.append(f"cell {i} did not run (prompt {cell['prompt']!r})")
            if source.lstrip().startswith(CHECK_MARK):
                checks.append(i)
                if cell["firstLine"] and CHECK_MARK not in cell["firstLine"]:
                    problems.append(f"cell {i}: the page shows {cell['firstLine']!r}, not the check cell")
                lines = [line.strip() for o in cell["outputs"] if o["mime"] == "application/vnd.jupyter.stdout"
                         for line in o["text"].splitlines()]
                passed = [line for line in lines if line.startswith("PASS")]
                failed = [line for line in lines if line.startswith("FAIL")]
                if lab.variant == "solutions" and notebook.stem not in PUZZLE_NOTEBOOKS:
                    if not passed or failed:
                        problems.append(f"check cell {i} does not show PASS alone with the solutions:\n"
                                        + "\n".join(lines))
                elif STUDENT_CHECK.search(source):
                    if passed or not failed:
                        problems.append(f"check cell {i} does not show FAIL alone on the stubs:\n"
                                        + "\n".join(lines))
            stored_image = any(k.startswith("image/") for o in src.get("outputs", []) for k in o.get("data", {}))
            if "plt.show()" in source or stored_image:
                plots.append(i)
        counts = [int(m.group(1)) for c in cells if c["code"] for m in [re.search(r"\[(\d+)\]", c["prompt"])] if m]
        if counts != sorted(set(counts)):
            problems.append(f"the cells did not run once each, top to bottom: execution counts {counts}")
        # figures: an <img> with pixels in every plot cell (scrolled to, so that it is decoded)
        for i in plots:
            lab.page.locator(f"{PANEL} .jp-Notebook .jp-Cell").nth(i) \
                .scroll_into_view_if_needed()
        if plots:
            time.sleep(0.5)
            cells = lab.state()["cells"]
        for i in plots:
            images = cells[i]["images"]
            if not images or not all(im["complete"] and im["width"] > 0 and im["height"] > 0 for im in images):
                problems.append(f"plot cell {i} shows no rendered image ({images})")

        # a screenshot of the last check cell (the last cell when there is none), for a person to look at
        last = checks[-1] if checks else len(cells) - 1
        shot = lab.screens / f"{notebook.stem}.png"
        lab.page.locator(f"{PANEL} .jp-Notebook .jp-Cell").nth(last) \
            .screenshot(path=str(shot))
        browser_summary.append(
            f"{lab.variant}: {name}: ran in {seconds:.0f} s; {len(checks)} check cells, {len(plots)} plot cells; "
            f"{'OK' if not problems else f'{len(problems)} PROBLEMS'}; screenshot {shot}"
        )
        assert not problems, f"{lab.variant}: {name} in JupyterLab:\n" + "\n\n".join(problems)
    except BaseException:
        try:
            lab.page.screenshot(path=str(lab.screens / f"{notebook.stem}-FAILED-page.png"))
            for text in lab.dismiss_dialogs():
                browser_summary.append(f"{lab.variant}: {name}: a dialog was open: {text}")
        except Exception:
            pass
        raise
    finally:
        lab.close_notebook()
