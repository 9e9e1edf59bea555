"""Answer the layout family's composition requests with bijection inference.

The rules ask ``lwant-d L K k`` (the distributed side applies layout op k to a tensor related by
layout L and kind K) or ``lwant-b L K k`` (the baseline side does). The answer row says which
layout and kind relate the results, or is absent when no split/merge bijection exists.
"""

from __future__ import annotations

from .bijection import Layout
from .signature import Sig, prod, scale

ID = "id"


class LayoutSolver:
    def __init__(self, c: int) -> None:
        self.c = c
        self.layouts: dict[str, Layout] = {}
        self.answered: set[tuple[str, str, str, str]] = set()

    def _key(self, layout: Layout) -> str:
        if layout.is_identity():
            return ID
        k = layout.key()
        self.layouts[k] = layout
        return k

    def _get(self, key: str, shape: tuple[int, ...]) -> Layout | None:
        if key == ID:
            return Layout.identity(shape)
        return self.layouts.get(key)

    def step(self, side: str, lkey: str, kind: str, sig: Sig) -> tuple[str, str] | None:
        src = sig.ins[0][1]
        out = sig.out[1]
        perm = _perm(sig)
        if side == "d":
            layout = self._get(lkey, src)
            if layout is None or layout.src != src:
                return None
            new = layout.then_src_transpose(perm) if sig.opcode == "transpose" else layout.then_src_reshape(out)
            return None if new is None else (self._key(new), kind)
        # Baseline side: the laid-out distributed tensor has x's shape, or its per-rank block.
        if kind.startswith("s:"):
            d = int(kind[2:])
            per_rank_src = scale(src, d, self.c)
            if per_rank_src is None:
                return None
            layout = self._get(lkey, per_rank_src)
            if layout is None or layout.dst != per_rank_src:
                return None
            if sig.opcode == "transpose":
                return self._key(layout.then_dst_transpose(perm)), f"s:{perm.index(d)}"
            for e in range(len(out)):
                if prod(src[:d]) == prod(out[:e]) and out[e] % self.c == 0:
                    per_rank_out = scale(out, e, self.c)
                    new = layout.then_dst_reshape(per_rank_out) if per_rank_out else None
                    if new is not None:
                        return self._key(new), f"s:{e}"
            return None
        layout = self._get(lkey, src)
        if layout is None or layout.dst != src:
            return None
        new = layout.then_dst_transpose(perm) if sig.opcode == "transpose" else layout.then_dst_reshape(out)
        return None if new is None else (self._key(new), kind)

    def describe(self, lkey: str) -> list[str]:
        layout = self.layouts.get(lkey)
        return layout.ops() if layout else []


def _perm(sig: Sig) -> list[int]:
    text = sig.attr("dimensions") or "[]"
    return [int(x) for x in text.strip("[]").split(",") if x.strip()]
