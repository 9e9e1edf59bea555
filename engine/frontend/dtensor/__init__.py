"""DTensor code (``torch.distributed.tensor``), hosted by the torch.distributed front end.

Models written on DTensor (``init_device_mesh`` + ``parallelize_module`` with PyTorch's
parallel styles, transformers' TP plans, torchtitan's ``parallelize_llama``) read the rank as a
Python int from the process group, so they are declared ``rank: int`` and built per rank by
``torchdist/``. This package is what DTensor needs on top of that build:

- ``host.py``: while the entry point declares the model, a "cuda" mesh builds without a GPU and
  a mesh larger than the world, or a plan entry that names no module, is a declaration error;
  while a rank is traced, every DTensor parameter becomes a placeholder of its *local* shape
  wrapped back into a DTensor, every mesh reads as an XLA mesh (so ``from_local`` never moves a
  placeholder to the CPU), DTensor's local computations run under torch-xla's
  functionalization, and DTensor / ``AsyncCollectiveTensor`` outputs become plain tensors;
- ``plan_frames.py``: the line that wrote each plan entry's ParallelStyle, appended as an
  outermost frame to the instructions of the module it styles (and their uses on its calling
  lines), so a plan bug reported where its values differ carries its plan line too;
- ``placements.py``: the relations of parameters and outputs derived from their placements
  (``Shard(d)``, ``Replicate()``, ``Partial()``), checked against both shapes and the groups.
"""
