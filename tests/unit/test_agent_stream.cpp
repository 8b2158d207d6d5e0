// The server's side of a relayed stream (sandbox/agent_stream.hpp): credit both
// ways, half-close and abort, against a scripted agent.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include "sandbox/agent_stream.hpp"

namespace cubicle::sandbox {
namespace {

namespace asio = boost::asio;
using agent::FrameType;

struct Sent {
    std::vector<agent::Frame> frames;
    std::uint64_t data_bytes() const {
        std::uint64_t n = 0;
        for (const auto& f : frames) n += f.type == FrameType::data ? f.payload.size() : 0;
        return n;
    }
};

class AgentStreamTest : public ::testing::Test {
protected:
    std::shared_ptr<AgentStream> make() {
        auto sent = sent_;
        return std::make_shared<AgentStream>(io_.get_executor(), 7, [sent](std::string frame) {
            agent::Decoder decoder;
            decoder.feed(frame);
            while (auto f = decoder.next()) sent->frames.push_back(std::move(*f));
        });
    }
    asio::io_context io_;
    std::shared_ptr<Sent> sent_ = std::make_shared<Sent>();
};

asio::awaitable<void> write_all(std::shared_ptr<AgentStream> stream, std::string data, bool* done) {
    *done = co_await stream->write(data);
}

asio::awaitable<void> read_all(std::shared_ptr<AgentStream> stream, std::string* out) {
    std::string buffer(10000, '\0');
    while (std::size_t n = co_await stream->read_some(buffer.data(), buffer.size())) out->append(buffer.data(), n);
}

TEST_F(AgentStreamTest, WritesWaitForCredit) {
    auto stream = make();
    stream->on_frame(FrameType::connected, "");
    bool done = false;
    asio::co_spawn(io_, write_all(stream, std::string(3 * CUBICLE_STREAM_WINDOW, 'x'), &done), asio::detached);
    io_.poll();
    EXPECT_FALSE(done);
    EXPECT_EQ(sent_->data_bytes(), CUBICLE_STREAM_WINDOW);  // a window, then nothing without credit
    for (auto& frame : sent_->frames) EXPECT_LE(frame.payload.size(), 64u * 1024);
    stream->on_frame(FrameType::window, std::to_string(CUBICLE_STREAM_WINDOW));
    io_.poll();
    EXPECT_EQ(sent_->data_bytes(), 2 * CUBICLE_STREAM_WINDOW);
    stream->on_frame(FrameType::window, std::to_string(CUBICLE_STREAM_WINDOW));
    io_.poll();
    EXPECT_TRUE(done);
    EXPECT_EQ(sent_->data_bytes(), 3 * CUBICLE_STREAM_WINDOW);
}

TEST_F(AgentStreamTest, ReadingHandsCreditBackInBatches) {
    auto stream = make();
    stream->on_frame(FrameType::connected, "");
    std::string got;
    asio::co_spawn(io_, read_all(stream, &got), asio::detached);
    std::string chunk(64 * 1024, 'y');
    for (int i = 0; i < 16; ++i) stream->on_frame(FrameType::data, chunk);  // a whole window
    io_.poll();
    std::uint64_t credit = 0;
    for (const auto& f : sent_->frames) credit += f.type == FrameType::window ? std::stoull(f.payload) : 0;
    EXPECT_GE(credit, CUBICLE_STREAM_WINDOW * 3 / 4);
    stream->on_frame(FrameType::shut, "");
    io_.poll();
    EXPECT_EQ(got.size(), 16u * chunk.size());
    EXPECT_TRUE(stream->error().empty());
}

TEST_F(AgentStreamTest, DataBeyondTheWindowAborts) {
    auto stream = make();
    stream->on_frame(FrameType::connected, "");
    std::string chunk(64 * 1024, 'z');
    for (int i = 0; i < 17; ++i) stream->on_frame(FrameType::data, chunk);  // nobody reads: past the window
    EXPECT_TRUE(stream->finished());
    ASSERT_FALSE(sent_->frames.empty());
    EXPECT_EQ(sent_->frames.back().type, FrameType::shut);
    EXPECT_FALSE(sent_->frames.back().payload.empty());  // an abort says why
}

TEST_F(AgentStreamTest, RefusedConnectionSaysWhy) {
    auto stream = make();
    bool connected = true;
    auto wait = [](std::shared_ptr<AgentStream> s, bool* ok) -> asio::awaitable<void> { *ok = co_await s->connected(std::chrono::seconds(10)); };
    asio::co_spawn(io_, wait(stream, &connected), asio::detached);
    io_.poll();
    stream->on_frame(FrameType::error, "nothing listens on port 8000 in the sandbox");
    io_.poll();
    EXPECT_FALSE(connected);
    EXPECT_EQ(stream->error(), "nothing listens on port 8000 in the sandbox");
}

TEST_F(AgentStreamTest, HalfCloseBothWaysEndsIt) {
    auto stream = make();
    stream->on_frame(FrameType::connected, "");
    stream->shutdown_write();
    EXPECT_FALSE(stream->finished());
    stream->on_frame(FrameType::shut, "");
    EXPECT_TRUE(stream->finished());
    EXPECT_EQ(sent_->frames.back().type, FrameType::shut);
    EXPECT_TRUE(sent_->frames.back().payload.empty());
}

TEST_F(AgentStreamTest, MalformedWindowAborts) {
    auto stream = make();
    stream->on_frame(FrameType::connected, "");
    stream->on_frame(FrameType::window, "12x");
    EXPECT_TRUE(stream->finished());
    stream = make();
    stream->on_frame(FrameType::window, std::to_string(CUBICLE_STREAM_WINDOW));  // more than it ever gave
    EXPECT_TRUE(stream->finished());
}

TEST_F(AgentStreamTest, ClosingTheSandboxWakesReaders) {
    auto stream = make();
    stream->on_frame(FrameType::connected, "");
    bool finished = false;
    auto read = [](std::shared_ptr<AgentStream> s, bool* fin) -> asio::awaitable<void> {
        char c;
        co_await s->read_some(&c, 1);
        *fin = true;
    };
    asio::co_spawn(io_, read(stream, &finished), asio::detached);
    io_.poll();
    EXPECT_FALSE(finished);
    stream->on_closed("sandbox sb-x stopped");
    io_.poll();
    EXPECT_TRUE(finished);
    EXPECT_EQ(stream->error(), "sandbox sb-x stopped");
}

TEST_F(AgentStreamTest, AnAgentThatNeverConnectsTimesOut) {
    auto stream = make();
    bool connected = true;
    auto wait = [](std::shared_ptr<AgentStream> s, bool* ok) -> asio::awaitable<void> { *ok = co_await s->connected(std::chrono::milliseconds(20)); };
    asio::co_spawn(io_, wait(stream, &connected), asio::detached);
    io_.run_for(std::chrono::seconds(5));
    EXPECT_FALSE(connected);
    EXPECT_NE(stream->error().find("did not connect"), std::string::npos);
    EXPECT_TRUE(stream->finished());
    EXPECT_EQ(sent_->frames.back().type, FrameType::shut);  // the agent forgets it too
}

TEST_F(AgentStreamTest, EmptyDataIsNotTheEnd) {
    auto stream = make();
    stream->on_frame(FrameType::connected, "");
    for (int i = 0; i < 1000; ++i) stream->on_frame(FrameType::data, "");  // nothing queued, no end read
    stream->on_frame(FrameType::data, "answer");
    stream->on_frame(FrameType::shut, "");
    std::string out;
    asio::co_spawn(io_, read_all(stream, &out), asio::detached);
    io_.run();
    EXPECT_EQ(out, "answer");
    EXPECT_TRUE(stream->error().empty());
}

TEST_F(AgentStreamTest, WhatArrivedBeforeABreakIsStillRead) {
    auto stream = make();
    stream->on_frame(FrameType::connected, "");
    stream->on_frame(FrameType::data, "HTTP/1.1 200 OK\r\n\r\nearly");
    stream->on_frame(FrameType::shut, "reading from the program failed: Connection reset by peer");
    std::string out;
    asio::co_spawn(io_, read_all(stream, &out), asio::detached);
    io_.run();
    EXPECT_EQ(out, "HTTP/1.1 200 OK\r\n\r\nearly");
    EXPECT_FALSE(stream->error().empty());
}

} // namespace
} // namespace cubicle::sandbox
