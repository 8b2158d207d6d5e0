#include "sandbox/keeper.hpp"

#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include "common/errors.hpp"
#include "common/json.hpp"
#include "common/log.hpp"
#include "sandbox/policy.hpp"
#include "store/snapshot.hpp"

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
        try {
            auto text = s.read(store::sandboxes, key);
            if (!text) continue;  // removed meanwhile
            auto saved = store::saved_sandbox_from_json(*text);
            if (saved.sandbox_id != key) throw std::runtime_error("its sandbox_id is not its file's name");
            // Another engine's volume: not ours to resume, measure or remove.
            if (!engine_.empty() && !saved.engine.empty() && saved.engine != engine_) continue;
            out.push_back(std::move(saved));
        } catch (const std::exception& e) {
            log::warning("skipping the record {} in {}: {}", key, s.dir().string(), e.what());
        }
    }
    return out;
}

std::optional<store::SavedSandbox> Keeper::record(const std::string& sandbox_id) {
    for (auto& saved : records()) {
        if (saved.sandbox_id == sandbox_id) return std::move(saved);
    }
    return std::nullopt;
}

void Keeper::write(const store::SavedSandbox& saved) {
    try {
        store().write(store::sandboxes, saved.sandbox_id, store::to_json(saved));
    } catch (const std::runtime_error& e) {
        throw ToolError(fmt::format("cannot record the persistent sandbox {}: {}", saved.sandbox_id, e.what()));
    }
}

Keeper::Claim Keeper::claim(const std::string& owner, const std::string& name, store::SavedSandbox fresh) {
    auto whole = store().lock_all();
    auto who = qualified(owner);
    for (auto& saved : records()) {
        if (saved.owner != who || saved.name != name) continue;
        if (held_.count(saved.sandbox_id)) {
            throw ToolError(fmt::format("the persistent sandbox '{}' is being started or stopped by another call; try again", name));
        }
        auto hold = store().try_hold(store::sandboxes, saved.sandbox_id);
        if (!hold) {
            throw ToolError(fmt::format("the persistent sandbox '{}' is in use by another cubicle server on the same state "
                                        "directory ({}); stop it there first, or choose another name",
                                        name, store().dir().string()));
        }
        saved.last_used = now_s();
        saved.ended.clear();
        write(saved);
        held_[saved.sandbox_id] = Held{saved, std::move(hold)};
        return {std::move(saved), false};
    }
    fresh.owner = who;
    fresh.name = name;
    fresh.engine = engine_;
    fresh.volume = store::volume_of(fresh.sandbox_id);
    fresh.created = fresh.last_used = now_s();
    auto hold = store().try_hold(store::sandboxes, fresh.sandbox_id);
    if (!hold) throw ToolError("a new persistent sandbox's record is held by another process; try again");
    // The record first: a server that dies from here on leaves something the next one finds.
    write(fresh);
    held_[fresh.sandbox_id] = Held{fresh, std::move(hold)};
    return {std::move(fresh), true};
}

std::string Keeper::volume_config(const store::SavedSandbox& saved) {
    json::Writer w;
    w.begin_object().field("Name", saved.volume).field("Driver", "local");
    w.key("Labels").begin_object().field(label_managed, "true").field(label_store, store().id());
    w.field(label_sandbox, saved.sandbox_id).field(label_persistent, "true").end_object();
    w.end_object();
    return w.take();
}

asio::awaitable<void> Keeper::make_volume(store::SavedSandbox saved) {
    auto config = volume_config(saved);
    co_await docker_.create_volume(std::move(config));
}

asio::awaitable<bool> Keeper::volume_exists(store::SavedSandbox saved) {
    auto volume = co_await docker_.inspect_volume(saved.volume);
    // Only a volume this store made is the sandbox's files.
    if (volume && volume->labels[label_store] == store().id() && volume->labels[label_sandbox] == saved.sandbox_id) co_return true;
    if (volume) {
        throw ToolError(fmt::format("the volume {} of the persistent sandbox '{}' was not made by this store; it is left alone",
                                    saved.volume, saved.name));
    }
    store().remove(store::sandboxes, saved.sandbox_id);
    held_.erase(saved.sandbox_id);
    co_return false;
}

std::optional<store::SavedSandbox> Keeper::take_by_id(const std::string& owner, const std::string& sandbox_id) {
    if (held_.count(sandbox_id)) return std::nullopt;
    auto found = record(sandbox_id);
    if (!found || found->owner != qualified(owner)) return std::nullopt;
    auto hold = store().try_hold(store::sandboxes, sandbox_id);
    if (!hold) {
        throw ToolError(fmt::format("the persistent sandbox '{}' is in use by another cubicle server on the same state directory",
                                    found->name));
    }
    // Read again under the hold: another server may have used it meanwhile.
    auto current = record(sandbox_id);
    if (!current || current->owner != qualified(owner)) return std::nullopt;
    held_[sandbox_id] = Held{*current, std::move(hold)};
    return current;
}

