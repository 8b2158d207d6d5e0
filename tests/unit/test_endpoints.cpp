// Engine endpoints: URL parsing and the docker CLI's precedence (flag / DOCKER_HOST >
// DOCKER_CONTEXT > currentContext > the local socket), against real files in a temp dir.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "docker/endpoint.hpp"

namespace {

using cubicle::docker::context_id;
using cubicle::docker::Endpoint;
using cubicle::docker::EndpointSettings;
using cubicle::docker::parse_docker_host;
using cubicle::docker::resolve_endpoint;
namespace fs = std::filesystem;

class DockerConfigDir : public ::testing::Test {
protected:
    void SetUp() override {
        char pattern[] = "/tmp/cubicle-endpoints-XXXXXX";
        ASSERT_NE(::mkdtemp(pattern), nullptr);
        dir = pattern;
        settings.config_dir = dir.string();
    }
    void TearDown() override { fs::remove_all(dir); }

    void write(const fs::path& path, const std::string& text) {
        fs::create_directories(path.parent_path());
        std::ofstream(path) << text;
    }
    void add_context(const std::string& name, const std::string& host, bool skip_verify = false, bool tls_files = false) {
        auto id = context_id(name);
        write(dir / "contexts" / "meta" / id / "meta.json",
              R"({"Name":")" + name + R"(","Metadata":{"Description":""},"Endpoints":{"docker":{"Host":")" + host +
                  R"(","SkipTLSVerify":)" + (skip_verify ? "true" : "false") + "}}}");
        if (tls_files) {
            for (auto file : {"ca.pem", "cert.pem", "key.pem"}) write(dir / "contexts" / "tls" / id / "docker" / file, "pem");
        }
    }

    fs::path dir;
    EndpointSettings settings;
};

TEST(EndpointParse, Ssh) {
    auto e = parse_docker_host("ssh://deploy@build.example:2222");
    EXPECT_EQ(e.kind, Endpoint::Kind::ssh);
    EXPECT_EQ(e.user, "deploy");
    EXPECT_EQ(e.host, "build.example");
    EXPECT_EQ(e.port, "2222");
    EXPECT_EQ(e.describe(), "ssh://deploy@build.example:2222");
    auto bare = parse_docker_host("ssh://build.example");
    EXPECT_EQ(bare.user, "");
    EXPECT_EQ(bare.port, "");  // the ssh config's
    EXPECT_EQ(bare.describe(), "ssh://build.example");
}

TEST(EndpointParse, SshRefusesOptionsAndPaths) {
    EXPECT_THROW(parse_docker_host("ssh://-oProxyCommand=evil"), std::invalid_argument);
    EXPECT_THROW(parse_docker_host("ssh://-x@host"), std::invalid_argument);
    EXPECT_THROW(parse_docker_host("ssh://host/some/path"), std::invalid_argument);
    EXPECT_THROW(parse_docker_host("ssh://host:0"), std::invalid_argument);
    EXPECT_THROW(parse_docker_host("ssh://host:ssh"), std::invalid_argument);
    EXPECT_THROW(parse_docker_host("ssh://@host"), std::invalid_argument);
}

TEST(EndpointParse, ErrorsNameTheirOrigin) {
    try {
        parse_docker_host("ftp://x", "DOCKER_HOST");
        FAIL();
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("DOCKER_HOST"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("ssh://"), std::string::npos) << e.what();
    }
}

TEST(EndpointParse, ContextIdIsSha256OfTheName) {
    // printf default | sha256sum
    EXPECT_EQ(context_id("default"), "37a8eec1ce19687d132fe29051dca629d164e2c4958ba141d5f4133a33f0688f");
}

TEST_F(DockerConfigDir, NothingSetIsTheLocalSocket) {
    auto e = resolve_endpoint(settings);
    EXPECT_EQ(e.kind, Endpoint::Kind::unix_socket);
    EXPECT_EQ(e.path, "/var/run/docker.sock");
    EXPECT_EQ(e.source, "the default");
}

TEST_F(DockerConfigDir, DockerHostBeatsEveryContext) {
    add_context("remote", "ssh://root@10.0.0.9");
    write(dir / "config.json", R"({"currentContext": "remote"})");
    settings.context = "remote";
    settings.docker_host = "unix:///run/other.sock";
    settings.docker_host_origin = "DOCKER_HOST";
    auto e = resolve_endpoint(settings);
    EXPECT_EQ(e.path, "/run/other.sock");
    EXPECT_EQ(e.source, "DOCKER_HOST");
}

