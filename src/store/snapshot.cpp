#include "store/snapshot.hpp"

#include <algorithm>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

#include "common/json.hpp"
#include "store/fields.hpp"

namespace cubicle::store {

std::string to_json(const Snapshot& snapshot) {
    json::Writer w;
    w.begin_object().field("version", record_version).field("snapshot_id", snapshot.snapshot_id).field("name", snapshot.name);
    w.field("owner", snapshot.owner).field("source_sandbox_id", snapshot.source_sandbox_id).key("spec");
    write_spec(w, snapshot.spec);
    w.field("stateful", snapshot.stateful).field("auto_install", snapshot.auto_install);
    w.field("created_ms", snapshot.created_ms).field("size_bytes", snapshot.size_bytes).field("complete", snapshot.complete);
    w.end_object();
    return w.take() + "\n";
}

Snapshot snapshot_from_json(std::string_view text) {
    json::Document document;
    auto root = record_root(document, text);
    Snapshot snapshot;
    snapshot.snapshot_id = string_of(root, "snapshot_id");
    snapshot.name = string_of(root, "name");
    snapshot.owner = string_of(root, "owner");
    snapshot.source_sandbox_id = string_of(root, "source_sandbox_id");
    simdjson::dom::element spec;
    if (root["spec"].get(spec) != simdjson::SUCCESS) throw std::runtime_error("the snapshot record has no spec");
    snapshot.spec = read_spec(spec);
    snapshot.stateful = flag_of(root, "stateful");
    snapshot.auto_install = flag_of(root, "auto_install");
    snapshot.created_ms = number_of<std::int64_t>(root, "created_ms");
    snapshot.size_bytes = number_of<std::uint64_t>(root, "size_bytes");
    snapshot.complete = flag_of(root, "complete");
    return snapshot;
}

std::optional<std::string> invalid_snapshot_name(std::string_view name) {
    if (name.size() > 64) return "a snapshot name has at most 64 characters";
    for (char c : name) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == ' ' || c == '.' || c == '_' || c == '-';
        if (!ok) return fmt::format("a snapshot name has only letters, digits, spaces, '.', '_' and '-' (not '{}')", c);
    }
    return std::nullopt;
}

std::vector<Snapshot> snapshot_records(const Store& store, std::vector<std::string>* broken) {
    std::vector<Snapshot> out;
    for (const auto& key : store.keys(snapshots)) {
        auto text = store.read(snapshots, key);
        if (!text) continue;  // removed meanwhile
        try {
            out.push_back(snapshot_from_json(*text));
        } catch (const std::exception&) {
            if (broken) broken->push_back(key);
        }
    }
    return out;
}

Expired expired_together(std::vector<SavedSandbox> saved, std::vector<Snapshot> snapshots, const Retention& rules, std::int64_t now,
                         std::string_view keep) {
    struct Item {
        std::int64_t time;
        std::uint64_t bytes;
        bool snapshot;
        std::string id;
    };
    std::vector<Item> items;
    // In milliseconds: a saved sandbox's last use is kept in seconds, a snapshot's creation finer.
    for (auto& one : saved) items.push_back({one.last_used * 1000, one.size_bytes, false, std::move(one.sandbox_id)});
    for (auto& one : snapshots) items.push_back({one.created_ms, one.size_bytes, true, std::move(one.snapshot_id)});
    // Newest first (`keep` before all): what is kept of each kind is a prefix. Ties (saves
    // within one second) go by id, so that every server decides alike.
    std::sort(items.begin(), items.end(), [keep](const Item& a, const Item& b) {
        return std::tuple(a.id == keep, a.time, a.id) > std::tuple(b.id == keep, b.time, b.id);
    });
    Expired out;
    std::size_t kept[2] = {0, 0};
    bool full[2] = {false, false};  // once one is past its kind's count, every older one of that kind is too
    bool over_bytes = false;        // once the bytes are past, every older one is too
    std::uint64_t bytes = 0;
    for (auto& item : items) {
        auto kind = item.snapshot ? 1 : 0;
        std::size_t most = item.snapshot ? rules.most_snapshots : rules.most_saved;
        bool stale = rules.ttl_s > 0 && now * 1000 - item.time > rules.ttl_s * 1000 && item.id != keep;
        bool newest = kept[kind] == 0;
        full[kind] = full[kind] || (!newest && kept[kind] >= most);
        over_bytes = over_bytes || (!newest && rules.most_bytes > 0 && bytes + item.bytes > rules.most_bytes);
        if (stale || (!newest && (full[kind] || over_bytes))) {
            (item.snapshot ? out.snapshots : out.sandboxes).push_back(std::move(item.id));
            continue;
        }
        ++kept[kind];
        bytes += item.bytes;
    }
    return out;
}

} // namespace cubicle::store
