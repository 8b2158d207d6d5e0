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

    // `owner`'s saved sandbox called `name`, held by this server from now on (last
    // used now); nullopt when there is none. Throws ToolError when another server uses it,
    // or when its files are gone.
    asio::awaitable<std::optional<store::SavedSandbox>> take(std::string owner, std::string name);
    // `owner`'s saved sandbox `sandbox_id` (not in use here), held from now on; nullopt
    // when there is none.
    std::optional<store::SavedSandbox> take_by_id(const std::string& owner, const std::string& sandbox_id);
    // A new persistent sandbox: its record and its workspace's volume, held by this server.
    asio::awaitable<store::SavedSandbox> make(store::SavedSandbox saved);

    // Whether this server holds `sandbox_id` as a persistent sandbox, and its record.
    const store::SavedSandbox* held(const std::string& sandbox_id) const;
    // Saves the record of a sandbox this server holds: its size, why, when. The hold stays
    // until `release` (its container must be gone first: another server may then start it).
    void save(const std::string& sandbox_id, std::optional<std::uint64_t> size_bytes, const std::string& reason);
    void release(const std::string& sandbox_id);
    // Removes a held sandbox for good: its volume, then its record.
    asio::awaitable<void> erase(std::string sandbox_id);

    // `owner`'s persistent sandboxes that no process of this server uses (saved, or in
    // use by another server: `elsewhere`).
    struct Listed {
        store::SavedSandbox saved;
        bool elsewhere = false;
    };
    std::vector<Listed> list(const std::string& owner);
    // Removes `owner`'s saved sandboxes past --max-saved-sandboxes, --saved-ttl-days and
    // --max-saved-mb (store::expired); all owners' when `owner` is empty. Never throws.
    asio::awaitable<void> retain(std::string owner);

    // The store, opened on first use. Throws ToolError naming the directory when it cannot be.
    const store::Store& store();
    // Whether there is a store (a server that never kept a sandbox does not create one).
    bool exists() const;

private:
    struct Held {
        store::SavedSandbox saved;
        std::unique_ptr<store::Hold> hold;
    };
    // Every record in the store that parses; a broken one is logged and skipped.
    std::vector<store::SavedSandbox> records();
    void write(const store::SavedSandbox& saved);
    std::string volume_config(const store::SavedSandbox& saved);

    docker::Client& docker_;
    const Config& config_;
    std::unique_ptr<store::Store> store_;
    std::map<std::string, Held> held_;  // by sandbox id
};

} // namespace cubicle::sandbox
