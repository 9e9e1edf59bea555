"""The JAX front end: ``framework: jax`` models (declare.py), built in a JAX process (build.py),
checked like any pair (run.py). Importing this package does not import jax."""
