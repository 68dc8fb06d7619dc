"""report.html in a real browser: headless Chromium loads it from disk, we read its DOM and screenshot it."""
import os
import re
import shutil
import subprocess

import pytest

from attnlab.lab import STEPS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=5000"]

if CHROMIUM is None and os.environ.get("CI"):
    pytest.fail("CI needs Debian's chromium for the browser test (.ci/run installs it)", pytrace=False)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")


@pytest.fixture
def report(quick_run):
    out, r = quick_run   # the session's quick run (conftest), its label ending in "browser <check>"
    assert r.exit_code == 0, r.output
    return out


def _chromium(args, tmp_path):
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120)


def test_report_dom_in_chromium(report, tmp_path):
    url = (report / "report.html").as_uri()
    r = _chromium(["--window-size=1200,2400", "--dump-dom", url], tmp_path)
    dom = r.stdout
    assert "<html" in dom, r.stderr[-2000:]
    for sid in STEPS:
        assert f'id="{sid}"' in dom, f"section {sid} missing"
    tables = re.findall(r"<tbody>(.*?)</tbody>", dom, flags=re.S)
    assert tables and all("<tr>" in t for t in tables), "an empty table"
    total = int(re.search(r'data-images="(\d+)"', dom).group(1))
    loaded = int(re.search(r'data-images-loaded="(\d+)"', dom).group(1))
    assert total >= 5 and loaded == total, (loaded, total)
    assert int(re.search(r'data-title-lines="(\d+)"', dom).group(1)) <= 2     # no title squeezed into a narrow table's column
    assert "browser &lt;check&gt;" in dom


def test_report_screenshot(report, tmp_path):
    shot = tmp_path / "report.png"
    r = _chromium([f"--screenshot={shot}", "--window-size=1200,2400", (report / "report.html").as_uri()], tmp_path)
    assert shot.exists() and shot.stat().st_size > 20_000, r.stderr[-2000:]
    keep = os.environ.get("ATTNLAB_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)
