"""Differential check of layer folding and the layer memo (issue 19): multi-layer pairs, one-layer
mutations, three modes of the verifier and XLA's CPU runtime as the numeric oracle."""
