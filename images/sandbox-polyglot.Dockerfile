# Generated from images/sandbox-polyglot.profile by `cubicle image dockerfile sandbox-polyglot`: edit the profile, then regenerate.
# cubicle/sandbox-polyglot:latest: Python 3, Node.js with TypeScript, bash, R, Ruby, Go, C and C++ (GCC), Java (OpenJDK), Rust (rustc, cargo), and git for working on a project.
# The same image `cubicle image build sandbox-polyglot` makes offline, for a registry:
#   docker build -f images/sandbox-polyglot.Dockerfile -t cubicle/sandbox-polyglot:latest images/
# BASE may be any Debian bookworm image whose apt sources work on the building machine.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN printf '%s\n' 'path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright' \
        'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/info/*' \
        'path-exclude=/usr/share/groff/*' 'path-exclude=/usr/share/lintian/*' \
        'path-exclude=/usr/share/locale/*' 'path-include=/usr/share/locale/locale.alias' > \
        /etc/dpkg/dpkg.cfg.d/cubicle-excludes \
    && mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bash coreutils procps \
        ca-certificates python3 python3-pip nodejs node-typescript r-base-core ruby gcc g++ \
        libc6-dev golang-go default-jdk-headless rustc cargo git \
    && groupadd --gid 1000 sandbox \
    && useradd --uid 1000 --gid 1000 --home-dir /workspace --no-create-home --shell /bin/bash sandbox \
    && mkdir -p /workspace && chown 1000:1000 /workspace && chmod 0755 /workspace \
    && find / -xdev -type f -perm /6000 -exec chmod ug-s {} + \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/lib/dpkg/*-old \
        /var/log/apt/* /var/log/*.log /root/.cache /tmp/*
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENV LANG=C.UTF-8
WORKDIR /workspace
USER 1000:1000
CMD ["/bin/bash"]
LABEL io.cubicle.profile=sandbox-polyglot
