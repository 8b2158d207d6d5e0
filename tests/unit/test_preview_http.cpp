// How a port preview speaks HTTP (mcp/preview_http.hpp): the path, the
// program's response head made safe, the loopback listener's Host check.
#include <gtest/gtest.h>

#include "mcp/preview_http.hpp"

namespace cubicle::mcp {
namespace {

using Outcome = PreviewHead::Outcome;

TEST(PreviewHttp, PathRoundTrips) {
    auto path = preview_path("/mcp", "sb-1", 8000);
    EXPECT_EQ(path, "/mcp/preview/sb-1/8000/");
    auto target = parse_preview_target(std::string_view(path).substr(std::string_view("/mcp/preview/").size()));
    ASSERT_TRUE(target);
    EXPECT_EQ(target->sandbox_id, "sb-1");
    EXPECT_EQ(target->port, 8000);
    EXPECT_EQ(target->rest, "/");
    EXPECT_EQ(parse_preview_target("sb-1/8000?x=1")->rest, "/?x=1");
    EXPECT_FALSE(parse_preview_target("sb-1/0/"));
    EXPECT_FALSE(parse_preview_target("sb-1/65536/"));
    EXPECT_FALSE(parse_preview_target("/8000/"));
}

TEST(PreviewHttp, HeadIsMadeSafe) {
    std::string program = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nSet-Cookie: a=b\r\nService-Worker-Allowed: /\r\n"
                          "Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nProxy-Authenticate: x\r\n"
                          "Content-Type: text/html\r\n\r\nhelloHTTP/1.1 200 OK\r\n";
    auto head = parse_preview_head(program, false);
    ASSERT_EQ(head.outcome, Outcome::done);
    EXPECT_EQ(head.status, 200u);
    EXPECT_EQ(program.substr(head.consumed, 5), "hello");
    ASSERT_TRUE(head.body_bytes);
    EXPECT_EQ(*head.body_bytes, 5u);
    for (auto gone : {"Set-Cookie", "Service-Worker-Allowed", "X-Hop", "Keep-Alive", "Proxy-Authenticate", "keep-alive"}) {
        EXPECT_EQ(head.head.find(gone), std::string::npos) << gone;
    }
    EXPECT_NE(head.head.find("Content-Security-Policy: sandbox\r\n"), std::string::npos);
    EXPECT_NE(head.head.find("Connection: close\r\n"), std::string::npos);
    EXPECT_NE(head.head.find("Content-Type: text/html\r\n"), std::string::npos);
}

TEST(PreviewHttp, BodyLengthKnownOrUntilClose) {
    auto chunked = parse_preview_head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", false);
    ASSERT_EQ(chunked.outcome, Outcome::done);
    EXPECT_FALSE(chunked.body_bytes);
    auto to_head = parse_preview_head("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", true);
    EXPECT_EQ(to_head.body_bytes.value_or(1), 0u);
    auto not_modified = parse_preview_head("HTTP/1.1 304 Not Modified\r\n\r\n", false);
    EXPECT_EQ(not_modified.body_bytes.value_or(1), 0u);
    auto big = parse_preview_head("HTTP/1.1 200 OK\r\nContent-Length: 100000000000\r\n\r\n", false);
    EXPECT_EQ(big.body_bytes.value_or(0), 100000000000u);
}

TEST(PreviewHttp, IncompleteOrBrokenHeads) {
    EXPECT_EQ(parse_preview_head("HTTP/1.1 200 OK\r\nContent-Len", false).outcome, Outcome::need_more);
    EXPECT_EQ(parse_preview_head("", false).outcome, Outcome::need_more);
    EXPECT_EQ(parse_preview_head("SSH-2.0-OpenSSH\r\n\r\n", false).outcome, Outcome::malformed);
    std::string huge = "HTTP/1.1 200 OK\r\nX: " + std::string(preview_head_limit, 'a');
    EXPECT_EQ(parse_preview_head(huge, false).outcome, Outcome::malformed);
}

TEST(PreviewHttp, LoopbackHostOnly) {
    EXPECT_TRUE(preview_host_allowed("127.0.0.1:4000", 4000));
    EXPECT_TRUE(preview_host_allowed("LocalHost:4000", 4000));
    EXPECT_FALSE(preview_host_allowed("localhost:4001", 4000));
    EXPECT_FALSE(preview_host_allowed("evil.example:4000", 4000));
    EXPECT_FALSE(preview_host_allowed("127.0.0.1", 4000));
    EXPECT_FALSE(preview_host_allowed("", 4000));
}

} // namespace
} // namespace cubicle::mcp
