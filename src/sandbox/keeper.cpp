#include "sandbox/keeper.hpp"

#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/json.hpp"
#include "common/log.hpp"
#include "sandbox/policy.hpp"

namespace cubicle::sandbox {
namespace {

std::int64_t now_s() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

} // namespace

Keeper::Keeper(docker::Client& docker, const Config& config) : docker_(docker), config_(config) {}

const store::Store& Keeper::store() {
    if (!store_) {
        std::filesystem::path dir;
        try {
            dir = config_.state_dir.empty() ? store::default_state_dir() : std::filesystem::path(config_.state_dir);
            store_ = std::make_unique<store::Store>(dir);
        } catch (const std::exception& e) {
            throw ToolError(fmt::format("persistent sandboxes need a state directory, and {} cannot be used ({}); the operator "
                                        "sets another with --state-dir",
                                        dir.empty() ? std::string("none") : dir.string(), e.what()));
        }
        log::info("keeping persistent sandboxes in {} (store {})", store_->dir().string(), store_->id());
    }
    return *store_;
}

bool Keeper::exists() const {
    if (store_) return true;
    try {
        std::error_code error;
        auto dir = config_.state_dir.empty() ? store::default_state_dir() : std::filesystem::path(config_.state_dir);
        return std::filesystem::exists(dir / "store.id", error);
    } catch (const std::exception&) {
        return false;
    }
}

std::vector<store::SavedSandbox> Keeper::records() {
    const auto& s = store();
    std::vector<store::SavedSandbox> out;
    for (const auto& key : s.keys(store::sandboxes)) {
        auto text = s.read(store::sandboxes, key);
        if (!text) continue;  // removed meanwhile
        try {
            out.push_back(store::saved_sandbox_from_json(*text));
        } catch (const std::exception& e) {
            log::warning("skipping the record {} in {}: {}", key, s.dir().string(), e.what());
        }
    }
    return out;
}

void Keeper::write(const store::SavedSandbox& saved) {
    try {
        store().write(store::sandboxes, saved.sandbox_id, store::to_json(saved));
    } catch (const std::runtime_error& e) {
        throw ToolError(fmt::format("cannot record the persistent sandbox {}: {}", saved.sandbox_id, e.what()));
    }
}

asio::awaitable<std::optional<store::SavedSandbox>> Keeper::take(std::string owner, std::string name) {
    for (const auto& saved : records()) {
        if (saved.owner != owner || saved.name != name) continue;
        auto hold = store().try_hold(store::sandboxes, saved.sandbox_id);
        if (!hold) {
            throw ToolError(fmt::format("the persistent sandbox '{}' is in use by another cubicle server on the same state "
                                        "directory ({}); stop it there first, or choose another name",
                                        name, store().dir().string()));
        }
        // Read again under the hold: the other server may have changed or removed it.
        auto text = store().read(store::sandboxes, saved.sandbox_id);
        if (!text) continue;
        auto current = store::saved_sandbox_from_json(*text);
        if (!(co_await docker_.inspect_volume(current.volume))) {
            store().remove(store::sandboxes, current.sandbox_id);
            throw ToolError(fmt::format("the files of the persistent sandbox '{}' are gone: its volume {} was removed outside "
                                        "cubicle. Its record is removed; call initialize_sandbox again to start it afresh",
                                        name, current.volume));
        }
        current.last_used = now_s();
        current.ended.clear();
        write(current);
        auto& entry = held_[current.sandbox_id];
        entry.saved = current;
        entry.hold = std::move(hold);
        co_return current;
    }
    co_return std::nullopt;
}

std::optional<store::SavedSandbox> Keeper::take_by_id(const std::string& owner, const std::string& sandbox_id) {
    if (held_.count(sandbox_id)) return std::nullopt;
    const auto& s = store();
    std::optional<std::string> text;
    try {
        text = s.read(store::sandboxes, sandbox_id);
    } catch (const std::invalid_argument&) {
        return std::nullopt;  // not an id of ours at all
    }
    if (!text) return std::nullopt;
    auto saved = store::saved_sandbox_from_json(*text);
    if (saved.owner != owner) return std::nullopt;
    auto hold = s.try_hold(store::sandboxes, sandbox_id);
    if (!hold) {
        throw ToolError(fmt::format("the persistent sandbox '{}' is in use by another cubicle server on the same state directory",
                                    saved.name));
    }
    auto& entry = held_[sandbox_id];
    entry.saved = saved;
    entry.hold = std::move(hold);
    return saved;
}

std::string Keeper::volume_config(const store::SavedSandbox& saved) {
    json::Writer w;
    w.begin_object().field("Name", saved.volume).field("Driver", "local");
    w.key("Labels").begin_object().field(label_managed, "true").field(label_store, store().id());
    w.field(label_sandbox, saved.sandbox_id).field(label_persistent, "true").end_object();
    w.end_object();
    return w.take();
}

asio::awaitable<store::SavedSandbox> Keeper::make(store::SavedSandbox saved) {
    saved.volume = "cubicle-ws-" + saved.sandbox_id;
    saved.created = saved.last_used = now_s();
    auto hold = store().try_hold(store::sandboxes, saved.sandbox_id);
    if (!hold) throw ToolError("a new persistent sandbox's record is held by another process; try again");
    // The record first: a server that dies from here on leaves something the next one finds.
    write(saved);
    auto config = volume_config(saved);
    try {
        co_await docker_.create_volume(std::move(config));
    } catch (...) {
        store().remove(store::sandboxes, saved.sandbox_id);
        throw;
    }
    auto& entry = held_[saved.sandbox_id];
    entry.saved = saved;
    entry.hold = std::move(hold);
    co_return saved;
}

const store::SavedSandbox* Keeper::held(const std::string& sandbox_id) const {
    auto it = held_.find(sandbox_id);
    return it == held_.end() ? nullptr : &it->second.saved;
}

void Keeper::save(const std::string& sandbox_id, std::optional<std::uint64_t> size_bytes, const std::string& reason) {
    auto it = held_.find(sandbox_id);
    if (it == held_.end()) return;
    auto& saved = it->second.saved;
    if (size_bytes) saved.size_bytes = *size_bytes;
    saved.last_used = now_s();
    saved.ended = reason;
    try {
        write(saved);
    } catch (const std::exception& e) {
        log::error("saving the persistent sandbox {}: {}", sandbox_id, e.what());
    }
}

void Keeper::release(const std::string& sandbox_id) {
    held_.erase(sandbox_id);
}

asio::awaitable<void> Keeper::erase(std::string sandbox_id) {
    auto it = held_.find(sandbox_id);
    if (it == held_.end()) co_return;
    auto volume = it->second.saved.volume;
    // The volume first: a record without its volume is found broken and removed, a volume
    // without a record would be lost from sight.
    co_await docker_.remove_volume(std::move(volume));
    store().remove(store::sandboxes, sandbox_id);
    held_.erase(sandbox_id);
}

std::vector<Keeper::Listed> Keeper::list(const std::string& owner) {
    std::vector<Listed> out;
    if (!exists()) return out;
    for (auto& saved : records()) {
        if (saved.owner != owner || held_.count(saved.sandbox_id)) continue;
        bool elsewhere = store().held(store::sandboxes, saved.sandbox_id);
        out.push_back({std::move(saved), elsewhere});
    }
    return out;
}

asio::awaitable<void> Keeper::retain(std::string owner) {
    try {
        std::map<std::string, std::vector<store::SavedSandbox>> by_owner;
        for (auto& saved : records()) {
            if (!owner.empty() && saved.owner != owner) continue;
            if (held_.count(saved.sandbox_id) || store().held(store::sandboxes, saved.sandbox_id)) continue;
            by_owner[saved.owner].push_back(std::move(saved));
        }
        store::Retention rules{static_cast<std::size_t>(config_.max_saved_sandboxes),
                               static_cast<std::int64_t>(config_.saved_ttl_days) * 86400,
                               static_cast<std::uint64_t>(config_.max_saved_mb) << 20};
        for (auto& [who, saved] : by_owner) {
            for (const auto& id : store::expired(saved, rules, now_s())) {
                if (!take_by_id(who, id)) continue;
                log::info("removing the saved sandbox {} of {} (retention: --max-saved-sandboxes, --saved-ttl-days, --max-saved-mb)",
                          id, who);
                co_await erase(id);
            }
        }
    } catch (const std::exception& e) {
        log::warning("applying the retention of saved sandboxes: {}", e.what());
    }
}

} // namespace cubicle::sandbox
