import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import docker_support  # found through the path above
from fake_github import FakeGitHub


@pytest.fixture
def fake() -> Iterator[FakeGitHub]:
    """A fresh stateful fake GitHub over real HTTP, for the bot's tests."""
    f = FakeGitHub().start()
    yield f
    f.stop()
    assert f.errors == [], f.errors  # the fake itself must not have failed


# Docker for the action's tests: one daemon and one image build per session, shared by the
# end-to-end and sandbox tests. Defined here so that every module gets the same session instance.
@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[docker_support.Daemon]:
    with docker_support.docker_session() as daemon:
        yield daemon


@pytest.fixture(scope="session")
def action_image(docker_daemon: docker_support.Daemon, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The action's image id, built from the repository's Dockerfile on a debootstrapped base."""
    work: Path = tmp_path_factory.mktemp("image")
    base = docker_support.make_base_image(docker_daemon, work)
    return docker_support.build_image(docker_daemon, base, work / "build.log")
