"""The torch-xla SPMD front end (``framework: torch-xla-spmd``): models whose shardings are
annotated (``xs.mark_sharding``-style specs on a mesh), verified against what XLA's SPMD
partitioner wrote. Importing this package does not import torch."""
