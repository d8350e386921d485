"""report.html in a real browser: headless Chromium with no network and a throwaway profile. Under CI
a missing chromium fails (.ci/run installs it); elsewhere it skips."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed; .ci/run installs Debian's chromium package")
    pytest.skip("chromium not found: install it (apt-get install chromium) to render report.html in a browser")


def browse(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    """Open `page` in headless Chromium with no network and a throwaway profile."""
    command = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
        "--window-size=1280,2000", *extra, page.as_uri(),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def rendered_dom(page: Path, tmp_path: Path) -> str:
    dom = browse(page, tmp_path / "profile", "--dump-dom").stdout
    assert 'data-rendered="yes"' in dom, "the report's script did not run to the end"
    return dom
