// Byte-level formats: Docker's stream multiplexing, the agent's frames, tar
// archives, DOCKER_HOST parsing and query encoding.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

#include "docker/client.hpp"
#include "docker/stream.hpp"
#include "docker/tar.hpp"
#include "sandbox/agent_protocol.hpp"

namespace cubicle {
namespace {

using namespace std::string_literals;

// ================================================================ Demuxer

using docker::Demuxer;
using docker::StreamKind;

std::string docker_frame(StreamKind kind, std::string_view payload) {
    std::string out(8, '\0');
    out[0] = static_cast<char>(kind);
    auto n = static_cast<std::uint32_t>(payload.size());
    out[4] = static_cast<char>(n >> 24);
    out[5] = static_cast<char>(n >> 16);
    out[6] = static_cast<char>(n >> 8);
    out[7] = static_cast<char>(n);
    out += payload;
    return out;
}

struct Collected {
    std::string out, err, in;
    std::vector<std::pair<StreamKind, std::string>> pieces;
    void operator()(StreamKind kind, std::string_view data) {
        pieces.emplace_back(kind, std::string(data));
        switch (kind) {
        case StreamKind::stdout_: out += data; break;
        case StreamKind::stderr_: err += data; break;
        case StreamKind::stdin_: in += data; break;
        }
    }
};

TEST(Demuxer, SingleFrames) {
    {
        Demuxer d;
        Collected c;
        EXPECT_TRUE(d.feed(docker_frame(StreamKind::stdout_, "hello"), std::ref(c)));
        EXPECT_EQ(c.out, "hello");
        EXPECT_EQ(c.err, "");
    }
    {
        Demuxer d;
        Collected c;
        EXPECT_TRUE(d.feed(docker_frame(StreamKind::stderr_, "oops\n"), std::ref(c)));
        EXPECT_EQ(c.out, "");
        EXPECT_EQ(c.err, "oops\n");
    }
}

TEST(Demuxer, SeveralFramesInOneFeed) {
    std::string bytes = docker_frame(StreamKind::stdout_, "one ") + docker_frame(StreamKind::stderr_, "E1") +
                        docker_frame(StreamKind::stdout_, "two") + docker_frame(StreamKind::stderr_, "E2");
    Demuxer d;
    Collected c;
    EXPECT_TRUE(d.feed(bytes, std::ref(c)));
    EXPECT_EQ(c.out, "one two");
    EXPECT_EQ(c.err, "E1E2");
    ASSERT_EQ(c.pieces.size(), 4u);
    EXPECT_EQ(c.pieces[0].first, StreamKind::stdout_);
    EXPECT_EQ(c.pieces[1].first, StreamKind::stderr_);
    EXPECT_EQ(c.pieces[2].first, StreamKind::stdout_);
    EXPECT_EQ(c.pieces[3].first, StreamKind::stderr_);
}

TEST(Demuxer, ZeroLengthFrames) {
    std::string bytes = docker_frame(StreamKind::stdout_, "") + docker_frame(StreamKind::stderr_, "") +
                        docker_frame(StreamKind::stdout_, "x") + docker_frame(StreamKind::stderr_, "");
    Demuxer d;
    Collected c;
    EXPECT_TRUE(d.feed(bytes, std::ref(c)));
    EXPECT_EQ(c.out, "x");
    EXPECT_EQ(c.err, "");
    for (const auto& piece : c.pieces) EXPECT_FALSE(piece.second.empty());
}

TEST(Demuxer, BinaryPayloadWithNuls) {
    std::string payload("\0\x01\xff\0header-like\x02\0\0\0", 18);
    Demuxer d;
    Collected c;
    EXPECT_TRUE(d.feed(docker_frame(StreamKind::stdout_, payload) + docker_frame(StreamKind::stderr_, "z"), std::ref(c)));
    EXPECT_EQ(c.out, payload);
    EXPECT_EQ(c.err, "z");
}

TEST(Demuxer, SplitAtEveryByteBoundary) {
    std::string big(300, 'B');
    std::string bytes = docker_frame(StreamKind::stdout_, "abc") + docker_frame(StreamKind::stderr_, "") +
                        docker_frame(StreamKind::stderr_, "defgh") + docker_frame(StreamKind::stdout_, big) +
                        docker_frame(StreamKind::stdout_, "Z");
    for (std::size_t cut = 0; cut <= bytes.size(); ++cut) {
        Demuxer d;
        Collected c;
        ASSERT_TRUE(d.feed(std::string_view(bytes).substr(0, cut), std::ref(c))) << cut;
        ASSERT_TRUE(d.feed(std::string_view(bytes).substr(cut), std::ref(c))) << cut;
        EXPECT_EQ(c.out, "abc" + big + "Z") << cut;
        EXPECT_EQ(c.err, "defgh") << cut;
    }
    // And one byte at a time.
    Demuxer d;
    Collected c;
    for (char byte : bytes) ASSERT_TRUE(d.feed(std::string_view(&byte, 1), std::ref(c)));
    EXPECT_EQ(c.out, "abc" + big + "Z");
    EXPECT_EQ(c.err, "defgh");
}

TEST(Demuxer, TwoCutsEverywhere) {
    std::string bytes = docker_frame(StreamKind::stderr_, "12") + docker_frame(StreamKind::stdout_, "345");
    for (std::size_t a = 0; a <= bytes.size(); ++a) {
        for (std::size_t b = a; b <= bytes.size(); ++b) {
            Demuxer d;
            Collected c;
            std::string_view v(bytes);
            ASSERT_TRUE(d.feed(v.substr(0, a), std::ref(c)));
            ASSERT_TRUE(d.feed(v.substr(a, b - a), std::ref(c)));
            ASSERT_TRUE(d.feed(v.substr(b), std::ref(c)));
            EXPECT_EQ(c.err, "12");
            EXPECT_EQ(c.out, "345");
        }
    }
}

TEST(Demuxer, PartialPayloadIsPassedOnAtOnce) {
    std::string bytes = docker_frame(StreamKind::stdout_, "streaming");
    Demuxer d;
    Collected c;
    ASSERT_TRUE(d.feed(std::string_view(bytes).substr(0, 8 + 4), std::ref(c)));
    EXPECT_EQ(c.out, "stre");
    ASSERT_TRUE(d.feed(std::string_view(bytes).substr(12), std::ref(c)));
    EXPECT_EQ(c.out, "streaming");
}

TEST(Demuxer, MalformedHeaderReturnsFalse) {
    for (std::string header : {"\x03\0\0\0\0\0\0\x01"s, "\x01\x01\0\0\0\0\0\x01"s, "\x01\0\x01\0\0\0\0\x01"s,
                               "\x02\0\0\x01\0\0\0\x01"s, "HTTP/1.1 200 OK\r\n"s}) {
        Demuxer d;
        Collected c;
        EXPECT_FALSE(d.feed(header + "x", std::ref(c))) << header;
        EXPECT_TRUE(c.out.empty());
    }
    // Malformed header after a good frame, and split across feeds.
    Demuxer d;
    Collected c;
    std::string bytes = docker_frame(StreamKind::stdout_, "ok") + "\x07\0\0\0\0\0\0\x01"s;
    EXPECT_TRUE(d.feed(std::string_view(bytes).substr(0, 13), std::ref(c)));
    EXPECT_FALSE(d.feed(std::string_view(bytes).substr(13), std::ref(c)));
    EXPECT_EQ(c.out, "ok");
}

TEST(Demuxer, StdinKindIsAccepted) {
    Demuxer d;
    Collected c;
    EXPECT_TRUE(d.feed(docker_frame(StreamKind::stdin_, "in"), std::ref(c)));
    EXPECT_EQ(c.in, "in");
}

// ================================================================ agent protocol

namespace agent = sandbox::agent;

std::string u32be(std::uint32_t v) {
    return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

TEST(AgentEncode, HeaderLayout) {
    std::string frame = agent::encode(agent::FrameType::kill, 0x01020304u, "payload");
    ASSERT_EQ(frame.size(), agent::header_size + 7);
    EXPECT_EQ(frame.substr(0, 4), u32be(7));
    EXPECT_EQ(static_cast<unsigned char>(frame[4]), 0x02);
    EXPECT_EQ(frame.substr(5, 4), "\x01\x02\x03\x04"s);
    EXPECT_EQ(frame.substr(9), "payload");

    std::string empty = agent::encode(agent::FrameType::ping, 0xFFFFFFFFu);
    EXPECT_EQ(empty, u32be(0) + "\x03"s + "\xff\xff\xff\xff"s);
}

TEST(AgentEncodeRun, PayloadLayout) {
    agent::RunRequest r;
    r.timeout_ms = 30000;
    r.max_output_bytes = 1048576;
    r.cwd = "/workspace";
    r.argv = {"python3", "-u", "-"};
    r.env = {"A=1", "B=two words"};
    r.stdin_data = std::string("print('hi')\0tail\0", 18);
    std::string frame = agent::encode_run(77, r);

    std::string expected_payload = "30000\0"s "1048576\0"s "/workspace\0"s "3\0"s "python3\0"s "-u\0"s "-\0"s
                                   "2\0"s "A=1\0"s "B=two words\0"s +
                                   std::string("print('hi')\0tail\0", 18);
    ASSERT_GE(frame.size(), agent::header_size);
    EXPECT_EQ(frame.substr(0, 4), u32be(static_cast<std::uint32_t>(expected_payload.size())));
    EXPECT_EQ(static_cast<unsigned char>(frame[4]), 0x01);
    EXPECT_EQ(frame.substr(5, 4), u32be(77));
    EXPECT_EQ(frame.substr(9), expected_payload);
}

TEST(AgentEncodeRun, OpenFrameHasTheSamePayload) {
    agent::RunRequest r;
    r.cwd = "/workspace";
    r.argv = {"python3", "-u", "-c", "driver"};
    r.env = {"K=V"};
    std::string run = agent::encode_run(3, r);
    std::string open = agent::encode_run(3, r, agent::FrameType::open);
    EXPECT_EQ(static_cast<unsigned char>(run[4]), 0x01);
    EXPECT_EQ(static_cast<unsigned char>(open[4]), 0x05);
    EXPECT_EQ(run.substr(0, 4), open.substr(0, 4));
    EXPECT_EQ(run.substr(5), open.substr(5));
}

TEST(AgentEncodeRun, EmptyEnvAndStdin) {
    agent::RunRequest r;
    r.cwd = "/";
    r.argv = {"true"};
    std::string frame = agent::encode_run(1, r);
    EXPECT_EQ(frame.substr(9), "0\0"s "0\0"s "/\0"s "1\0"s "true\0"s "0\0"s);
}

TEST(AgentEncodeRun, ArgumentsWithSpecialBytesKeptVerbatim) {
    agent::RunRequest r;
    r.timeout_ms = 1;
    r.max_output_bytes = 2;
    r.cwd = "/w";
    r.argv = {"bash", "-c", "echo 'é\t\n'"};
    std::string frame = agent::encode_run(9, r);
    EXPECT_EQ(frame.substr(9), "1\0"s "2\0"s "/w\0"s "3\0"s "bash\0"s "-c\0"s "echo 'é\t\n'\0"s "0\0"s);
}

TEST(AgentDecoder, DecodesEncodedFrames) {
    agent::Decoder d;
    d.feed(agent::encode(agent::FrameType::hello, 0, "v1") + agent::encode(agent::FrameType::stdout_, 5, "out") +
           agent::encode(agent::FrameType::exit, 5, "0 0 0 0 10 20 0"));
    auto a = d.next();
    ASSERT_TRUE(a);
    EXPECT_EQ(a->type, agent::FrameType::hello);
    EXPECT_EQ(a->id, 0u);
    EXPECT_EQ(a->payload, "v1");
    auto b = d.next();
    ASSERT_TRUE(b);
    EXPECT_EQ(b->type, agent::FrameType::stdout_);
    EXPECT_EQ(b->id, 5u);
    EXPECT_EQ(b->payload, "out");
    auto c = d.next();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->type, agent::FrameType::exit);
    EXPECT_EQ(c->payload, "0 0 0 0 10 20 0");
    EXPECT_FALSE(d.next());
    EXPECT_FALSE(d.next());
}

TEST(AgentDecoder, SplitAtEveryByteBoundary) {
    std::string big(1000, 'q');
    std::string binary("\0\x01\xff", 3);
    std::string bytes = agent::encode(agent::FrameType::stdout_, 1, "a") + agent::encode(agent::FrameType::pong, 2) +
                        agent::encode(agent::FrameType::stderr_, 0xdeadbeef, big) +
                        agent::encode(agent::FrameType::error, 3, binary);
    for (std::size_t cut = 0; cut <= bytes.size(); ++cut) {
        agent::Decoder d;
        std::vector<agent::Frame> frames;
        d.feed(std::string_view(bytes).substr(0, cut));
        while (auto f = d.next()) frames.push_back(std::move(*f));
        d.feed(std::string_view(bytes).substr(cut));
        while (auto f = d.next()) frames.push_back(std::move(*f));
        ASSERT_EQ(frames.size(), 4u) << cut;
        EXPECT_EQ(frames[0].payload, "a");
        EXPECT_EQ(frames[1].type, agent::FrameType::pong);
        EXPECT_EQ(frames[1].payload, "");
        EXPECT_EQ(frames[2].id, 0xdeadbeefu);
        EXPECT_EQ(frames[2].payload, big);
        EXPECT_EQ(frames[3].type, agent::FrameType::error);
        EXPECT_EQ(frames[3].payload, binary);
    }
    agent::Decoder d;
    std::vector<agent::Frame> frames;
    for (char byte : bytes) {
        d.feed(std::string_view(&byte, 1));
        while (auto f = d.next()) frames.push_back(std::move(*f));
    }
    ASSERT_EQ(frames.size(), 4u);
    EXPECT_EQ(frames[2].payload, big);
    EXPECT_EQ(frames[3].payload, binary);
}

TEST(AgentDecoder, IncompleteFrameWaits) {
    agent::Decoder d;
    std::string frame = agent::encode(agent::FrameType::stdout_, 4, "abcdef");
    d.feed(frame.substr(0, frame.size() - 1));
    EXPECT_FALSE(d.next());
    d.feed(frame.substr(frame.size() - 1));
    auto f = d.next();
    ASSERT_TRUE(f);
    EXPECT_EQ(f->payload, "abcdef");
}

TEST(AgentDecoder, OversizedLengthThrows) {
    agent::Decoder d;
    d.feed(u32be(agent::max_payload + 1) + "\x11"s + u32be(1));
    EXPECT_THROW(d.next(), std::runtime_error);

    agent::Decoder huge;
    huge.feed(u32be(0xFFFFFFFFu) + "\x11"s + u32be(1));
    EXPECT_THROW(huge.next(), std::runtime_error);

    // Exactly the limit is a length to wait for, not an error.
    agent::Decoder limit;
    limit.feed(u32be(agent::max_payload) + "\x11"s + u32be(1) + "partial");
    EXPECT_NO_THROW(EXPECT_FALSE(limit.next()));
}

TEST(AgentParseExit, GoodPayloads) {
    auto s = agent::parse_exit("0 0 0 0 1234 5678 0");
    ASSERT_TRUE(s);
    EXPECT_EQ(s->exit_code, 0);
    EXPECT_EQ(s->signal, 0);
    EXPECT_FALSE(s->timed_out);
    EXPECT_FALSE(s->truncated);
    EXPECT_EQ(s->duration_us, 1234u);
    EXPECT_EQ(s->max_rss_kb, 5678u);
    EXPECT_FALSE(s->memory_limit);

    auto k = agent::parse_exit("-1 9 1 1 30000000 12 1");
    ASSERT_TRUE(k);
    EXPECT_EQ(k->exit_code, -1);
    EXPECT_EQ(k->signal, 9);
    EXPECT_TRUE(k->timed_out);
    EXPECT_TRUE(k->truncated);
    EXPECT_EQ(k->duration_us, 30000000u);
    EXPECT_EQ(k->max_rss_kb, 12u);
    EXPECT_TRUE(k->memory_limit);

    auto e = agent::parse_exit("42 0 0 1 1 2 0");
    ASSERT_TRUE(e);
    EXPECT_EQ(e->exit_code, 42);
    EXPECT_TRUE(e->truncated);
    EXPECT_FALSE(e->timed_out);
    EXPECT_FALSE(agent::parse_exit("-1 9 0 0 5 6 0 x"));
    EXPECT_FALSE(agent::parse_exit("-1 9 0 0 5 6 0 1"));  // exactly seven fields
    EXPECT_FALSE(agent::parse_exit("-1 9 0 0 5 6"));
}

TEST(AgentParseExit, BadPayloads) {
    for (std::string bad : {""s, "0"s, "0 0 0 0 1"s, "a b c d e f"s, "0 0 0 0 1 x"s, "0 0 0 0 1 2"s, "0 0 0 0 1 2 x"s, "0,0,0,0,1,2"s, " "s}) {
        EXPECT_FALSE(agent::parse_exit(bad)) << bad;
    }
}

// ================================================================ tar

using docker::TarEntry;
using docker::TarWriter;

std::uint64_t octal_field(std::string_view field) {
    std::uint64_t v = 0;
    for (char c : field) {
        if (c == '\0' || c == ' ') break;
        EXPECT_TRUE(c >= '0' && c <= '7') << field;
        v = v * 8 + static_cast<std::uint64_t>(c - '0');
    }
    return v;
}

void expect_valid_header(std::string_view header) {
    ASSERT_EQ(header.size(), 512u);
    unsigned sum = 0;
    for (std::size_t i = 0; i < 512; ++i) {
        sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(header[i]);
    }
    EXPECT_EQ(octal_field(header.substr(148, 8)), sum);
    EXPECT_EQ(header.substr(257, 6), "ustar\0"s);
    EXPECT_EQ(header.substr(263, 2), "00");
}

std::string run_capture(const std::string& command) {
    std::string out;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (!pipe) return out;
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
    int status = ::pclose(pipe);
    if (status != 0) out += "\n<exit status " + std::to_string(status) + ">";
    return out;
}

TEST(Tar, FileEntryLayout) {
    TarWriter w;
    std::string content = "hello tar\n";
    w.add(TarEntry{.name = "dir/file.txt", .content = content, .mode = 0640, .uid = 1000, .gid = 1001});
    std::string archive = w.finish();
    // header + one content block + two zero blocks
    ASSERT_EQ(archive.size(), 4u * 512);
    std::string_view header = std::string_view(archive).substr(0, 512);
    expect_valid_header(header);
    EXPECT_EQ(std::string(header.substr(0, 100).data()), "dir/file.txt");
    EXPECT_EQ(octal_field(header.substr(100, 8)), 0640u);
    EXPECT_EQ(octal_field(header.substr(108, 8)), 1000u);
    EXPECT_EQ(octal_field(header.substr(116, 8)), 1001u);
    EXPECT_EQ(octal_field(header.substr(124, 12)), content.size());
    EXPECT_GT(octal_field(header.substr(136, 12)), 1600000000u);  // a plausible mtime
    EXPECT_EQ(header[156], '0');
    EXPECT_EQ(archive.substr(512, content.size()), content);
    EXPECT_EQ(archive.substr(512 + content.size(), 512 - content.size()), std::string(512 - content.size(), '\0'));
    EXPECT_EQ(archive.substr(1024), std::string(1024, '\0'));
}

TEST(Tar, DirectoryAndBlockPadding) {
    TarWriter w;
    w.add(TarEntry{.name = "d", .directory = true, .mode = 0755});
    std::string exact(512, 'x');
    w.add(TarEntry{.name = "d/exact", .content = exact});
    std::string over(513, 'y');
    w.add(TarEntry{.name = "d/over", .content = over});
    w.add(TarEntry{.name = "d/empty", .content = ""});
    std::string archive = w.finish();
    // dir header; exact header + 1 block; over header + 2 blocks; empty header; 2 end blocks
    ASSERT_EQ(archive.size(), 512u * (1 + 2 + 3 + 1 + 2));
    ASSERT_EQ(archive.size() % 512, 0u);
    std::string_view a(archive);
    expect_valid_header(a.substr(0, 512));
    EXPECT_EQ(a[156], '5');
    EXPECT_EQ(octal_field(a.substr(124, 12)), 0u);
    EXPECT_EQ(octal_field(a.substr(100, 8)), 0755u);
    expect_valid_header(a.substr(512, 512));
    EXPECT_EQ(octal_field(a.substr(512 + 124, 12)), 512u);
    EXPECT_EQ(a.substr(1024, 512), exact);
    expect_valid_header(a.substr(1536, 512));
    EXPECT_EQ(octal_field(a.substr(1536 + 124, 12)), 513u);
    EXPECT_EQ(a.substr(2048, 513), over);
    expect_valid_header(a.substr(3072, 512));
    EXPECT_EQ(octal_field(a.substr(3072 + 124, 12)), 0u);
    EXPECT_EQ(a[3072 + 156], '0');
}

TEST(Tar, NameLimits) {
    TarWriter w;
    EXPECT_THROW(w.add(TarEntry{.name = ""}), std::length_error);
    EXPECT_NO_THROW(w.add(TarEntry{.name = std::string(99, 'n')}));
    // Longer names travel in a PAX header block before the entry.
    std::size_t before = w.size();
    w.add(TarEntry{.name = std::string(300, 'n'), .content = "x"});
    auto archive = w.finish();
    EXPECT_EQ(archive[before + 156], 'x');
    EXPECT_NE(archive.find("path=" + std::string(300, 'n') + "\n"), std::string::npos);
}

TEST(Tar, AcceptedBySystemTar) {
    if (std::system("tar --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no tar";
    TarWriter w;
    std::string content = "print('hi')\n";
    std::string blob(1500, '\x01');
    w.add(TarEntry{.name = "src", .directory = true, .mode = 0755, .uid = 1000, .gid = 1000});
    w.add(TarEntry{.name = "src/main.py", .content = content, .mode = 0644, .uid = 1000, .gid = 1000});
    w.add(TarEntry{.name = "blob.bin", .content = blob, .mode = 0600});
    std::string archive = w.finish();

    char dir_template[] = "/tmp/cubicle-tar-XXXXXX";
    ASSERT_NE(::mkdtemp(dir_template), nullptr);
    std::string dir = dir_template;
    std::string path = dir + "/a.tar";
    {
        std::ofstream f(path, std::ios::binary);
        f.write(archive.data(), static_cast<std::streamsize>(archive.size()));
    }
    std::string listing = run_capture("tar --numeric-owner -tvf '" + path + "' 2>&1");
    EXPECT_EQ(listing.find("<exit status"), std::string::npos) << listing;
    EXPECT_NE(listing.find("src/main.py"), std::string::npos) << listing;
    EXPECT_NE(listing.find("blob.bin"), std::string::npos) << listing;
    EXPECT_NE(listing.find("drwxr-xr-x"), std::string::npos) << listing;
    EXPECT_NE(listing.find("-rw-r--r--"), std::string::npos) << listing;
    EXPECT_NE(listing.find("-rw-------"), std::string::npos) << listing;
    EXPECT_NE(listing.find("1000/1000"), std::string::npos) << listing;
    EXPECT_NE(listing.find(" 1500 "), std::string::npos) << listing;

    std::string extracted = run_capture("tar -xOf '" + path + "' src/main.py 2>&1");
    EXPECT_EQ(extracted, content);
    std::string extracted_blob = run_capture("tar -xOf '" + path + "' blob.bin 2>&1");
    EXPECT_EQ(extracted_blob, blob);
    EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

// ================================================================ DOCKER_HOST, url_encode

using docker::Endpoint;
using docker::parse_docker_host;

TEST(DockerHost, EmptyIsTheDefaultSocket) {
    Endpoint e = parse_docker_host("");
    EXPECT_EQ(e.kind, Endpoint::Kind::unix_socket);
    EXPECT_EQ(e.path, "/var/run/docker.sock");
}

TEST(DockerHost, UnixSocket) {
    Endpoint e = parse_docker_host("unix:///run/user/1000/docker.sock");
    EXPECT_EQ(e.kind, Endpoint::Kind::unix_socket);
    EXPECT_EQ(e.path, "/run/user/1000/docker.sock");
    EXPECT_FALSE(e.describe().empty());
    EXPECT_THROW(parse_docker_host("unix://"), std::invalid_argument);
}

TEST(DockerHost, TcpHostPort) {
    Endpoint e = parse_docker_host("tcp://docker.example:2376");
    EXPECT_EQ(e.kind, Endpoint::Kind::tcp);
    EXPECT_EQ(e.host, "docker.example");
    EXPECT_EQ(e.port, "2376");

    Endpoint ip = parse_docker_host("tcp://127.0.0.1:2375");
    EXPECT_EQ(ip.host, "127.0.0.1");
    EXPECT_EQ(ip.port, "2375");

    Endpoint no_port = parse_docker_host("tcp://docker.example");
    EXPECT_EQ(no_port.host, "docker.example");
    EXPECT_EQ(no_port.port, "2375");

    Endpoint trailing = parse_docker_host("tcp://10.0.0.1:2375/");
    EXPECT_EQ(trailing.host, "10.0.0.1");
    EXPECT_EQ(trailing.port, "2375");
}

TEST(DockerHost, TcpIpv6) {
    Endpoint e = parse_docker_host("tcp://[::1]:2376");
    EXPECT_EQ(e.kind, Endpoint::Kind::tcp);
    EXPECT_EQ(e.host, "::1");
    EXPECT_EQ(e.port, "2376");
}

TEST(DockerHost, TcpIpv6WithoutPort) {
    Endpoint e = parse_docker_host("tcp://[::1]");
    EXPECT_EQ(e.kind, Endpoint::Kind::tcp);
    EXPECT_EQ(e.host, "::1");
    EXPECT_EQ(e.port, "2375");
}

TEST(DockerHost, TcpEmptyPortThrows) {
    // Malformed: "host:" names no port (today it yields port "", which only
    // fails later, at connect time, with a resolver error).
    EXPECT_THROW(parse_docker_host("tcp://docker.example:"), std::invalid_argument);
}

TEST(DockerHost, BadSchemesThrow) {
    for (std::string bad : {"http://localhost:2375"s, "ssh://user@host/path"s, "npipe:////./pipe/docker_engine"s,
                            "/var/run/docker.sock"s, "localhost:2375"s, "tcp://"s, "tcp://:2375"s}) {
        EXPECT_THROW(parse_docker_host(bad), std::invalid_argument) << bad;
    }
}

TEST(UrlEncode, Encoding) {
    EXPECT_EQ(docker::url_encode(""), "");
    EXPECT_EQ(docker::url_encode("AZaz09-_.~"), "AZaz09-_.~");
    EXPECT_EQ(docker::url_encode("a b"), "a%20b");
    EXPECT_EQ(docker::url_encode("KILL"), "KILL");
    EXPECT_EQ(docker::url_encode("/&=?+%#"), "%2F%26%3D%3F%2B%25%23");
    EXPECT_EQ(docker::url_encode(R"({"label":["io.cubicle.managed=true"]})"),
              "%7B%22label%22%3A%5B%22io.cubicle.managed%3Dtrue%22%5D%7D");
    EXPECT_EQ(docker::url_encode("é"), "%C3%A9");
    EXPECT_EQ(docker::url_encode(std::string("\0\xff", 2)), "%00%FF");
}

} // namespace
} // namespace cubicle
