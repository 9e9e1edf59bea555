"""Render the golden report files the way a person sees them: headless Chromium, to PNG.

``python tests/render_png.py [OUT_DIR]`` writes trace.png (tests/golden/trace.html) and, through
the ``marked`` GFM renderer installed by ``make install``, review.png, inline.png and
summary.png from the golden markdown, and inline-<model>.png: each example bug of the fixture as
its inline comment — default OUT_DIR is ``out/golden-png``. The tests use the
same functions and also measure the page in the browser (labels inside their boxes, nodes not
overlapping, both graphs drawn).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
TOOLS = ROOT / ".tools" / "node_modules"
WIDTH = 1280
MAX_HEIGHT = 12000

# Runs in the page after layout; the verdict lands in a data attribute that --dump-dom prints.
MEASURE = """
<script>
window.addEventListener('load', () => {
  const out = {height: document.documentElement.scrollHeight, svgs: 0, nodes: 0, frontiers: 0,
               counterparts: 0, overflow: [], overlaps: [], clipped: [], panels_overlap: 0};
  for (const svg of document.querySelectorAll('svg')) {
    out.svgs++;
    const box = svg.getBoundingClientRect();
    const rects = [];
    for (const g of svg.querySelectorAll('g.node')) {
      out.nodes++;
      if (g.classList.contains('frontier')) out.frontiers++;
      if (g.classList.contains('counterpart')) out.counterparts++;
      const r = g.querySelector('rect').getBoundingClientRect();
      rects.push([g.querySelector('text').textContent, r]);
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1)
        out.clipped.push(g.querySelector('text').textContent);
      for (const t of g.querySelectorAll('text')) {
        const b = t.getBoundingClientRect();
        if (b.left < r.left - 0.5 || b.right > r.right + 0.5) out.overflow.push(t.textContent);
      }
    }
    for (let i = 0; i < rects.length; i++) for (let j = i + 1; j < rects.length; j++) {
      const [a, b] = [rects[i][1], rects[j][1]];
      if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom) out.overlaps.push([rects[i][0], rects[j][0]]);
    }
  }
  for (const pair of document.querySelectorAll('.pair')) {
    const [p, q] = [...pair.querySelectorAll('.panel')].map(x => x.getBoundingClientRect());
    if (p && q && p.left < q.right && q.left < p.right && p.top < q.bottom && q.top < p.bottom) out.panels_overlap++;
  }
  document.body.setAttribute('data-measure', JSON.stringify(out));
});
</script>
"""

GITHUB_CSS = """
body { max-width: 900px; margin: 24px auto; padding: 0 24px; color: #1f2328;
       font: 14px/1.5 -apple-system, "Segoe UI", "Noto Sans", Helvetica, Arial, sans-serif; }
