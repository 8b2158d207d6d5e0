"""The image a cubicle server runs on Swarm, made the way an operator without a registry would.

swarm_placement.cpp runs each sandbox in an image derived from the sandbox's (the agent at its
path, labelled with the agent's digest: policy.cpp's agent_image_context) under the name
`derived_name(base)`. The server builds it on the manager alone; the other nodes must get it as
any image, so the tests build it here on the host and load it onto every node
(swarm/session.py's `swarm_agent_image` fixture does, once per session).
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile

from conftest import CUBICLE_BIN

AGENT = CUBICLE_BIN.parent / "src" / "agent" / "cubicle-agent"


def agent_digest() -> str:
    """The sha256 of the agent next to the server binary (what io.cubicle.agent-digest says)."""
    return hashlib.sha256(AGENT.read_bytes()).hexdigest()


def derived_name(base: str) -> str:
    """swarm_placement.cpp's derived_name: REPOSITORY:TAG-agent-DIGEST12."""
    repository, _, tag = base.rpartition(":")
    return f"{repository}:{tag}-agent-{agent_digest()[:12]}"


def derived_image(base: str) -> str:
    """Builds the derived image of `base` in the host's daemon (where `base` must be) and returns its name."""
    agent = AGENT.read_bytes()
    digest = hashlib.sha256(agent).hexdigest()
    name = derived_name(base)
    dockerfile = (f"FROM {base}\nUSER 0\nCOPY agent /opt/cubicle/agent\n"
                  "RUN find / -xdev -type f -perm /6000 -exec chmod ug-s {} + ; "
                  'test -z "$(find / -xdev -type f -perm /6000)"\n'
                  f"LABEL io.cubicle.agent-digest={digest} io.cubicle.agent-base={base}\nUSER 1000:1000\n")
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for entry, data, mode in (("Dockerfile", dockerfile.encode(), 0o644), ("agent", agent, 0o755)):
            info = tarfile.TarInfo(entry)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    subprocess.run(["docker", "build", "-q", "-t", name, "-"], input=context.getvalue(), check=True,
                   capture_output=True, timeout=300)
    return name
