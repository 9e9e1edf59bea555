# The shardproof GitHub Action: the verifier, the torch-xla front end and the bot in one image.
# GitHub builds it FROM python:3.11-slim; the base is an ARG so that it also builds where Docker
# Hub is out of reach (the tests import a debootstrapped Debian bookworm as BASE).
ARG BASE=python:3.11-slim
FROM ${BASE}

# TORCH selects where torch comes from: pypi (default; the wheels the tests build, ~8 GB with
# PyPI's CUDA libraries) or cpu (PyTorch's CPU-only index, no CUDA libraries: a much smaller
# image for runners without GPUs). The release workflow builds both (.github/workflows/release.yml).
ARG TORCH=pypi

# PJRT_DEVICE: torch-xla traces on the CPU. The venv keeps the install apart from the base's
# Python (Debian's refuses pip installs outside a venv) and gives the entry point a fixed path.
ENV PJRT_DEVICE=CPU \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/shardproof/bin:$PATH

# Third-party packages first, in their own layer (~7 GB with PyPI's torch: its CUDA wheels,
# which `import torch` loads, are most of it) that changes only with these pins. Only what the
# action runs is installed:
# - egglog with --no-deps, plus the five packages its import needs (typing-extensions,
#   cloudpickle, graphviz - the Python package, no binaries -, opentelemetry-api, black, which
#   its pretty-printer imports): its other dependency, anywidget, pulls in IPython, Jupyter
#   widgets and their tools (~65 MB) for a notebook visualiser the action never opens;
# - triton (~600 MB), which PyPI's torch requires on Linux for GPU kernel compilation, is
#   removed in the same step: the action runs torch and torch-xla on the CPU only, and neither
#   imports it there (the smoke check below and the end-to-end tests run real builds without it).
# binutils is needed only to strip egglog's bindings library of debug info (209 MB -> 15 MB)
# and leaves in the same layer. torch-xla links against libpython3.11.so: python:3.11-slim has
# it, Debian's python3 does not.
# DL3008 (pin apt versions): binutils is a build-time tool purged in this very RUN, so nothing of
# it ships; a pinned Debian revision disappears from the mirror with each point release and
# would break the build, whichever base (python:3.11-slim or Debian bookworm) it runs on.
# hadolint ignore=DL3008
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends binutils; \
    python3 -c "import ctypes.util as u, sys; sys.exit(u.find_library('python3.11') is None)" \
        || apt-get install -y --no-install-recommends libpython3.11; \
    python3 -m venv /opt/shardproof; \
    case "$TORCH" in \
        pypi) ;; \
        cpu) pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.9.0 ;; \
        *) echo "TORCH must be pypi or cpu, not $TORCH" >&2; exit 1 ;; \
    esac; \
    pip install --no-cache-dir \
        torch==2.9.0 torch-xla==2.9.0 jax==0.10.2 jaxlib==0.10.2 \
        PyGithub==2.10.0 docker==7.2.0 PyYAML==6.0.3 Jinja2==3.1.6 \
        typing-extensions==4.16.0 cloudpickle==3.1.3 graphviz==0.21 opentelemetry-api==1.45.2 black==26.10.1; \
    pip install --no-cache-dir --no-deps egglog==13.2.0; \
    pip uninstall -y triton; \
    find /opt/shardproof -path '*/egglog/bindings*.so' -exec strip --strip-debug {} +; \
    apt-get purge -y --auto-remove binutils; \
    rm -rf /var/lib/apt/lists/*

# The package itself (.dockerignore lets only its sources in). Its dependencies are all above.
# The checks at the end make a broken image fail here, not in the first pull request: the
# imports, none of the packages left out above, and every rules file loaded into egglog.
COPY . /tmp/shardproof-src
RUN pip install --no-cache-dir --no-deps /tmp/shardproof-src \
    && rm -rf /tmp/shardproof-src \
    && python -c "import torch_xla, egglog, jaxlib, github, docker, shardproof.bot.app" \
    && python -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ('triton', 'IPython', 'anywidget', 'ipywidgets')))" \
    && python -c "from shardproof.engine.analysis.egg import Session; s = Session(); s.run(2, 60.0); s.close()" \
    && shardproof --help > /dev/null

# GitHub runs the container with the workspace as working directory and the inputs as
# INPUT_<NAME> variables; `shardproof github` reads them. Model builds of a pull request run in
# sibling containers of this image when the Docker socket is mounted (bot/sandbox.py).
ENTRYPOINT ["/opt/shardproof/bin/shardproof", "github"]
