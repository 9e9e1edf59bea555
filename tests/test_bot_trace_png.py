"""trace.html and the review as a person sees them: rendered by headless Chromium to PNG, and
measured in the browser — every label inside its box, no two nodes on top of each other, both
graphs of every divergence drawn with the frontier (and, where one exists, the baseline
instruction it should match) marked. Chromium comes from `make install`; without it this fails."""

from __future__ import annotations

from pathlib import Path

import render_png as rp

GOLDEN = Path(__file__).parent / "golden"


def test_trace_html_renders_and_reads_well(tmp_path: Path) -> None:
    m = rp.measure(GOLDEN / "trace.html")
    # Three divergences and the three places the rules stopped in the unproven model, baseline
    # and distributed side by side.
    assert m["svgs"] == 12
    assert m["frontiers"] == 6 and m["counterparts"] == 5  # wrong_groups has no counterpart
    assert m["nodes"] >= 20
    assert m["overflow"] == [] and m["overlaps"] == [] and m["clipped"] == [] and m["panels_overlap"] == 0
    w, h = rp.screenshot(GOLDEN / "trace.html", tmp_path / "trace.png")
    assert w == rp.WIDTH and 1500 < h < rp.MAX_HEIGHT
    assert (tmp_path / "trace.png").stat().st_size > 100_000  # a blank page compresses to a few KB


def test_review_markdown_renders(tmp_path: Path) -> None:
    page = rp.markdown_page(GOLDEN / "review.md", tmp_path / "review.html")
    html = page.read_text()
    assert "<table>" in html and "<details>" in html and "<summary>Relation trace of output 0" in html
    assert 'href="https://github.com/acme/models/blob/0123456789abcdef0123456789abcdef01234567/tests/pairs/models.py#L' in html
    w, h = rp.screenshot(page, tmp_path / "review.png")
    assert w == rp.WIDTH and h > 600
