#include "sandbox/languages.hpp"

#include <array>

#include "sandbox/policy.hpp"

namespace cubicle::sandbox {
namespace {

struct Alias {
    std::string_view name;
    std::string_view language;
};

constexpr std::array aliases{
    Alias{"python", "python"}, Alias{"python3", "python"}, Alias{"py", "python"},
    Alias{"javascript", "javascript"}, Alias{"node", "javascript"}, Alias{"js", "javascript"},
    Alias{"bash", "bash"}, Alias{"sh", "bash"}, Alias{"shell", "bash"},
};

// Beyond this, code no longer fits one argv string (MAX_ARG_STRLEN is 128 KiB).
constexpr std::size_t max_argv_code = 100 * 1024;

} // namespace

std::optional<std::string_view> canonical_language(std::string_view name) {
    for (const auto& alias : aliases) {
        if (alias.name == name) return alias.language;
    }
    return std::nullopt;
}

std::string_view language_list() { return "python (python3, py), javascript (node, js), bash (sh, shell)"; }

agent::RunRequest program_for(std::string_view language, std::string code) {
    agent::RunRequest request;
    request.cwd = workspace_dir;
    if (language == "python") {
        // Python and Node read the whole program from stdin before running it.
        request.argv = {"python3", "-u", "-"};
        request.stdin_data = std::move(code);
    } else if (language == "javascript") {
        request.argv = {"node", "-"};
        request.stdin_data = std::move(code);
    } else if (code.size() <= max_argv_code) {
        // Bash reads stdin as it goes, so a script reading stdin would eat itself: pass it as an argument.
        request.argv = {"bash", "-c", std::move(code)};
    } else {
        request.argv = {"bash", "-c", "f=$(mktemp) && cat > \"$f\" && exec bash \"$f\" </dev/null"};
        request.stdin_data = std::move(code);
    }
    return request;
}

agent::RunRequest shell_command(std::string command) {
    agent::RunRequest request;
    request.cwd = workspace_dir;
    request.argv = {"/bin/sh", "-c", std::move(command)};
    return request;
}

} // namespace cubicle::sandbox
