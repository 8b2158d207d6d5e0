# Generated from images/server.profile by `cubicle image dockerfile server`: edit the profile, then regenerate.
# cubicle/server:latest: the cubicle MCP server (stdio), talking to the Docker socket mounted at /var/run/docker.sock.
# The same image `cubicle image build server` makes offline, for a registry:
#   docker build -f images/server.Dockerfile -t cubicle/server:latest images/
# BASE may be any Debian bookworm image whose apt sources work on the building machine.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
# The cubicle binary, built for this Debian release, next to this file: cp build/cubicle images/
COPY cubicle /usr/local/bin/cubicle
RUN printf '%s\n' 'path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright' \
        'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/info/*' \
        'path-exclude=/usr/share/groff/*' 'path-exclude=/usr/share/lintian/*' \
        'path-exclude=/usr/share/locale/*' 'path-include=/usr/share/locale/locale.alias' > \
        /etc/dpkg/dpkg.cfg.d/cubicle-excludes \
    && mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libfmt9 libsimdjson14 \
        libboost-filesystem1.81.0 libgit2-1.5 libstdc++6 ca-certificates \
    && groupadd --gid 1000 sandbox \
    && useradd --uid 1000 --gid 1000 --home-dir /workspace --no-create-home --shell /bin/bash sandbox \
    && mkdir -p /workspace && chown 1000:1000 /workspace && chmod 0755 /workspace \
    && find / -xdev -type f -perm /6000 -exec chmod ug-s {} + \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/lib/dpkg/*-old \
        /var/log/apt/* /var/log/*.log /root/.cache /tmp/*
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENV LANG=C.UTF-8
LABEL io.modelcontextprotocol.server.name=io.github.cubicle-mcp/cubicle
WORKDIR /workspace
USER root
ENTRYPOINT ["/usr/local/bin/cubicle"]
LABEL io.cubicle.profile=server
