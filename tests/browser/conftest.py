"""The browser tests: the course in JupyterLab, driven by Playwright in Debian's Chromium.

Select them with ``-m browser`` (or leave them out with ``-m "not browser"``).
``tests/browser/install.sh`` installs Chromium and Playwright where they are
missing; without them these tests are skipped, and the reason says so.
"""

import pytest

# What the tests hand back for the end of the run: where the screenshots are, how long each notebook took.
SUMMARY: list[str] = []


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "browser: end-to-end test of the course in JupyterLab in a real browser "
        "(needs /usr/bin/chromium and Playwright: tests/browser/install.sh)",
    )


@pytest.fixture(scope="session")
def browser_summary():
    return SUMMARY


def pytest_terminal_summary(terminalreporter):
    if SUMMARY:
        terminalreporter.section("JupyterLab in the browser")
        for line in SUMMARY:
            terminalreporter.write_line(line)
