#include "mcp/preview_http.hpp"

#include <algorithm>
#include <charconv>
#include <sstream>
#include <vector>

#include <boost/beast/http.hpp>
#include <fmt/format.h>

namespace cubicle::mcp {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
}

} // namespace

std::string preview_path(std::string_view http_path, std::string_view sandbox_id, unsigned port) {
    return fmt::format("{}/preview/{}/{}/", http_path, sandbox_id, port);
}

std::optional<PreviewTarget> parse_preview_target(std::string_view rest) {
    auto slash = rest.find('/');
    PreviewTarget target;
    target.sandbox_id = std::string(rest.substr(0, slash));
    auto after_id = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
    auto port_end = after_id.find_first_of("/?");
    auto port_text = after_id.substr(0, port_end);
    unsigned port = 0;
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (target.sandbox_id.empty() || ec != std::errc() || end != port_text.data() + port_text.size() || port == 0 || port > 65535) {
        return std::nullopt;
    }
    target.port = static_cast<unsigned short>(port);
    auto tail = port_end == std::string_view::npos ? std::string_view() : after_id.substr(port_end);
    // Always from a "/". Formatted, not inserted or appended: GCC 12 at -O2 (the package build)
    // warns falsely that such a copy exceeds the maximum object size.
    target.rest = tail.starts_with('/') ? std::string(tail) : fmt::format("/{}", tail);
    return target;
}

std::string preview_unreachable(std::string_view why) {
    return fmt::format("cubicle: the sandbox's port cannot be reached: {}\n", why);
}

PreviewHead parse_preview_head(std::string_view bytes, bool head_request) {
    PreviewHead result;
    http::response_parser<http::empty_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(preview_head_limit));
    parser.skip(head_request);
    parser.body_limit(boost::none);  // only the head is read here
    beast::error_code ec;
    result.consumed = parser.put(boost::asio::buffer(bytes.data(), bytes.size()), ec);
    if (ec == http::error::need_more && bytes.size() < preview_head_limit) return result;
    if (!parser.is_header_done() || (ec && ec != http::error::need_more)) {
        result.outcome = PreviewHead::Outcome::malformed;
        return result;
    }
    auto& head = parser.get();
    result.status = head.result_int();
    if (parser.is_done() || result.status < 200 || result.status == 204 || result.status == 304) {
        result.body_bytes = 0;
    } else if (auto length = parser.content_length()) {
        result.body_bytes = *length;
    }
    // Hop-by-hop fields, and those the Connection field names, are the program's
    // connection's alone.
    std::vector<std::string> drop = {"connection", "keep-alive", "te", "trailer", "upgrade",
                                     "set-cookie", "set-cookie2", "service-worker-allowed"};
    for (auto token : http::token_list(head[http::field::connection])) drop.emplace_back(token);
    http::response<http::empty_body> out{head.result(), head.version()};
    out.reason(head.reason());
    for (const auto& field : head) {
        auto name = field.name_string();
        bool hop = name.size() >= 6 && iequals(name.substr(0, 6), "proxy-");
        for (const auto& d : drop) hop = hop || iequals(name, d);
        if (!hop) out.insert(name, field.value());
    }
    out.insert("Content-Security-Policy", "sandbox");
    if (result.status >= 200) out.set(http::field::connection, "close");
    std::ostringstream text;
    text << out.base();
    result.head = std::move(text).str();
    result.outcome = PreviewHead::Outcome::done;
    return result;
}

bool preview_host_allowed(std::string_view host, unsigned short port) {
    auto suffix = fmt::format(":{}", port);
    return iequals(host, "127.0.0.1" + suffix) || iequals(host, "localhost" + suffix);
}

} // namespace cubicle::mcp