code { font: 12px ui-monospace, "DejaVu Sans Mono", monospace; background: #eff2f5; padding: 1px 4px; border-radius: 4px; }
pre { background: #f6f8fa; padding: 12px; border-radius: 6px; overflow: auto; } pre code { background: none; padding: 0; }
table { border-collapse: collapse; display: block; overflow: auto; } th, td { border: 1px solid #d1d9e0; padding: 4px 10px; }
th { background: #f6f8fa; } blockquote { color: #59636e; border-left: 4px solid #d1d9e0; margin: 0; padding: 0 12px; }
h2 { border-bottom: 1px solid #d1d9e0; padding-bottom: 6px; } details { margin: 8px 0; } summary { cursor: pointer; }
.frame { border: 1px solid #d1d9e0; border-radius: 6px; padding: 8px 16px; }
"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    raise FileNotFoundError("Chromium is not installed: run `make install` (it installs it with apt-get)")


def _run(args: list[str]) -> str:
    # --no-sandbox: CI containers run as root; the pages are our own files.
    base = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1", "--disable-dev-shm-usage"]
    p = subprocess.run(base + args, capture_output=True, text=True, timeout=120, env={**os.environ, "LANG": "C.UTF-8"})
    if p.returncode != 0:
        raise RuntimeError(f"chromium failed ({p.returncode}): {p.stderr[-2000:]}")
    return p.stdout


def measure(html: Path) -> dict:
    """Load the page with the measuring script; returns what it found."""
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "page.html"
        page.write_text(html.read_text().replace("</body>", MEASURE + "</body>"))
        dom = _run(["--dump-dom", "--virtual-time-budget=2000", f"--window-size={WIDTH},900", page.as_uri()])
    m = re.search(r"data-measure=\"([^\"]*)\"", dom)
    if not m:
        raise RuntimeError("the page did not report its measurements")
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def screenshot(html: Path, png: Path) -> tuple[int, int]:
    height = min(MAX_HEIGHT, int(measure(html)["height"]) + 16)
    png.parent.mkdir(parents=True, exist_ok=True)
    _run([f"--screenshot={png}", f"--window-size={WIDTH},{height}", html.as_uri()])
    return png_size(png)


def png_size(png: Path) -> tuple[int, int]:
    head = png.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{png} is not a PNG")
    return struct.unpack(">II", head[16:24])


def markdown_page(md: Path, out: Path) -> Path:
    """GitHub-flavoured markdown to a page (``marked``, installed under .tools by make install)."""
    if not (TOOLS / "marked").exists():
        raise FileNotFoundError("the `marked` renderer is missing: run `make install`")
    script = "const {marked} = require(process.argv[1]); const fs = require('fs'); process.stdout.write(marked.parse(fs.readFileSync(process.argv[2], 'utf8'), {gfm: true}));"
    body = subprocess.run(["node", "-e", script, str(TOOLS / "marked"), str(md)], capture_output=True, text=True, check=True, timeout=60).stdout
    out.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{GITHUB_CSS}</style></head><body><div class='frame'>{body}</div></body></html>")
    return out


def bug_comments(out_dir: Path) -> list[Path]:
    """Each diverging finding of the golden fixture as the inline comment it becomes when the
    pull request changes its line (missing all-reduce, BSH layout, wrong groups), to PNG."""
    sys.path.insert(0, str(ROOT / "tests"))
    from shardproof.bot import render
    from shardproof.bot.diff import DiffIndex
    from shardproof.bot.findings import collect, load_run_file, place

    run = load_run_file(GOLDEN / "fixture" / "result.json")
    findings = [f for f in collect(run, str(GOLDEN / "fixture" / "workspace")) if not f.is_gap and f.source]
    lines: dict[str, list[int]] = {}
    for f in findings:
        assert f.source is not None
        lines.setdefault(f.source.path, []).append(f.source.line)
    diff = DiffIndex.from_entries([{"filename": p, "status": "modified", "patch": "\n".join(f"@@ -{n - 1},3 +{n - 1},3 @@\n a\n-old\n+new\n c" for n in sorted(ns))} for p, ns in lines.items()])
    placement = place(findings, diff, "added", 30)
    ctx = render.Ctx(repo="acme/models", sha="0123456789abcdef0123456789abcdef01234567", server_url="https://github.com", run_url="https://github.com/acme/models/actions/runs/1", state="failure", fail_on="diverged")
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = []
    for group in placement.inline:
        md = out_dir / f"inline-{group[0].model}.md"
        md.write_text(render.inline_comment(group, ctx))
        png = out_dir / f"inline-{group[0].model}.png"
        screenshot(markdown_page(md, out_dir / f"inline-{group[0].model}.html"), png)
        pngs.append(png)
    return pngs


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    w, h = screenshot(GOLDEN / "trace.html", out_dir / "trace.png")
    print(f"{out_dir / 'trace.png'}  {w}x{h}")
    for name in ("review", "inline", "summary"):
        page = markdown_page(GOLDEN / f"{name}.md", out_dir / f"{name}.html")
        w, h = screenshot(page, out_dir / f"{name}.png")
        print(f"{out_dir / (name + '.png')}  {w}x{h}")
    for png in bug_comments(out_dir):
        w, h = png_size(png)
        print(f"{png}  {w}x{h}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "out" / "golden-png")
