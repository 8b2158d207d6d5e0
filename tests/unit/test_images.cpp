// Image profiles (the embedded images/*.profile files and their parser) and registry names.
#include <gtest/gtest.h>

#include <stdexcept>

#include "docker/registry.hpp"
#include "image/profiles.hpp"

using namespace cubicle::image;

TEST(Profiles, EveryEmbeddedProfileParsesAndNamesItsImage) {
    ASSERT_GE(profiles().size(), 3u);
    for (const auto& profile : profiles()) {
        EXPECT_FALSE(profile.packages.empty()) << profile.name;
        EXPECT_TRUE(profile.image.starts_with("cubicle/")) << profile.name;
    }
    auto sandbox = find_profile("sandbox");
    ASSERT_NE(sandbox, nullptr);
    EXPECT_EQ(sandbox->image, "cubicle/sandbox:latest");
    EXPECT_EQ(sandbox->repository(), "cubicle/sandbox");
    EXPECT_EQ(sandbox->tag(), "latest");
    EXPECT_EQ(find_profile("cubicle/sandbox"), sandbox);
    EXPECT_EQ(find_profile("cubicle/sandbox:latest"), sandbox);
    EXPECT_EQ(find_profile("cubicle/sandbox:other"), nullptr);
    EXPECT_EQ(find_profile("python:3"), nullptr);
}

TEST(Profiles, ParsesContinuationLinesAndComments) {
    auto p = parse_profile("x", "# comment\nimage: a/b:c\nlanguages: python bash\npackages:\n    one two\n\tthree\nenv: A=1 B=2\n");
    EXPECT_EQ(p.image, "a/b:c");
    EXPECT_EQ(p.packages, (std::vector<std::string>{"one", "two", "three"}));
    EXPECT_EQ(p.languages, (std::vector<std::string>{"python", "bash"}));
    EXPECT_EQ(p.env, (std::vector<std::string>{"A=1", "B=2"}));
    EXPECT_EQ(p.user, "1000:1000");
}

TEST(Profiles, RefusesMistakesNamingTheProfile) {
    EXPECT_THROW(parse_profile("x", "packages: a\n"), std::invalid_argument);           // no image
    EXPECT_THROW(parse_profile("x", "image: a\n"), std::invalid_argument);              // no packages
    EXPECT_THROW(parse_profile("x", "image: a\npackages: b\ncolour: red\n"), std::invalid_argument);
    EXPECT_THROW(parse_profile("x", "image: a\nimage: b\npackages: b\n"), std::invalid_argument);
    EXPECT_THROW(parse_profile("x", "  stray\nimage: a\npackages: b\n"), std::invalid_argument);
    EXPECT_THROW(parse_profile("x", "image: a\npackages: b\nenv: NOVALUE\n"), std::invalid_argument);
    try {
        parse_profile("mine", "image: a\npackages: b\nwhat\n");
        FAIL();
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(), "profile mine, line 3: expected 'key: value'");
    }
}

TEST(Profiles, RecipeDigestFollowsTheProfileAndTheSuite) {
    auto a = parse_profile("x", "image: a\npackages: b\n");
    auto b = parse_profile("x", "image: a\npackages: b c\n");
    EXPECT_EQ(recipe_digest(a, "bookworm"), recipe_digest(a, "bookworm"));
    EXPECT_EQ(recipe_digest(a, "bookworm").size(), 16u);
    EXPECT_NE(recipe_digest(a, "bookworm"), recipe_digest(b, "bookworm"));
    EXPECT_NE(recipe_digest(a, "bookworm"), recipe_digest(a, "trixie"));
}

// Registries (docker/registry.hpp): `cubicle image build --push` and Swarm's derived images.
TEST(Registries, TheFirstPartOfANameIsARegistryOnlyWhenItIsAHost) {
    EXPECT_EQ(cubicle::docker::registry_of("cubicle/sandbox:latest"), "");
    EXPECT_EQ(cubicle::docker::registry_of("python:3"), "");
    EXPECT_EQ(cubicle::docker::registry_of("127.0.0.1:5000/cubicle/sandbox:latest"), "127.0.0.1:5000");
    EXPECT_EQ(cubicle::docker::registry_of("localhost/x"), "localhost");
    EXPECT_EQ(cubicle::docker::registry_of("registry.example.com/team/x:1"), "registry.example.com");
}

TEST(Registries, ANameMovesToAnotherRegistryKeepingItsPath) {
    using cubicle::docker::in_registry;
    EXPECT_EQ(in_registry("127.0.0.1:5000", "cubicle/sandbox:latest"), "127.0.0.1:5000/cubicle/sandbox:latest");
    EXPECT_EQ(in_registry("127.0.0.1:5000/", "cubicle/sandbox:latest"), "127.0.0.1:5000/cubicle/sandbox:latest");
    EXPECT_EQ(in_registry("reg.example.com/team", "cubicle/sandbox:latest"), "reg.example.com/team/cubicle/sandbox:latest");
    EXPECT_EQ(in_registry("localhost:5000", "old.example.com/cubicle/x:1"), "localhost:5000/cubicle/x:1");
    for (const char* bad : {"", "/", "http://127.0.0.1:5000", "registry", "reg.example.com//x", "a b.example.com"})
        EXPECT_THROW(in_registry(bad, "cubicle/sandbox:latest"), std::invalid_argument) << bad;
}
