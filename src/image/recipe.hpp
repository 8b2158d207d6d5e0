// What an image of a profile is, beyond its packages: the steps that lock it down and
// its configuration. Written once for both ways of building it: the builder
// (mmdebstrap hooks on a new root, then an Engine API import) and the Dockerfiles
// under images/ for people with a registry (`cubicle image dockerfile`).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "image/profiles.hpp"

namespace cubicle::image {

// dpkg options that keep documentation, manuals and translations out (copyright files stay).
std::span<const std::string_view> dpkg_excludes();

// Shell commands run after the packages are installed. `root` is the image's root
// as the shell names it ("\"$1\"" in an mmdebstrap hook, "" inside the image);
// `in_root` prefixes a command that must run inside the image ("chroot \"$1\" " or "").
// The profile's binary is put in place by each way of building itself, before these run.
std::vector<std::string> finishing_commands(const Profile& profile, std::string_view root, std::string_view in_root);

// The image's configuration as Dockerfile instructions (ENV, WORKDIR, USER, CMD or
// ENTRYPOINT), which the Engine API's import takes as its `changes` too. Labels are
// each way's own: the builder records its recipe digest.
std::vector<std::string> image_config(const Profile& profile);

// The Dockerfile of a profile: FROM a Debian image whose apt sources work (ARG BASE,
// by default the public debian:bookworm-slim), then the packages, the same finishing
// steps and the same configuration as the builder's. A profile with a binary copies
// it from the build context (a file named like the binary).
std::string dockerfile(const Profile& profile);

} // namespace cubicle::image
