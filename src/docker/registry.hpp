// Image names and registries (the reference grammar of distribution/reference, the part
// cubicle needs): which registry a name points at, and a name moved to another registry.
#pragma once

#include <string>
#include <string_view>

namespace cubicle::docker {

// The registry host of `image` ("127.0.0.1:5000" of "127.0.0.1:5000/cubicle/sandbox:latest"),
// or empty for a name of Docker Hub's ("cubicle/sandbox:latest"): its first component is a
// host when it holds a '.' or a ':' or is "localhost".
std::string registry_of(std::string_view image);

// `image` named in `registry` (HOST[:PORT][/PREFIX]): "REGISTRY/cubicle/sandbox:latest".
// A name in another registry keeps its path. Throws std::invalid_argument for a registry
// that is not one (a scheme, spaces, an empty part).
std::string in_registry(std::string_view registry, std::string_view image);

} // namespace cubicle::docker
