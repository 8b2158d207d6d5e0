// Keeps persistent sandboxes between servers: their records in the store
// (store/), the holds that keep two servers from using one at once, and the
// named volumes that hold their workspaces. The Manager starts and removes
// their containers; this room knows what outlives them.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "config.hpp"
#include "docker/client.hpp"
#include "store/saved.hpp"
#include "store/store.hpp"

namespace cubicle::sandbox {

namespace asio = boost::asio;

inline constexpr const char* label_store = "io.cubicle.store";
inline constexpr const char* label_persistent = "io.cubicle.persistent";

class Keeper {
public:
    Keeper(docker::Client& docker, const Config& config);

    // The engine the server talks to (/info ID): records of another engine's volumes
    // (a store shared by a server on Podman and one on Docker) are left alone.
    void set_engine(std::string id) { engine_ = std::move(id); }

    // `owner`'s persistent sandbox called `name`, held by this server from now on: the
    // saved one (`created` false, last used now), or else `fresh`, recorded (`created`).
    // Decided under the store's lock, so two servers never make two of one name. Throws
    // ToolError when another server, or this one, is using or changing it.
    struct Claim {
        store::SavedSandbox saved;
        bool created = false;
    };
    Claim claim(const std::string& owner, const std::string& name, store::SavedSandbox fresh);
    // Makes the workspace volume of a record `claim` created.
    asio::awaitable<void> make_volume(store::SavedSandbox saved);
    // Whether a claimed record's volume is still there; when not, the record goes.
    asio::awaitable<bool> volume_exists(store::SavedSandbox saved);
    // `owner`'s saved sandbox `sandbox_id` (not in use here), held from now on; nullopt
    // when there is none. Throws ToolError when another server uses it.
    std::optional<store::SavedSandbox> take_by_id(const std::string& owner, const std::string& sandbox_id);

    // Whether this server holds `sandbox_id` as a persistent sandbox, and its record.
    const store::SavedSandbox* held(const std::string& sandbox_id) const;
    // Whether `owner`'s sandbox `name` is being saved here (its last copy under way).
    bool saving(const std::string& owner, const std::string& name) const;
    // Saves the record of a sandbox this server holds: its size, why, when; from then on it
    // is listed as saved. The hold stays until `release` (its container must be gone and its
    // last copy made first: another server may then start it).
    void save(const std::string& sandbox_id, std::optional<std::uint64_t> size_bytes, const std::string& reason);
    void release(const std::string& sandbox_id);
    // Removes a held sandbox for good: its volume, then its record; released either way.
    asio::awaitable<void> erase(std::string sandbox_id);
    // Marks the sandboxes this server holds as used now, so that a server that dies
    // without saving them does not leave them looking long unused.
    void refresh();

    // `owner`'s persistent sandboxes that no process of this server uses (saved, or in
    // use by another server: `elsewhere`).
    struct Listed {
        store::SavedSandbox saved;
        bool elsewhere = false;
    };
    std::vector<Listed> list(const std::string& owner);
    // Removes `owner`'s (a principal's) saved sandboxes and snapshots past
    // --max-saved-sandboxes, --max-snapshots, --saved-ttl-days and --max-saved-mb
    // (store::expired_together), `keep` aside, and snapshots whose taking a dead server
    // left unfinished; every principal of this server's transport when `owner` is empty.
    // Never throws.
    asio::awaitable<void> retain(std::string owner, std::string keep);

    // The owner records keep for a principal: principals of stdio and HTTP never meet
    // ("local" over HTTP is not stdio's user).
    std::string qualified(const std::string& owner) const { return config_.transport + ":" + owner; }
    std::string principal_of(const std::string& qualified_owner) const { return qualified_owner.substr(qualified("").size()); }

    // The store, opened on first use. Throws ToolError naming the directory when it cannot be.
    const store::Store& store();
    // Whether there is a store (a server that never kept a sandbox does not create one).
    bool exists() const;

private:
    struct Held {
        store::SavedSandbox saved;
        std::unique_ptr<store::Hold> hold;
        bool saving = false;  // saved: its container is going or gone, its last copy under way
    };
    // Every record of this engine in the store that parses; a broken one is logged and skipped.
    std::vector<store::SavedSandbox> records();
    std::optional<store::SavedSandbox> record(const std::string& sandbox_id);
    void write(const store::SavedSandbox& saved);
    std::string volume_config(const store::SavedSandbox& saved);

    docker::Client& docker_;
    const Config& config_;
    std::string engine_;
    std::unique_ptr<store::Store> store_;
    std::map<std::string, Held> held_;  // by sandbox id
};

} // namespace cubicle::sandbox
