# Every language execute_code knows, from Debian packages: the sandbox for "check this Go
# snippet" or "run this R analysis". Big (about 1.5 GB); the default image stays small.
image: cubicle/sandbox-polyglot:latest
description: Python 3, Node.js with TypeScript, bash, R, Ruby, Go, C and C++ (GCC), Java (OpenJDK), Rust (rustc, cargo), and git for working on a project
languages: python javascript bash typescript r ruby go c cpp java rust
packages:
    bash coreutils procps ca-certificates
    python3 python3-pip nodejs node-typescript
    r-base-core ruby
    gcc g++ libc6-dev golang-go default-jdk-headless rustc cargo
    git
