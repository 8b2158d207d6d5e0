// Builds the images of the profiles offline from Debian packages: mmdebstrap (started
// through Boost.Process) writes a root filesystem tarball from this machine's own apt
// sources, which streams straight into the Engine API's image import.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/awaitable.hpp>

#include "docker/client.hpp"
#include "image/profiles.hpp"
#include "sandbox/manager.hpp"

namespace cubicle::image {

namespace asio = boost::asio;

// What a build tells the person who started it.
class BuildOutput {
public:
    virtual ~BuildOutput() = default;
    // A line that stays.
    virtual void line(std::string_view text) = 0;
    // The state of the step under way (a line redrawn in place on a terminal).
    virtual void status(std::string_view text) = 0;
};

struct BuildResult {
    std::string image;
    std::string id;
    bool built = false;  // false: an image of the same recipe was present
    std::int64_t size = 0;
    double seconds = 0;
};

// Why this machine cannot build images (mmdebstrap missing, not root), or empty.
std::string build_problem();

// Builds `profile` unless an image of its recipe is present (or `force`), checks the
// new image by running each of its languages in a sandbox made by `manager`, then tags
// it and removes the image it replaces. Throws std::runtime_error saying what failed.
asio::awaitable<BuildResult> build(docker::Client& docker, sandbox::Manager& manager, Profile profile, bool force,
                                   std::shared_ptr<BuildOutput> output);

} // namespace cubicle::image
