// Prints the container config (sandbox::container_config) of a sandbox whose
// workspace is a named volume on disk, for tests/integration/test_disk_quota.py:
// the container the test creates is the one the server would, to the byte.
//   cubicle-test-container-config IMAGE VOLUME MEMORY_MB DISK_MB FILES_LIMIT
// The owner label names the caller (the test), not this short-lived process:
// another server's orphan sweep must not reap the container under the test.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <unistd.h>

#include "sandbox/owner.hpp"
#include "sandbox/policy.hpp"

int main(int argc, char** argv) {
    using namespace cubicle::sandbox;
    if (argc != 6) {
        std::fprintf(stderr, "usage: %s IMAGE VOLUME MEMORY_MB DISK_MB FILES_LIMIT\n", argv[0]);
        return 2;
    }
    SandboxSpec spec;
    spec.image = argv[1];
    spec.workspace_volume = argv[2];
    spec.memory_mb = std::atoi(argv[3]);
    spec.disk_mb = std::atoi(argv[4]);
    spec.files_limit = std::atoi(argv[5]);
    spec.cpus = 1;
    spec.pids_limit = 128;
    spec.tmp_size_mb = 64;
    std::string config = container_config(spec, "test-disk-quota", "sb-disk-quota");
    std::string caller = owner_record_of(static_cast<int>(getppid()));
    if (auto at = config.find(owner_record()); !caller.empty() && at != std::string::npos) {
        config.replace(at, owner_record().size(), caller);
    }
    std::fwrite(config.data(), 1, config.size(), stdout);
    return 0;
}
