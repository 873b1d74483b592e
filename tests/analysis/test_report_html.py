"""``report.html`` as a reader sees it: rendered by headless Chromium, measured and photographed.

The report of the real sweep (``sim_sweep``) is opened twice in Debian's ``chromium``: once as a
copy with a small script appended that measures the laid-out page (each image's decoded size and
box, each table's box, the page's width) into the DOM, read back with ``--dump-dom``; once as it
is, for a screenshot whose pixels are checked where the images are. Chromium is required, not
optional: ``.ci/run`` installs it; without it the test fails and says how to install it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from report_support import REPORT_SIZE

pytestmark = pytest.mark.slow

WINDOW = (1400, 3000)  # CSS px, at a device scale factor of 1: screenshot px = CSS px

PROBE = """<script>
window.addEventListener("load", () => {
  const box = (el) => { const r = el.getBoundingClientRect();
    return {left: r.left + scrollX, top: r.top + scrollY, width: r.width, height: r.height}; };
  const out = {
    page: {scrollWidth: document.documentElement.scrollWidth,
           clientWidth: document.documentElement.clientWidth},
    images: [...document.images].map((img) => ({complete: img.complete,
      naturalWidth: img.naturalWidth, naturalHeight: img.naturalHeight,
      shownWidth: img.clientWidth, shownHeight: img.clientHeight, ...box(img)})),
    tables: [...document.querySelectorAll("table")].map((t) => ({rows: t.rows.length,
      overflows: t.parentElement.scrollWidth > t.parentElement.clientWidth + 1, ...box(t)})),
    headings: [...document.querySelectorAll("h1, h2")].map((h) => h.textContent),
  };
  const pre = document.createElement("pre");
  pre.id = "dvfs-probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str:
    """The Chromium binary (``$DVFS_CHROMIUM``, else ``chromium`` or ``chromium-browser``)."""
    for name in (os.environ.get("DVFS_CHROMIUM"), "chromium", "chromium-browser"):
        if name and (path := shutil.which(name)):
            return path
    pytest.fail("Chromium is needed to render report.html and was not found: install Debian's "
                "package (`apt-get install -y chromium`, as .ci/run does) or set DVFS_CHROMIUM "
                "to a Chromium binary", pytrace=False)


def run_chromium(binary: str, profile, *args: str) -> subprocess.CompletedProcess:
    cmd = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--hide-scrollbars", "--force-device-scale-factor=1",
           f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}", *args]
    env = dict(os.environ, HOME=str(profile))  # Chromium writes caches under $HOME
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="session")
def binary():
    """The Chromium binary; set up before the (session-scoped) sweep, so that a machine
    without Chromium fails at once."""
    return chromium()


@pytest.fixture(scope="module")
def rendered(binary, sim_sweep, tmp_path_factory):
    """(layout measured by the probe, screenshot as an RGB array) of the sweep's report.html."""
    work = tmp_path_factory.mktemp("chromium")
    html = (sim_sweep["out"] / "report.html").read_text(encoding="utf-8")
    probe = work / "probe.html"
    probe.write_text(html.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = run_chromium(binary, work / "profile-dom", "--virtual-time-budget=5000", "--dump-dom",
                       probe.as_uri())
    found = re.search(r'<pre id="dvfs-probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, f"the probe did not run (rc {dom.returncode}):\n{dom.stderr[-2000:]}"
    import html as html_lib

    layout = json.loads(html_lib.unescape(found.group(1)))

    shot = work / "report.png"
    run = run_chromium(binary, work / "profile-shot", f"--screenshot={shot}",
                       (sim_sweep["out"] / "report.html").as_uri())
    assert shot.is_file(), f"no screenshot (rc {run.returncode}):\n{run.stderr[-2000:]}"
    from PIL import Image

    with Image.open(shot) as im:
        pixels = np.asarray(im.convert("RGB"), dtype=np.int16)
    return layout, pixels


def test_every_image_decodes_at_its_own_size(rendered):
    layout, _ = rendered
    images = layout["images"]
    assert len(images) == 2  # pareto.png and clocks.png, inline
    for img in images:
        assert img["complete"]
        assert (img["naturalWidth"], img["naturalHeight"]) == REPORT_SIZE
        # Scaled to the page, never beyond its own size, aspect kept.
        w, h = img["shownWidth"], img["shownHeight"]
        assert 0.6 * REPORT_SIZE[0] <= w <= REPORT_SIZE[0]
        assert h == pytest.approx(w * REPORT_SIZE[1] / REPORT_SIZE[0], abs=2)


def test_the_page_and_its_tables_fit_a_1400_px_window(rendered):
    layout, _ = rendered
    assert layout["page"]["scrollWidth"] <= layout["page"]["clientWidth"]
    tables = layout["tables"]
    assert len(tables) >= 6
    for t in tables:
        assert t["rows"] >= 2 and t["height"] > 0 and t["width"] > 0
        assert not t["overflows"], t


def test_the_sections_a_reader_looks_for_are_there(rendered):
    layout, _ = rendered
    headings = layout["headings"]
    assert headings[0] == "dvfs sweep report"
    for h in ("Summary", "Recommended settings", "Stability thresholds", "Sweep configuration",
              "Devices", "Library versions"):
        assert h in headings
    # The summary and the first figure come before the configuration and device tables.
    assert headings.index("Summary") < headings.index("Sweep configuration")


def test_the_screenshot_shows_the_plots_where_the_images_are(rendered):
    layout, pixels = rendered
    assert pixels.shape == (WINDOW[1], WINDOW[0], 3)
    assert pixels.std() > 20  # not a blank page
    first = layout["images"][0]
    top, left = int(first["top"]), int(first["left"])
    bottom, right = int(first["top"] + first["height"]), int(first["left"] + first["width"])
    assert bottom <= WINDOW[1], "the Pareto figure should be in the first screenful of 3000 px"
    region = pixels[top + 5:bottom - 5, left + 5:right - 5]
    ink = (region < 200).any(axis=2).mean()  # axes, text, markers
    colour = (region.max(axis=2) - region.min(axis=2) > 80).sum()  # the series' colours
    assert 0.01 < ink < 0.6, ink
    assert colour > 500, colour


def test_the_screenshot_shows_text_where_the_tables_are(rendered):
    layout, pixels = rendered
    table = next(t for t in layout["tables"] if t["top"] + t["height"] <= WINDOW[1])
    region = pixels[int(table["top"]) + 2:int(table["top"] + table["height"]) - 2,
                    int(table["left"]) + 2:int(table["left"] + table["width"]) - 2]
    assert (region.max(axis=2) < 100).mean() > 0.01  # dark glyphs on a light table
