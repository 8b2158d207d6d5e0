// The sandboxes' files as MCP resources: sandbox://<sandbox_id>/<path>, read
// with the sandbox user's rights like read_file; the list shows the saved
// output of recent runs, after cubicle://languages (language_tools.cpp). A
// sandbox that is not the caller's looks like one that does not exist.
#include <charconv>

#include <fmt/format.h>
#include <simdjson.h>

#include "common/base64.hpp"
#include "common/errors.hpp"
#include "files/host_transfer.hpp"
#include "tools/runs.hpp"
#include "tools/support.hpp"

namespace cubicle::tools {
namespace {

namespace asio = boost::asio;

constexpr std::string_view scheme = "sandbox://";
// A resource travels whole in one message; larger files are read in parts with read_file.
constexpr std::uint64_t max_resource_bytes = 1 << 20;
constexpr std::size_t page_size = 100;

std::shared_ptr<sandbox::Sandbox> owned_sandbox(const Env& env, const std::string& principal, const std::string& id, std::string_view uri) {
    try {
        return env.manager.get(id, principal);
    } catch (const ToolError&) {
    }
    throw mcp::ResourceNotFound(fmt::format("Resource not found: {}", uri));
}

asio::awaitable<mcp::ResourceContent> read(Env env, std::string principal, std::string uri) {
    if (uri == languages_uri) co_return co_await read_languages_resource(env, std::move(principal));
    if (!uri.starts_with(scheme)) {
        throw mcp::ResourceNotFound(fmt::format("Resource not found: {} (sandbox:// URIs and {} only)", uri, languages_uri));
    }
    std::string_view rest = std::string_view(uri).substr(scheme.size());
    auto slash = rest.find('/');
    if (slash == std::string_view::npos) throw mcp::ResourceNotFound(fmt::format("Resource not found: {}", uri));
    std::string sandbox_id(rest.substr(0, slash));
    auto use = co_await env.manager.lifetimes().use(sandbox_id, principal);  // resumes a paused one
    auto box = owned_sandbox(env, principal, sandbox_id, uri);
    std::string path;
    try {
        path = files::workspace_path(rest.substr(slash + 1));
    } catch (const ToolError&) {
        throw mcp::ResourceNotFound(fmt::format("Resource not found: {}", uri));
    }
    FileHead head;
    try {
        head = co_await read_workspace_file(box, path, max_resource_bytes);
    } catch (const ToolError&) {
        throw mcp::ResourceNotFound(fmt::format("Resource not found: {}", uri));
    }
    if (head.size > max_resource_bytes) {
        throw std::invalid_argument(fmt::format("{} is {} bytes; resources up to {} bytes are sent whole, larger files are "
                                                "read in parts with the read_file tool (offset, tail)",
                                                uri, head.size, max_resource_bytes));
    }
    mcp::ResourceContent content{.uri = uri};
    auto image = image_mime_of(path, head.data);
    bool text = image.empty() && head.data.find('\0') == std::string::npos &&
                simdjson::validate_utf8(head.data.data(), head.data.size());
    if (text) {
        content.mime_type = "text/plain";
        content.text = std::move(head.data);
    } else {
        content.mime_type = image.empty() ? "application/octet-stream" : image;
        content.binary = true;
        content.blob_base64 = base64::encode(head.data);
    }
    co_return content;
}

// The languages, then the saved output of recent runs, sandbox by sandbox; the cursor is an offset.
asio::awaitable<mcp::ResourcePage> list(Env env, std::string principal, std::string cursor) {
    std::size_t offset = 0;
    if (!cursor.empty()) {
        auto [end, ec] = std::from_chars(cursor.data(), cursor.data() + cursor.size(), offset);
        if (ec != std::errc() || end != cursor.data() + cursor.size()) throw std::invalid_argument("unknown cursor");
    }
    std::vector<mcp::Resource> all{languages_resource()};
    for (const auto& box : env.manager.list(principal)) {
        for (const auto& run_id : env.runs->saved(box->id())) {
            for (std::string_view stream : {"stdout", "stderr"}) {
                auto path = fmt::format("{}/{}", run_dir(run_id), stream);
                all.push_back({sandbox_uri(box->id(), path), path, "text/plain", 0});
            }
        }
    }
    if (offset > all.size()) throw std::invalid_argument("unknown cursor");
    mcp::ResourcePage page;
    auto end = std::min(all.size(), offset + page_size);
    page.resources.assign(all.begin() + static_cast<std::ptrdiff_t>(offset), all.begin() + static_cast<std::ptrdiff_t>(end));
    if (end < all.size()) page.next_cursor = std::to_string(end);
    co_return page;
}

} // namespace

std::string sandbox_uri(std::string_view sandbox_id, std::string_view path) { return fmt::format("{}{}/{}", scheme, sandbox_id, path); }

mcp::ResourceProvider sandbox_resources(Env env) {
    mcp::ResourceProvider provider;
    provider.templates.push_back({
        .uri_template = "sandbox://{sandbox_id}/{+path}",
        .name = "sandbox-file",
        .title = "A file in a sandbox's workspace",
        .description = "Any file in the workspace of a sandbox of yours, by its path relative to the workspace; text as "
                       "text, anything else as a base64 blob. Up to 1 MiB; read larger files with read_file.",
    });
    // Not coroutines themselves: they only forward to one, so nothing they capture dangles.
    provider.list = [env](std::string principal, std::string cursor) { return list(env, std::move(principal), std::move(cursor)); };
    provider.read = [env](std::string principal, std::string uri) { return read(env, std::move(principal), std::move(uri)); };
    return provider;
}

} // namespace cubicle::tools
