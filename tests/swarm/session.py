"""The session's Swarm, a pytest plugin (tests/conftest.py registers it with `pytest_plugins`), so
that every suite needing one (tests/swarm, and tests/engines' `swarm` engine) shares one cluster:
brought up at most once per pytest run, and only when a test asks for it.

`swarm`: one real 3-node Docker Swarm (tests/swarm/cluster.py). Brought up once (about 15 s, most
of it loading the sandbox image on every node), torn down at the end of the session, where
anything left (processes, namespaces, mounts, cgroup directories) fails the run. Skipped, with
the reason, where a Swarm cannot be made (not root, no `ip`/`nsenter`/`dockerd`, no network
namespaces: `cluster.skip_reason()`); a Swarm that should come up but does not fails.

`swarm_agent_image`: the image a server runs on that Swarm for the sandbox image (swarm/images.py),
built on the host and loaded onto every node once; removed from the host at the end.

CUBICLE_SWARM_STATE=FILE uses a swarm made beforehand with
`python3 -m tests.swarm.cluster up --state FILE` and leaves it up (quick iterations).
CUBICLE_SWARM_NODES (3) sets the number of nodes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from conftest import IMAGE
from swarm.cluster import Swarm, SwarmError, skip_reason
from swarm.images import derived_image


def _present(image: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="session")
def swarm() -> Iterator[Swarm]:
    state = os.environ.get("CUBICLE_SWARM_STATE")
    if state:
        yield Swarm.from_state(state)
        return
    reason = skip_reason()
    if reason:
        pytest.skip(f"no Swarm here: {reason}")
    images = [IMAGE] if _present(IMAGE) else []
    try:
        sw = Swarm.up(nodes=int(os.environ.get("CUBICLE_SWARM_NODES", "3")), images=images)
    except SwarmError as e:
        pytest.fail(f"Swarm.up failed: {e}", pytrace=False)
    try:
        yield sw
    finally:
        sw.down()  # raises SwarmError (an error of the last test) if something could not be removed
        left = sw.leftovers()
        assert not left, f"the swarm left: {left}"


@pytest.fixture(scope="session")
def swarm_image(swarm: Swarm) -> str:
    """The sandbox image, loaded on every node (skips without it)."""
    if not _present(IMAGE):
        pytest.skip(f"sandbox image {IMAGE} not present (build it with scripts/make-test-image)")
    return IMAGE


@pytest.fixture(scope="session")
def swarm_agent_image(swarm: Swarm, swarm_image: str) -> Iterator[str]:
    """The sandbox image with this build's agent, on every node (what --engine swarm runs)."""
    name = derived_image(swarm_image)
    swarm.load_image(name)
    yield name
    subprocess.run(["docker", "rmi", name], capture_output=True, timeout=60)
