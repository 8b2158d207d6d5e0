// What the subcommands share: their command line (words, switches and the server's
// own options) and running one coroutine to its exit status.
#pragma once

#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "config.hpp"

namespace cubicle::cli {

struct CommandLine {
    std::vector<std::string> words;   // arguments that are not options
    std::set<std::string> switches;   // those of `switches` given
    std::map<std::string, std::string> values;  // those of `valued` given, with their values
    Config config;                    // every other option, as the server reads them
    bool help = false;
};

// `switches` are the command's own flags, `valued` its own options taking a value
// (--name VALUE or --name=VALUE). Throws std::invalid_argument naming a bad option.
CommandLine parse_command_line(int argc, char** argv, std::initializer_list<std::string_view> switches,
                               std::initializer_list<std::string_view> valued = {});

// Runs `main` on a single-threaded io_context; an exception escaping it is printed and
// gives exit status 1.
int run(boost::asio::awaitable<int> (*main)(CommandLine), CommandLine command_line);

} // namespace cubicle::cli
