// What the agent's search builtin writes (agent/search.h) read back: NUL-ended
// fields, one "m" record per matching line and an "s" summary at the end. The
// output may stop anywhere (the run's output cap, a timeout): a record cut
// short is dropped, and a missing summary says the search did not finish.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cubicle::tools {

struct SearchMatch {
    std::string path;
    std::uint64_t line = 0;
    std::uint64_t column = 0;  // 1-based, in bytes
    std::string text;
    std::vector<std::string> before, after;
};

struct SearchRecords {
    std::vector<SearchMatch> matches;
    std::uint64_t count = 0;  // every matching line, written or not
    std::uint64_t files_searched = 0;
    bool cut = false;       // the agent left matches out (max_results or its byte budget)
    bool finished = false;  // the summary arrived
};

// Never throws: what cannot be read ends the parse.
SearchRecords parse_search_records(std::string_view output);

} // namespace cubicle::tools
