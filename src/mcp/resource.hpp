// Resources as the protocol sees them: a provider (the sandboxes' files, the languages) lists
// and reads them; the session only speaks resources/list, /templates/list, /read.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

namespace cubicle::mcp {

struct Resource {
    std::string uri;
    std::string name;
    std::string mime_type;
    std::uint64_t size = 0;   // 0: not known
    std::string title;        // optional
    std::string description;  // optional
};

struct ResourceTemplate {
    std::string uri_template;
    std::string name;
    std::string title;
    std::string description;
};

struct ResourceContent {
    std::string uri;
    std::string mime_type;
    std::string text;         // when !binary
    std::string blob_base64;  // when binary
    bool binary = false;
};

struct ResourcePage {
    std::vector<Resource> resources;
    std::string next_cursor;  // empty on the last page
};

// A resource that does not exist, or is not the caller's: the two look alike.
class ResourceNotFound : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Providers throw std::invalid_argument for a bad cursor or a resource too
// large to send (-32602), ResourceNotFound for -32002. Both see only what the
// principal (the caller) owns.
struct ResourceProvider {
    std::vector<ResourceTemplate> templates;
    std::function<boost::asio::awaitable<ResourcePage>(std::string principal, std::string cursor)> list;
    std::function<boost::asio::awaitable<ResourceContent>(std::string principal, std::string uri)> read;
};

} // namespace cubicle::mcp
