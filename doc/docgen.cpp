// cubicle-docgen: writes the parts of the documentation that come from the
// option table (src/config.cpp), so that --help, the man page, the shell
// completions and server.json can never disagree. A build tool, not installed.
//
//   cubicle-docgen man TEMPLATE   the template with %%OPTIONS%% and %%ENVIRONMENT%% lines filled in (scdoc)
//   cubicle-docgen bash           bash completion
//   cubicle-docgen zsh            zsh completion
//   cubicle-docgen server-json    server.json for the MCP registry
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "common/json.hpp"
#include "cli/commands.hpp"
#include "config.hpp"

using namespace cubicle;

namespace {


bool takes_directory(const OptionDoc& option) { return option.value_name == "DIR"; }
bool repeatable(const OptionDoc& option) { return option.help.find("repeatable") != std::string_view::npos; }

// scdoc treats *, _ and \ as markup.
std::string scdoc_escape(std::string_view text) {
    std::string out;
    for (char c : text) {
        if (c == '*' || c == '_' || c == '\\') out += '\\';
        out += c;
    }
    return out;
}

std::string man_options() {
    std::string out;
    for (const auto& option : option_docs()) {
        out += fmt::format("*{}*", option.flag);
        if (!option.value_name.empty()) out += fmt::format(" _{}_", scdoc_escape(option.value_name));
        out += fmt::format("\n\t{}. Variable: *{}*.\n\n", scdoc_escape(option.help), scdoc_escape(option.env));
    }
    return out;
}

std::string man_environment() {
    std::string out;
    for (const auto& option : option_docs()) {
        out += fmt::format("*{}*\n\tAs *{}*", scdoc_escape(option.env), option.flag);
        out += option.value_name.empty() ? " (1, true, yes or on; 0, false, no or off).\n\n" : ".\n\n";
    }
    return out;
}

int man(const char* template_path) {
    std::ifstream in(template_path);
    if (!in) {
        std::fprintf(stderr, "cubicle-docgen: cannot read %s\n", template_path);
        return 1;
    }
    std::string line;
    while (std::getline(in, line)) {
        if (line == "%%OPTIONS%%") {
            std::cout << man_options();
        } else if (line == "%%ENVIRONMENT%%") {
            std::cout << man_environment();
        } else {
            std::cout << line << '\n';
        }
    }
    return 0;
}

int bash() {
    std::string flags = "-h --help -V --version";
    std::string valued, directories;
    for (const auto& option : option_docs()) {
        flags += fmt::format(" {}", option.flag);
        if (option.value_name.empty()) continue;
        auto& list = takes_directory(option) ? directories : valued;
        list += fmt::format("{}{}", list.empty() ? "" : "|", option.flag);
    }
    std::string commands;
    for (const auto& command : cli::subcommands) {
        // Each first word once: `image` has several.
        if (fmt::format(" {} ", commands).find(fmt::format(" {} ", command.name)) == std::string::npos) {
            commands += fmt::format("{}{}", commands.empty() ? "" : " ", command.name);
        }
    }
    std::cout << fmt::format(
        R"(# bash completion for cubicle (generated from its option table)
_cubicle()
{{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    COMPREPLY=()
    case $prev in
        {0})
            mapfile -t COMPREPLY < <(compgen -d -- "$cur")
            return ;;
        {1})
            return ;;
    esac
    if [[ ${{COMP_WORDS[1]:-}} == image && $COMP_CWORD -eq 2 ]]; then
        mapfile -t COMPREPLY < <(compgen -W 'build list' -- "$cur")
    elif [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W '{2}' -- "$cur")
    elif ((COMP_CWORD == 1)); then
        mapfile -t COMPREPLY < <(compgen -W '{3}' -- "$cur")
    fi
}}
complete -F _cubicle cubicle
)",
        directories.empty() ? "--no-such-flag" : directories, valued.empty() ? "--no-such-flag" : valued, flags, commands);
    return 0;
}

// Inside _arguments specs, brackets, colons and single quotes need escaping.
std::string zsh_escape(std::string_view text) {
    std::string out;
    for (char c : text) {
        if (c == '\'') {
            out += "'\\''";
            continue;
        }
        if (c == '[' || c == ']' || c == ':') out += '\\';
        out += c;
    }
    return out;
}

