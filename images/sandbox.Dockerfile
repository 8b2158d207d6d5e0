# Generated from images/sandbox.profile by `cubicle image dockerfile sandbox`: edit the profile, then regenerate.
# cubicle/sandbox:latest: Python 3 (pip, venv, numpy, pandas, matplotlib, scipy, pillow, sympy, requests), Node.js with npm, bash, git, curl.
# The same image `cubicle image build sandbox` makes offline, for a registry:
#   docker build -f images/sandbox.Dockerfile -t cubicle/sandbox:latest images/
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
        ca-certificates curl git fonts-dejavu-core python3 python3-pip python3-venv \
        python3-requests python3-numpy python3-pandas python3-matplotlib python3-scipy \
        python3-pil python3-sympy nodejs npm \
    && dpkg --purge --force-depends gcc-12 g++-12 cpp-12 gcc g++ cpp libgcc-12-dev libstdc++-12-dev \
        libc6-dev linux-libc-dev libcrypt-dev libnsl-dev libtirpc-dev rpcsvc-proto binutils \
        binutils-common binutils-x86-64-linux-gnu libbinutils libctf0 libctf-nobfd0 libgprofng0 \
        libasan8 libtsan2 liblsan0 libubsan1 libitm1 libcc1-0 libisl23 libmpc3 libboost1.74-dev \
        libboost-dev libopenblas-pthread-dev libopenblas-dev libxsimd-dev python3-pythran \
        python3-beniget python3-gast libpython3.11-dev python3.11-dev python3-dev libpython3-dev \
        python3-all-dev libssl-dev libuv1-dev libnode-dev libexpat1-dev zlib1g-dev unicode-data \
        >/dev/null \
    && groupadd --gid 1000 sandbox \
    && useradd --uid 1000 --gid 1000 --home-dir /workspace --no-create-home --shell /bin/bash sandbox \
    && mkdir -p /workspace && chown 1000:1000 /workspace && chmod 0755 /workspace \
    && find / -xdev -type f -perm /6000 -exec chmod ug-s {} + \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/lib/dpkg/*-old \
        /var/log/apt/* /var/log/*.log /root/.cache /tmp/*
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
ENV LANG=C.UTF-8
ENV MPLBACKEND=Agg
ENV MPLCONFIGDIR=/tmp/matplotlib
WORKDIR /workspace
USER 1000:1000
CMD ["/bin/bash"]
LABEL io.cubicle.profile=sandbox
