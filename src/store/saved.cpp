#include "store/saved.hpp"

#include <algorithm>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

#include "common/json.hpp"
#include "store/fields.hpp"

namespace cubicle::store {

std::string volume_of(std::string_view sandbox_id) {
    return fmt::format("cubicle-ws-{}", sandbox_id);
}

void write_spec(json::Writer& w, const sandbox::SandboxSpec& s) {
    w.begin_object().field("image", s.image).field("network", s.network).field("gpu", s.gpu);
    w.field("memory_mb", s.memory_mb).field("cpus", s.cpus).field("pids_limit", s.pids_limit).field("tmp_size_mb", s.tmp_size_mb);
    w.field("disk_mb", s.disk_mb).field("files_limit", s.files_limit).field("runtime", s.runtime);
    w.key("env").begin_array();
    for (const auto& [name, value] : s.env) w.begin_array().value(name).value(value).end_array();
    w.end_array().end_object();
}

sandbox::SandboxSpec read_spec(simdjson::dom::element spec) {
    sandbox::SandboxSpec s;
    s.image = string_of(spec, "image");
    s.network = flag_of(spec, "network");
    s.gpu = flag_of(spec, "gpu");
    s.memory_mb = static_cast<int>(number_of<std::int64_t>(spec, "memory_mb"));
    s.cpus = number_of<double>(spec, "cpus");
    s.pids_limit = static_cast<int>(number_of<std::int64_t>(spec, "pids_limit"));
    s.tmp_size_mb = static_cast<int>(number_of<std::int64_t>(spec, "tmp_size_mb"));
    s.disk_mb = static_cast<int>(number_of<std::int64_t>(spec, "disk_mb"));
    s.files_limit = static_cast<int>(number_of<std::int64_t>(spec, "files_limit"));
    s.runtime = string_of(spec, "runtime");
    simdjson::dom::array env;
    if (spec["env"].get(env) != simdjson::SUCCESS) throw std::runtime_error("the record has no env");
    for (auto pair : env) {
        std::string_view name, value;
        if (pair.at(0).get(name) != simdjson::SUCCESS || pair.at(1).get(value) != simdjson::SUCCESS)
            throw std::runtime_error("the record's env is malformed");
        s.env.emplace_back(name, value);
    }
    return s;
}

std::string to_json(const SavedSandbox& saved) {
    json::Writer w;
    w.begin_object().field("version", record_version).field("sandbox_id", saved.sandbox_id).field("name", saved.name);
    w.field("owner", saved.owner).field("engine", saved.engine).field("volume", saved.volume).key("spec");
    write_spec(w, saved.spec);
    w.field("stateful", saved.stateful).field("auto_install", saved.auto_install);
    w.field("created", saved.created).field("last_used", saved.last_used).field("size_bytes", saved.size_bytes);
    w.field("ended", saved.ended).end_object();
    return w.take() + "\n";
}

SavedSandbox saved_sandbox_from_json(std::string_view text) {
    json::Document document;
    auto root = record_root(document, text);
    SavedSandbox saved;
    saved.sandbox_id = string_of(root, "sandbox_id");
    saved.name = string_of(root, "name");
    saved.owner = string_of(root, "owner");
    saved.engine = string_of(root, "engine");
    saved.volume = string_of(root, "volume");
    if (saved.volume != volume_of(saved.sandbox_id)) throw std::runtime_error("the record names a volume not its own");
    simdjson::dom::element spec;
    if (root["spec"].get(spec) != simdjson::SUCCESS) throw std::runtime_error("the record has no spec");
    saved.spec = read_spec(spec);
    saved.stateful = flag_of(root, "stateful");
    saved.auto_install = flag_of(root, "auto_install");
    saved.created = number_of<std::int64_t>(root, "created");
    saved.last_used = number_of<std::int64_t>(root, "last_used");
    saved.size_bytes = number_of<std::uint64_t>(root, "size_bytes");
    saved.ended = string_of(root, "ended");
    return saved;
}

std::optional<std::string> invalid_name(std::string_view name) {
    if (name.empty() || name.size() > 64) return "a sandbox name has 1 to 64 characters";
    auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
    if (!alnum(name.front())) return "a sandbox name starts with a letter or a digit";
    for (char c : name) {
        if (!alnum(c) && c != '.' && c != '_' && c != '-')
            return fmt::format("a sandbox name has only letters, digits, '.', '_' and '-' (not '{}')", c);
    }
    return std::nullopt;
}

} // namespace cubicle::store