TEST_F(DockerConfigDir, DockerContextBeatsCurrentContext) {
    add_context("a", "tcp://10.0.0.1:2375");
    add_context("b", "ssh://me@10.0.0.2");
    write(dir / "config.json", R"({"auths": {}, "currentContext": "a"})");
    auto current = resolve_endpoint(settings);
    EXPECT_EQ(current.host, "10.0.0.1");
    EXPECT_EQ(current.context, "a");
    EXPECT_NE(current.source.find("currentContext"), std::string::npos) << current.source;
    settings.context = "b";
    auto chosen = resolve_endpoint(settings);
    EXPECT_EQ(chosen.kind, Endpoint::Kind::ssh);
    EXPECT_EQ(chosen.user, "me");
    EXPECT_EQ(chosen.source, "context 'b' (from DOCKER_CONTEXT)");
}

TEST_F(DockerConfigDir, DefaultContextIsNoContext) {
    write(dir / "config.json", R"({"currentContext": "default"})");
    EXPECT_EQ(resolve_endpoint(settings).path, "/var/run/docker.sock");
    settings.context = "default";
    EXPECT_EQ(resolve_endpoint(settings).path, "/var/run/docker.sock");
}

TEST_F(DockerConfigDir, MissingContextNamesItsOrigin) {
    settings.context = "nowhere";
    try {
        resolve_endpoint(settings);
        FAIL();
    } catch (const std::invalid_argument& e) {
        std::string text = e.what();
        EXPECT_NE(text.find("'nowhere'"), std::string::npos) << text;
        EXPECT_NE(text.find("DOCKER_CONTEXT"), std::string::npos) << text;
    }
}

TEST_F(DockerConfigDir, BadConfigJsonNamesTheFile) {
    write(dir / "config.json", "{not json");
    try {
        resolve_endpoint(settings);
        FAIL();
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
    }
}

TEST_F(DockerConfigDir, ContextTlsFilesAndSkipVerify) {
    add_context("tls", "tcp://docker.example", false, true);
    settings.context = "tls";
    auto e = resolve_endpoint(settings);
    EXPECT_TRUE(e.tls.enabled);
    EXPECT_TRUE(e.tls.verify);
    EXPECT_EQ(e.port, "2376");
    EXPECT_EQ(e.tls.ca, (dir / "contexts" / "tls" / context_id("tls") / "docker" / "ca.pem").string());
    EXPECT_FALSE(e.tls.cert.empty());
    add_context("skip", "tcp://docker.example:2376", true, false);
    settings.context = "skip";
    auto skip = resolve_endpoint(settings);
    EXPECT_TRUE(skip.tls.enabled);
    EXPECT_FALSE(skip.tls.verify);
    add_context("plain", "tcp://docker.example");
    settings.context = "plain";
    auto plain = resolve_endpoint(settings);
    EXPECT_FALSE(plain.tls.enabled);
    EXPECT_EQ(plain.port, "2375");
}

TEST_F(DockerConfigDir, TlsVerifyUsesCertPath) {
    auto certs = dir / "certs";
    for (auto file : {"ca.pem", "cert.pem", "key.pem"}) write(certs / file, "pem");
    settings.docker_host = "tcp://127.0.0.1";
    settings.docker_host_origin = "DOCKER_HOST";
    settings.tls_verify = true;
    settings.cert_path = certs.string();
    auto e = resolve_endpoint(settings);
    EXPECT_TRUE(e.tls.enabled && e.tls.verify);
    EXPECT_EQ(e.port, "2376");
    EXPECT_EQ(e.tls.ca, (certs / "ca.pem").string());
    EXPECT_EQ(e.tls.key, (certs / "key.pem").string());
    fs::remove(certs / "key.pem");
    EXPECT_THROW(resolve_endpoint(settings), std::invalid_argument);  // a certificate without its key
}

TEST_F(DockerConfigDir, TlsSettingsIgnoredForUnixAndSsh) {
    settings.tls_verify = true;
    settings.docker_host = "ssh://host";
    settings.docker_host_origin = "--docker-host";
    EXPECT_FALSE(resolve_endpoint(settings).tls.enabled);
}

} // namespace
