"""Programs that change their inputs in place build, for a traced and for an int rank.

Megatron's vocab-parallel cross entropy does ``logits = logits.float(); logits -= max``: for an
f32 input ``.float()`` is the tensor itself, so the model changes the tensor it was given. The
front end hands the program clones of its placeholders, so the captured program's input stays
the declared one. A declared weight changed in place (under ``torch.no_grad()``) still cannot
build; the error must say so, not blame a tensor moved to the device.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_MODELS = '''
import torch

from shardproof.engine.frontend.declare import Input, Model


class InPlace(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offset", torch.ones(8))

    def forward(self, x):
        x = x.float()  # f32 already: the input itself
        x -= 1.0
        x.mul_(2.0)
        self.offset.add_(1.0)  # a buffer updated in place, like running statistics
        return torch.tanh(x) + self.offset


def inplace(ctx):
    return Model(baseline=InPlace(), distributed=lambda rank: InPlace(), inputs=[Input("x", (4, 8))])


class SlicedInPlace(torch.nn.Module):
    """Each rank changes its shard of the input in place, then the ranks sum their halves."""

    def __init__(self, distributed: bool) -> None:
        super().__init__()
        self.distributed = distributed

    def forward(self, x):
        x -= 1.0
        y = (x * x).sum(dim=1)
        if self.distributed:
            import torch.distributed as dist

            dist.all_reduce(y)
        return y


def sliced(ctx):
    return Model(baseline=SlicedInPlace(False), distributed=lambda rank: SlicedInPlace(True),
                 inputs=[Input("x", (4, 8), shard=1)])


class WeightInPlace(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        with torch.no_grad():
            self.weight.mul_(2.0)
        return x * self.weight


def weight(ctx):
    return Model(baseline=WeightInPlace(), distributed=lambda rank: WeightInPlace(), inputs=[Input("x", (4, 8))])
'''


@pytest.mark.parametrize("rank", ["traced", "int"])
def test_in_place_ops_on_inputs_and_buffers_build_and_verify(tmp_path: Path, rank: str) -> None:
    pytest.importorskip("torch_xla")
    from shardproof.engine.frontend.runner import run_models

    (tmp_path / "inplace_models.py").write_text(_MODELS)
    models = "  - {name: inplace, entry: 'inplace_models:inplace', expect: verified}\n"
    if rank == "int":  # torch.distributed is started for int ranks only
        models += "  - {name: sliced, entry: 'inplace_models:sliced', expect: verified}\n"
    models += "  - {name: weight, entry: 'inplace_models:weight'}\n"
    (tmp_path / ".shardproof.yml").write_text(
        f"version: 1\npython_path: ['.']\nroot: .\ndefaults: {{tp: 2, rank: {rank}, timeout: 300}}\nmodels:\n{models}"
    )
    doc = run_models(tmp_path / ".shardproof.yml", tmp_path / "out")
    by_name = {m["name"]: m for m in doc["models"]}
    assert by_name["inplace"]["status"] == "verified", by_name["inplace"]
    if rank == "int":
        assert by_name["sliced"]["status"] == "verified", by_name["sliced"]
    # The baseline's relations read the declared input, not a stray parameter.
    relations = (tmp_path / "out" / "inplace" / "relations.yaml").read_text()
    assert "input x: f32[4,8]" in relations, relations
    failed = by_name["weight"]
    assert failed["status"] == "build-failed", failed
    error = failed["build"]["error"]
    assert "parameter 'weight', changed in place" in error, error
    assert "moved to the device" not in error, error
