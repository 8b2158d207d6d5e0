# cubicle itself in a container, for hosts where it cannot run natively (Docker Desktop on
# macOS or Windows, MCP catalogs):
#   docker run -i --rm -v /var/run/docker.sock:/var/run/docker.sock cubicle/server
# It holds the cubicle binary that builds it and the libraries that binary needs (ldd build/cubicle).
image: cubicle/server:latest
description: the cubicle MCP server (stdio), talking to the Docker socket mounted at /var/run/docker.sock
languages: bash
packages:
    libfmt9 libsimdjson14 libboost-filesystem1.81.0 libgit2-1.5 libstdc++6 ca-certificates
binary: /usr/local/bin/cubicle
entrypoint: /usr/local/bin/cubicle
# The MCP registry checks that the image it lists carries its server name
# (doc/meson.build, server.json "name").
labels: io.modelcontextprotocol.server.name=io.github.cubicle-mcp/cubicle
user: root
