"""Scale-out over a job matrix: ``shard: k/n`` verifies a deterministic part of the models and
writes a partial result; ``mode: merge`` combines the partial results into one document, which
the bot then reports like any other run (one review, one summary, one status).

A shard never talks to GitHub: it needs no token, so shards can run as the unprivileged half of
the fork-safe split, and the merge job (which does not run any pull-request code) posts.

Soundness of the merge: every declared model must come back. A shard whose result is missing
(its job failed or was cancelled, or its artifact was not downloaded) turns each of its models
into ``build-failed`` — never into a pass — and partial results that disagree about what was
run (another commit, another configuration, another shard count) make the whole run an error.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .runner import RunnerError

PARTIAL_VERSION = 1
# What a model's folder may hold; only these are copied from a (possibly untrusted) partial.
MODEL_FILES = ("baseline.hlo", "distributed.hlo", "relations.yaml", "sourcemap.json", "baseline.sourcemap.json", "build.log")
ARTIFACT_FILES = {"baseline": "baseline.hlo", "distributed": "distributed.hlo", "relations": "relations.yaml", "sourcemap": "sourcemap.json"}
MAX_FILE_BYTES = 256 * 1024 * 1024
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/3"`` -> (2, 3): the second of three shards (1-based, as matrix values read)."""
    m = _SHARD.match(text or "")
    if not m:
        raise ValueError(f"{text!r} is not k/n (for example 2/3)")
    k, n = int(m.group(1)), int(m.group(2))
    if not 1 <= k <= n:
        raise ValueError(f"{text!r}: expected 1 <= k <= n")
    return k, n


def pick(names: Sequence[str], index: int, count: int) -> list[str]:
    """The models of shard ``index`` of ``count``: every count-th model in declaration order.

    Round robin rather than contiguous blocks: related models (a model and its bug variants) sit
    next to each other in a configuration and tend to cost the same, so this spreads the cost.
    It depends only on the declared order, so every job of a matrix computes the same split.
    """
    return [name for i, name in enumerate(names) if i % count == index - 1]


def _relative_to(path: str, out_dir: Path, root: Path) -> str | None:
    """``path`` (repository-relative or absolute, as the front end names artifacts) relative to
    ``out_dir``, or None when it lies outside it."""
    p = Path(path)
    full = (p if p.is_absolute() else root / p).resolve()
    try:
        return full.relative_to(out_dir.resolve()).as_posix()
    except ValueError:
        return None


def make_partial(doc: dict[str, Any], index: int, count: int, declared: Sequence[str], selected: Sequence[str], sha: str, out_dir: Path, root: Path) -> dict[str, Any]:
    """The shard's result document: the runner's, plus what the merge checks it against, with
    artifact paths relative to the document's folder (the uploaded artifact is that folder)."""
    partial = json.loads(json.dumps(doc))
    for entry in partial.get("models") or []:
        for key, value in list((entry.get("artifacts") or {}).items()):
            if isinstance(value, str):
                entry["artifacts"][key] = _relative_to(value, out_dir, root)
        if isinstance(entry.get("log"), str):
            entry["log"] = _relative_to(entry["log"], out_dir, root)
    partial["shard"] = {"version": PARTIAL_VERSION, "index": index, "count": count, "models": list(selected), "declared": list(declared), "sha": sha}
    return partial


def _load(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("shard"), dict) else None


def _names(value: Any, what: str, where: Path) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise RunnerError(f"{where}: shard.{what} is not a list of model names")
    return list(value)


