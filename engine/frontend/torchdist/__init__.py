"""torch.distributed code, built per rank and lifted into one SPMD program.

Models that read the rank as a Python int (Megatron-LM, NeMo, DeepSpeed, fairscale) declare
``rank: int`` in ``.shardproof.yml``. For each rank the front end starts ``torch.distributed``
with this package's process-group backend (``backend.py``: collectives become token-free XLA
collectives over the real groups), builds the rank's program in its own child under the
trace-time shims (``shims.py``), and lifts the per-rank programs into the one program all ranks
run (``lift.py``): literals that differ across ranks as ``a·r + b`` become rank arithmetic,
replica groups are merged, and any other difference is a ``rank-specific`` finding.
"""