int zsh() {
    std::cout << "#compdef cubicle\n# zsh completion for cubicle (generated from its option table)\n\n"
                 "local -a options=(\n"
                 "  '(- *)'{-h,--help}'[show this help]'\n"
                 "  '(- *)'{-V,--version}'[show the version]'\n";
    for (const auto& option : option_docs()) {
        std::string spec = repeatable(option) ? "*" : "";
        spec += option.flag;
        if (!option.value_name.empty()) spec += "=";
        spec += fmt::format("[{}]", zsh_escape(option.help));
        if (!option.value_name.empty()) {
            spec += fmt::format(":{}:{}", zsh_escape(option.value_name), takes_directory(option) ? "_directories" : " ");
        }
        std::cout << fmt::format("  '{}'\n", spec);
    }
    std::cout << ")\n\n"
                 "if (( CURRENT == 3 )) && [[ $words[2] == image ]]; then\n"
                 "  _values 'image command' 'build[build sandbox images]' 'list[list the image profiles]'\n"
                 "  return\n"
                 "fi\n"
                 "_arguments -s $options \\\n"
                 "  '1::command:((image\\:\"build or list the sandbox images\" doctor\\:\"check that this host can run sandboxes\"))' \\\n"
                 "  '*::argument:_default'\n";
    return 0;
}

// Indents compact JSON (as json::Writer makes it) two spaces per level, so the
// committed server.json reads well and diffs line by line.
std::string pretty(std::string_view compact) {
    std::string out;
    int depth = 0;
    bool in_string = false, escaped = false;
    auto newline = [&] { out += '\n' + std::string(2 * depth, ' '); };
    for (std::size_t i = 0; i < compact.size(); ++i) {
        char c = compact[i];
        if (in_string) {
            out += c;
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
            continue;
        }
        switch (c) {
        case '"':
            in_string = true;
            out += c;
            break;
        case '{':
        case '[':
            out += c;
            if (i + 1 < compact.size() && (compact[i + 1] == '}' || compact[i + 1] == ']')) {
                out += compact[++i];
            } else {
                ++depth;
                newline();
            }
            break;
        case '}':
        case ']':
            --depth;
            newline();
            out += c;
            break;
        case ',':
            out += c;
            newline();
            break;
        case ':':
            out += ": ";
            break;
        default:
            out += c;
        }
    }
    return out;
}

std::string_view input_format(const OptionDoc& option) {
    if (option.value_name.empty()) return "boolean";
    if (option.value_name == "N" || option.value_name == "X") return "number";
    if (option.value_name == "FILE") return "filepath";
    return "string";
}

int server_json() {
    json::Writer w;
    w.begin_object()
        .field("$schema", "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json")
        .field("name", CUBICLE_MCP_NAME)
        .field("title", "cubicle")
        .field("description", "Runs code in disposable, locked-down Docker sandboxes: no network, no root, hard limits")
        .field("version", CUBICLE_VERSION);
    w.key("packages").begin_array().begin_object()
        .field("registryType", "oci")
        .field("identifier", fmt::format("{}:{}", CUBICLE_OCI_IMAGE, CUBICLE_VERSION))
        .field("runtimeHint", "docker");
    w.key("transport").begin_object().field("type", "stdio").end_object();
    // The server in a container drives the host's Docker Engine through its socket.
    w.key("runtimeArguments").begin_array().begin_object()
        .field("type", "named")
        .field("name", "-v")
        .field("description", "the Docker Engine socket cubicle starts sandboxes through")
        .field("value", "{docker_socket}:/var/run/docker.sock")
        .field("isRequired", true);
    w.key("variables").begin_object().key("docker_socket").begin_object()
        .field("description", "path of the Docker Engine socket on the host")
        .field("format", "filepath")
        .field("default", "/var/run/docker.sock")
        .field("isRequired", true)
        .end_object().end_object();
    w.end_object().end_array();
    w.key("environmentVariables").begin_array();
    for (const auto& option : option_docs()) {
        w.begin_object()
            .field("name", option.env)
            .field("description", fmt::format("{} ({})", option.help, option.flag))
            .field("format", input_format(option))
            .field("isRequired", false)
            .field("isSecret", false)
            .end_object();
    }
    w.end_array().end_object().end_array().end_object();
    std::cout << pretty(w.str()) << '\n';
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    std::string_view mode = argc > 1 ? argv[1] : "";
    if (mode == "man" && argc == 3) return man(argv[2]);
    if (mode == "bash" && argc == 2) return bash();
    if (mode == "zsh" && argc == 2) return zsh();
    if (mode == "server-json" && argc == 2) return server_json();
    std::fputs("usage: cubicle-docgen man TEMPLATE | bash | zsh | server-json\n", stderr);
    return 2;
}
