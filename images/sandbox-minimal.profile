# A small image that starts fast: the three languages and nothing else.
image: cubicle/sandbox-minimal:latest
description: Python 3, Node.js and bash only
languages: python javascript bash
packages:
    bash python3 nodejs
