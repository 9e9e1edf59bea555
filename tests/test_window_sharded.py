"""Window laws along the SHARDED dim (rules/window.egg, issue 15 item 5), on pairs written with
real JAX (``shard_map`` on 4 virtual CPU devices, produced in a subprocess because XLA_FLAGS must
be set before jax starts; the per-rank program is cut out as tests/adversarial/jax_pairs.py does).

- reverse along the sharded dim, three spellings: a local reverse then a collective-permute
  r -> c-1-r; an all-gather, a reverse and the rank's own block; an all-gather, the mirrored
  block at (c-1-r)·w by dynamic-slice, then a local reverse. f32 and s32, and a reverse of two
  dims at once.
- cumsum (``jnp.cumsum``: reduce-window, window = the dim, padding (n-1, 0)) along the sharded
  dim: the local cumsum plus the exclusive prefix of the all-gathered block totals, the mask
  ``arange(c) < r`` (or ``r > arange(c)``) applied by select or as a 0/1 factor; f32 and s32,
  sharded along dim 0 or 1.
- a rank's dot with a unit batch dim (one head per rank, ``lax.dot_general`` batched over
  ``q[None]``) against the baseline's unbatched dot over the merged heads (multi-query
  attention: one K head shared by every query head).

Every correct pair is verified and the witness (XLA's CPU runtime) finds every output equal;
every bug variant (a ring shift instead of the mirror, the mirror index off by one, a missing
local reverse; an inclusive scan ``k <= r``, an off-by-one rank mask ``k < r + 1`` or
``k < r - 1``; the dot's operands swapped) is never verified and the witness confirms a
difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

C = 4


def _flip(dims: tuple[int, ...]) -> Callable[..., Any]:
    def base(x: Any) -> Any:
        import jax.numpy as jnp

        return jnp.flip(x, dims) * 2

    return base


def _rev_permute(dims: tuple[int, ...], pairs: Callable[[int], int]) -> Callable[..., Any]:
    def body(x: Any) -> Any:
        import jax.numpy as jnp
        from jax import lax

        return lax.ppermute(jnp.flip(x, dims), "i", [(r, pairs(r)) for r in range(C)]) * 2

    return body


def _rev_gather_own(x: Any) -> Any:
    import jax.numpy as jnp
    from jax import lax

    g = lax.all_gather(x, "i", tiled=True)
    w = x.shape[0]
    return lax.dynamic_slice_in_dim(jnp.flip(g, 0), lax.axis_index("i") * w, w, 0) * 2


def _rev_gather_mirror(flip: bool, back: int) -> Callable[..., Any]:
    def body(x: Any) -> Any:
        import jax.numpy as jnp
        from jax import lax

        g = lax.all_gather(x, "i", tiled=True)
        w = x.shape[0]
        block = lax.dynamic_slice_in_dim(g, (back - lax.axis_index("i")) * w, w, 0)
        return (jnp.flip(block, 0) if flip else block) * 2

    return body


def _cumsum_base(d: int) -> Callable[..., Any]:
    def base(x: Any) -> Any:
        import jax.numpy as jnp

        return jnp.cumsum(x, d)

    return base


def _cumsum_body(d: int, mask: Callable[[Any, Any], Any], how: str) -> Callable[..., Any]:
    """Local cumsum + sum over k of the all-gathered block totals where mask(k, r)."""

    def body(x: Any) -> Any:
        import jax.numpy as jnp
        from jax import lax

        g = lax.all_gather(jnp.sum(x, d), "i")  # [c, other dim]: rank k's totals at k
        m = mask(jnp.arange(C), lax.axis_index("i"))[:, None]
        o = jnp.sum(jnp.where(m, g, 0), 0) if how == "where" else jnp.sum(g * m.astype(g.dtype), 0)
        return jnp.cumsum(x, d) + jnp.expand_dims(o, d)

    return body


def _mqa_base(x: Any, wq: Any, wk: Any) -> Any:
    q = (x @ wq).reshape(8, 4, 4).transpose(1, 0, 2).reshape(32, 4)  # heads merged into rows
    return (q @ (x @ wk).T).reshape(4, 8, 8)


def _mqa_body(swap: bool) -> Callable[..., Any]:
    def body(x: Any, wq: Any, wk: Any) -> Any:
        from jax import lax

        q, k = (x @ wq)[None], (x @ wk).T[None]  # the rank's one head as a unit batch dim
        if swap:
            q, k = (x @ wk)[None], (x @ wq).T[None]
        return lax.dot_general(q, k, (((2,), (1,)), ((0,), (0,))))

    return body


ROW = (("i", None),)
COL = ((None, "i"),)
X = ((16, 8),)
MQA = (((8, 16), (16, 16), (16, 4)), ((None, None), (None, "i"), (None, None)), ("i", None, None))
# name: (description, dtype, shapes, in_specs, out_spec, baseline, body)
PAIRS: dict[str, tuple[str, str, tuple[tuple[int, ...], ...], tuple[tuple[str | None, ...], ...], tuple[str | None, ...], Callable[..., Any], Callable[..., Any]]] = {
    "c_rev_permute_f32": ("local reverse, then permute r -> c-1-r", "float32", X, ROW, ROW[0], _flip((0,)), _rev_permute((0,), lambda r: C - 1 - r)),
    "c_rev_permute_s32": ("the same on int32", "int32", X, ROW, ROW[0], _flip((0,)), _rev_permute((0,), lambda r: C - 1 - r)),
    "c_rev2_permute_f32": ("reverse of the sharded and another dim, then the mirror permute", "float32", X, ROW, ROW[0], _flip((0, 1)), _rev_permute((0, 1), lambda r: C - 1 - r)),
    "c_rev_gather_own_f32": ("all-gather, reverse, the rank's own block", "float32", X, ROW, ROW[0], _flip((0,)), _rev_gather_own),
    "c_rev_gather_mirror_f32": ("all-gather, block (c-1-r) by dynamic-slice, local reverse", "float32", X, ROW, ROW[0], _flip((0,)), _rev_gather_mirror(True, C - 1)),
    "c_rev_gather_mirror_s32": ("the same on int32", "int32", X, ROW, ROW[0], _flip((0,)), _rev_gather_mirror(True, C - 1)),
    "b_rev_shift": ("a ring shift r -> r+1 instead of the mirror", "float32", X, ROW, ROW[0], _flip((0,)), _rev_permute((0,), lambda r: (r + 1) % C)),
    "b_rev_local_only": ("local reverse, no block swap", "float32", X, ROW, ROW[0], _flip((0,)), _rev_permute((0,), lambda r: r)),
    "b_rev_mirror_off_by_one": ("mirrored block at (c-2-r)·w", "float32", X, ROW, ROW[0], _flip((0,)), _rev_gather_mirror(True, C - 2)),
    "b_rev_mirror_no_flip": ("mirrored block without the local reverse", "float32", X, ROW, ROW[0], _flip((0,)), _rev_gather_mirror(False, C - 1)),
    "c_cumsum_where_f32": ("totals of ranks k < r by select", "float32", X, ROW, ROW[0], _cumsum_base(0), _cumsum_body(0, lambda k, r: k < r, "where")),
    "c_cumsum_where_s32": ("the same on int32 (wraps alike)", "int32", X, ROW, ROW[0], _cumsum_base(0), _cumsum_body(0, lambda k, r: k < r, "where")),
    "c_cumsum_gt_mul_f32": ("mask r > k as a float factor", "float32", X, ROW, ROW[0], _cumsum_base(0), _cumsum_body(0, lambda k, r: r > k, "mul")),
    "c_cumsum_gt_mul_s32": ("mask r > k as an int factor", "int32", X, ROW, ROW[0], _cumsum_base(0), _cumsum_body(0, lambda k, r: r > k, "mul")),
    "c_cumsum_dim1_f32": ("cumsum along the sharded dim 1", "float32", ((8, 16),), COL, COL[0], _cumsum_base(1), _cumsum_body(1, lambda k, r: k < r, "where")),
    "b_cumsum_inclusive": ("inclusive scan: mask k <= r", "float32", X, ROW, ROW[0], _cumsum_base(0), _cumsum_body(0, lambda k, r: k <= r, "where")),
    "b_cumsum_inclusive_s32": ("inclusive scan on int32", "int32", X, ROW, ROW[0], _cumsum_base(0), _cumsum_body(0, lambda k, r: k <= r, "mul")),
    "b_cumsum_mask_plus_one": ("rank mask off by one: k < r + 1", "float32", X, ROW, ROW[0], _cumsum_base(0), _cumsum_body(0, lambda k, r: k < r + 1, "mul")),
    "b_cumsum_mask_minus_one": ("rank mask off by one: k < r - 1", "float32", X, ROW, ROW[0], _cumsum_base(0), _cumsum_body(0, lambda k, r: k < r - 1, "where")),
    "b_cumsum_local_only": ("local cumsum, no offset", "float32", X, ROW, ROW[0], _cumsum_base(0), _cumsum_body(0, lambda k, r: k < 0, "where")),
    "c_mqa_unit_batch_dot": ("one head per rank as a unit batch dim, baseline heads merged", "float32", *MQA, _mqa_base, _mqa_body(False)),
    "b_mqa_unit_batch_dot_swapped": ("the dot's operands swapped (k·qᵀ)", "float32", *MQA, _mqa_base, _mqa_body(True)),
}


def _produce(out: Path) -> None:  # runs in a subprocess: python tests/test_window_sharded.py OUT
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={C}"
    sys.path.insert(0, str(Path(__file__).parent / "adversarial"))
    from jax_pairs import JaxPair, write

    for name, (desc, dtype, shapes, in_specs, out_spec, base_fn, body) in PAIRS.items():
        pair = JaxPair(name, desc, shapes, in_specs, out_spec, base_fn, body, dtypes=(dtype,) * len(shapes))
        write(pair, out / name)


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("jax")
    out = tmp_path_factory.mktemp("window")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    subprocess.run([sys.executable, __file__, str(out)], check=True, env=env, timeout=600)
    return out


def _check(d: Path) -> Any:
    from shardproof.engine.analysis.check import check_files
    from shardproof.engine.relations import load_relations

    return check_files(load_relations(d / "relations.yaml"), d / "baseline.hlo", d / "distributed.hlo", witness="always")


@pytest.mark.parametrize("name", [n for n in PAIRS if n.startswith("c_")])
def test_correct_pair_is_verified_and_equal(produced: Path, name: str) -> None:
    from shardproof.engine.analysis.verify import VERIFIED

    r = _check(produced / name)
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


@pytest.mark.parametrize("name", [n for n in PAIRS if n.startswith("b_")])
def test_bug_variant_is_never_verified(produced: Path, name: str) -> None:
    from shardproof.engine.analysis.verify import DIVERGED

    r = _check(produced / name)
    assert r.verdict == DIVERGED, r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


if __name__ == "__main__":
    _produce(Path(sys.argv[1]))