class MergeRunner:
    """The runner seam for ``mode: merge``: the partial results found under ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def run(self, config: Path, out_dir: Path, models: list[str] | None) -> dict[str, Any]:
        if not self.folder.is_dir():
            raise RunnerError(f"no partial results: {self.folder} is not a folder (download the shards' artifacts there)")
        found = [(p, d) for p in sorted(self.folder.rglob("result.json")) if (d := _load(p)) is not None]
        if not found:
            raise RunnerError(f"no partial results under {self.folder} (result.json files written with shard: k/n)")
        first_path, first = found[0]
        head = first["shard"]
        count, sha = head.get("count"), head.get("sha")
        declared = _names(head.get("declared"), "declared", first_path)
        by_index: dict[int, tuple[Path, dict[str, Any]]] = {}
        for path, doc in found:
            s = doc["shard"]
            if s.get("count") != count or s.get("sha") != sha or _names(s.get("declared"), "declared", path) != declared:
                raise RunnerError(f"the partial results do not belong to one run: {path} (shard {s.get('index')}/{s.get('count')} of commit {str(s.get('sha'))[:12]}, {len(s.get('declared') or [])} models) and {first_path} (shard {head.get('index')}/{count} of commit {str(sha)[:12]}, {len(declared)} models)")
            index = s.get("index")
            if not isinstance(index, int) or not isinstance(count, int) or not 1 <= index <= count:
                raise RunnerError(f"{path}: shard index {index!r} of {count!r} is not valid")
            if index in by_index:
                raise RunnerError(f"shard {index}/{count} has two results: {by_index[index][0]} and {path}")
            by_index[index] = (path, doc)
        assert isinstance(count, int)

        out_dir.mkdir(parents=True, exist_ok=True)
        entries: dict[str, dict[str, Any]] = {}
        for index in range(1, count + 1):
            expected = pick(declared, index, count)
            if index not in by_index:
                for name in expected:
                    entries[name] = _missing(name, f"shard {index}/{count} reported no result (its job failed or was cancelled, or its artifact was not downloaded)")
                continue
            path, doc = by_index[index]
            if _names(doc["shard"].get("models"), "models", path) != expected:
                raise RunnerError(f"{path}: shard {index}/{count} ran {doc['shard'].get('models')}, but its part of the declared models is {expected}")
            got = {str(e.get("name")): e for e in doc.get("models") or [] if isinstance(e, dict)}
            for name in expected:
                if name not in got:
                    why = doc.get("error") or "the shard's result does not list it"
                    entries[name] = _missing(name, f"shard {index}/{count}: {why}")
                    continue
                entries[name] = self._adopt(got[name], path.parent, out_dir)
        return {
            "version": first.get("version", 1),
            "config": first.get("config", ""),
            "repository_root": first.get("repository_root", "."),
            "models": [entries[name] for name in declared],
            "seconds": max((float(d.get("seconds") or 0.0) for _, d in by_index.values()), default=0.0),
            "sha": sha,
            "shards": {"count": count, "received": sorted(by_index)},
        }

    def _adopt(self, entry: dict[str, Any], source: Path, out_dir: Path) -> dict[str, Any]:
        """The entry with its files copied into ``out_dir/<name>/`` and paths relative to it."""
        entry = json.loads(json.dumps(entry))
        name = str(entry.get("name"))
        if not re.fullmatch(r"[\w.\-]+", name) or name in (".", ".."):
            raise RunnerError(f"{source}: model name {name!r} cannot name a folder")
        target = out_dir / name
        copied: dict[str, str] = {}
        for file in MODEL_FILES:
            src = _inside(source, source / name / file)
            if src is None:
                continue
            target.mkdir(parents=True, exist_ok=True)
            dst = target / file
            if src.resolve() != dst.resolve():
                shutil.copyfile(src, dst)
            copied[file] = f"{name}/{file}"
        entry["artifacts"] = {k: copied.get(f) for k, f in ARTIFACT_FILES.items()}
        entry["log"] = copied.get("build.log")
        return entry


def _inside(root: Path, path: Path) -> Path | None:
    """``path`` if it is a regular file of sane size inside ``root`` (partials may be untrusted)."""
    if path.is_symlink() or not path.is_file():
        return None
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return None
    return path if path.stat().st_size <= MAX_FILE_BYTES else None


def _missing(name: str, reason: str) -> dict[str, Any]:
    return {"name": name, "status": "build-failed", "seconds": 0.0, "build": {"seconds": 0.0, "peak_rss_mb": 0.0, "error": reason}, "artifacts": {}}
