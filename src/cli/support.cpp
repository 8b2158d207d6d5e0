#include "cli/support.hpp"

#include <cstdio>
#include <exception>
#include <stdexcept>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <fmt/format.h>

namespace cubicle::cli {

namespace asio = boost::asio;

CommandLine parse_command_line(int argc, char** argv, std::initializer_list<std::string_view> switches,
                               std::initializer_list<std::string_view> valued) {
    CommandLine out;
    std::vector<char*> options{argv[0]};
    for (int i = 1; i < argc; ++i) {
        std::string_view arg = argv[i];
        bool is_switch = false;
        for (auto name : switches) is_switch = is_switch || arg == name;
        std::string_view own;  // one of `valued`
        for (auto name : valued) {
            if (arg == name || (arg.starts_with(name) && arg.size() > name.size() && arg[name.size()] == '=')) own = name;
        }
        if (!own.empty()) {
            std::string value;
            if (arg.size() > own.size()) {
                value = arg.substr(own.size() + 1);
            } else if (i + 1 < argc) {
                value = argv[++i];
            }
            if (value.empty()) throw std::invalid_argument(fmt::format("{} needs a value", own));
            out.values[std::string(own)] = value;
        } else if (is_switch) {
            out.switches.insert(std::string(arg));
        } else if (arg == "-h" || arg == "--help") {
            out.help = true;
        } else if (!arg.starts_with("-")) {
            out.words.emplace_back(arg);
        } else {
            options.push_back(argv[i]);
            // An option's value is the next argument unless given as --option=value.
            if (option_takes_value(arg) && i + 1 < argc) options.push_back(argv[++i]);
        }
    }
    out.config = parse_args(static_cast<int>(options.size()), options.data()).config;
    return out;
}

int run(asio::awaitable<int> (*main)(CommandLine), CommandLine command_line) {
    asio::io_context io(1);
    int status = 1;
    asio::co_spawn(io, main(std::move(command_line)), [&status](std::exception_ptr failure, int result) {
        if (!failure) {
            status = result;
            return;
        }
        try {
            std::rethrow_exception(failure);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "cubicle: %s\n", e.what());
        }
    });
    io.run();
    return status;
}

} // namespace cubicle::cli
