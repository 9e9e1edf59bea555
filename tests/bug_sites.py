"""``# BUG-SITE: <variant>[, <variant>...]`` comments: where each bug variant must be reported."""

from __future__ import annotations

import re
from pathlib import Path

_BUG_SITE_RE = re.compile(r"#\s*BUG-SITE:\s*([A-Za-z0-9_, ]+?)\s*$")


def bug_sites(files: list[Path], root: Path) -> dict[str, tuple[str, int]]:
    """variant -> (file relative to ``root``, 1-based line) over ``files``; a variant marked
    twice is an error."""
    sites: dict[str, tuple[str, int]] = {}
    for path in files:
        rel = path.resolve().relative_to(root.resolve()).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            match = _BUG_SITE_RE.search(line)
            if not match:
                continue
            for variant in (v.strip() for v in match.group(1).split(",")):
                if variant in sites:
                    raise ValueError(f"{rel}:{number}: second BUG-SITE for {variant} (first {sites[variant]})")
                sites[variant] = (rel, number)
    return sites