bool Keeper::saving(const std::string& owner, const std::string& name) const {
    auto who = qualified(owner);
    for (const auto& [id, entry] : held_) {
        if (entry.saving && entry.saved.owner == who && entry.saved.name == name) return true;
    }
    return false;
}

const store::SavedSandbox* Keeper::held(const std::string& sandbox_id) const {
    auto it = held_.find(sandbox_id);
    return it == held_.end() ? nullptr : &it->second.saved;
}

void Keeper::save(const std::string& sandbox_id, std::optional<std::uint64_t> size_bytes, const std::string& reason) {
    auto it = held_.find(sandbox_id);
    if (it == held_.end()) return;
    it->second.saving = true;
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
    std::exception_ptr failure;
    try {
        // The volume first: a record without its volume is found broken and removed, a
        // volume without a record would be lost from sight.
        co_await docker_.remove_volume(std::move(volume));
        store().remove(store::sandboxes, sandbox_id);
    } catch (...) {
        failure = std::current_exception();
    }
    held_.erase(sandbox_id);
    if (failure) std::rethrow_exception(failure);
}

void Keeper::refresh() {
    auto now = now_s();
    for (auto& [id, entry] : held_) {
        entry.saved.last_used = now;
        try {
            write(entry.saved);
        } catch (const std::exception& e) {
            log::warning("{}", e.what());
        }
    }
}

std::vector<Keeper::Listed> Keeper::list(const std::string& owner) {
    std::vector<Listed> out;
    if (!exists()) return out;
    for (auto& saved : records()) {
        if (saved.owner != qualified(owner)) continue;
        auto here = held_.find(saved.sandbox_id);
        if (here != held_.end() && !here->second.saving) continue;  // live: listed as a sandbox
        bool elsewhere = here == held_.end() && store().held(store::sandboxes, saved.sandbox_id);
        out.push_back({std::move(saved), elsewhere});
    }
    return out;
}

asio::awaitable<void> Keeper::retain(std::string owner, std::string keep) {
    // Saved sandboxes and snapshots are weighed together (store::expired_together).
    struct Owned {
        std::vector<store::SavedSandbox> saved;
        std::vector<store::Snapshot> snapshots;
    };
    std::map<std::string, Owned> by_owner;
    auto ours = [&](const std::string& record_owner) {
        return owner.empty() ? record_owner.starts_with(qualified("")) : record_owner == qualified(owner);
    };
    try {
        for (auto& saved : records()) {
            if (!ours(saved.owner) || held_.count(saved.sandbox_id) || store().held(store::sandboxes, saved.sandbox_id)) continue;
            by_owner[saved.owner].saved.push_back(std::move(saved));
        }
        for (auto& snapshot : store::snapshot_records(store())) {
            if (!ours(snapshot.owner) || store().held(store::snapshots, snapshot.snapshot_id)) continue;  // being taken or removed
            if (!snapshot.complete) {
                // Its server died while taking it: nothing of it is usable.
                store().remove(store::snapshots, snapshot.snapshot_id);
                continue;
            }
            by_owner[snapshot.owner].snapshots.push_back(std::move(snapshot));
        }
    } catch (const std::exception& e) {
        log::warning("reading saved sandboxes and snapshots for retention: {}", e.what());
        co_return;
    }
    store::Retention rules{static_cast<std::size_t>(config_.max_saved_sandboxes),
                           static_cast<std::int64_t>(config_.saved_ttl_days) * 86400,
                           static_cast<std::uint64_t>(config_.max_saved_mb) << 20,
                           static_cast<std::size_t>(config_.max_snapshots)};
    for (auto& [who, owned] : by_owner) {
        auto principal = principal_of(who);
        auto before = owned.saved;
        auto expired = store::expired_together(std::move(owned.saved), std::move(owned.snapshots), rules, now_s(), keep);
        for (const auto& id : expired.sandboxes) {
            try {
                // Taken, and decided again on what is current under the hold.
                auto current = take_by_id(principal, id);
                if (!current) continue;
                auto was = std::find_if(before.begin(), before.end(), [&](const auto& s) { return s.sandbox_id == id; });
                if (was != before.end() && current->last_used != was->last_used) {
                    release(id);
                    continue;
                }
                log::info("removing the saved sandbox {} of {} (retention: --max-saved-sandboxes, --saved-ttl-days, --max-saved-mb)",
                          id, who);
                co_await erase(id);
            } catch (const std::exception& e) {
                log::warning("removing the saved sandbox {}: {}", id, e.what());
            }
        }
        for (const auto& id : expired.snapshots) {
            try {
                auto hold = store().try_hold(store::snapshots, id);
                if (!hold) continue;
                log::info("removing the snapshot {} of {} (retention: --max-snapshots, --saved-ttl-days, --max-saved-mb)", id, who);
                store().remove(store::snapshots, id);
            } catch (const std::exception& e) {
                log::warning("removing the snapshot {}: {}", id, e.what());
            }
        }
    }
}

} // namespace cubicle::sandbox
