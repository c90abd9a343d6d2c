"""Render report.html in headless Chromium and check the page and its figures are drawn.

Skips when no Chromium is installed (`apt-get install chromium` to run it). The screenshot is
left in the test's tmp folder for a human to look at.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "report_screenshot.sh"
BROWSER = next(
    (b for b in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable") if shutil.which(b)), None
)


@pytest.mark.skipif(BROWSER is None and not os.environ.get("FP8LAB_REQUIRE_BROWSER"),
                    reason="no Chromium installed (apt-get install chromium)")
def test_report_renders_in_chromium(main_report, tmp_path: Path) -> None:
    assert BROWSER, "FP8LAB_REQUIRE_BROWSER is set but no Chromium is installed"
    res = main_report
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(res.report_html), str(shot), "1280", "9000"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    from matplotlib.image import imread

    img = imread(shot)[..., :3]
    assert img.shape[:2] == (9000, 1280)
    ink = (img < 0.95).any(axis=2)
    rows = np.flatnonzero(ink.any(axis=1))
    assert rows.size and rows.max() > 3000  # the page has real length: text, tables and figures
    # figures are colourful; plain text and tables are grey: count strongly coloured pixels
    colourful = (img.max(axis=2) - img.min(axis=2)) > 0.3
    assert colourful.sum() > 50_000
