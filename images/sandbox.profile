# The default sandbox image: what a model expects to find when it runs code.
image: cubicle/sandbox:latest
description: Python 3 (pip, venv, numpy, pandas, matplotlib, scipy, pillow, sympy, requests), Node.js with npm, bash, git, curl
languages: python javascript bash
packages:
    bash coreutils procps ca-certificates curl git fonts-dejavu-core
    python3 python3-pip python3-venv python3-requests
    python3-numpy python3-pandas python3-matplotlib python3-scipy python3-pil python3-sympy
    nodejs npm
# No display in a sandbox: plots go to files. Matplotlib's cache (its font list, built on the
# first import in each sandbox, about a second) goes to /tmp, not into the user's workspace.
env: MPLBACKEND=Agg MPLCONFIGDIR=/tmp/matplotlib
# Build tools that python3-scipy (through python3-pythran) and npm (through node-gyp) depend
# on in Debian but never use at run time: about 450 MB of compilers and headers. The
# image has no apt and a read-only root, so nothing notices their dependencies are unmet.
remove:
    gcc-12 g++-12 cpp-12 gcc g++ cpp libgcc-12-dev libstdc++-12-dev libc6-dev linux-libc-dev
    libcrypt-dev libnsl-dev libtirpc-dev rpcsvc-proto binutils binutils-common binutils-x86-64-linux-gnu
    libbinutils libctf0 libctf-nobfd0 libgprofng0 libasan8 libtsan2 liblsan0 libubsan1 libitm1 libcc1-0
    libisl23 libmpc3 libboost1.74-dev libboost-dev libopenblas-pthread-dev libopenblas-dev libxsimd-dev
    python3-pythran python3-beniget python3-gast libpython3.11-dev python3.11-dev python3-dev
    libpython3-dev python3-all-dev libssl-dev libuv1-dev libnode-dev libexpat1-dev zlib1g-dev unicode-data
