#include "sandbox/checkpoints.hpp"

#include <algorithm>

namespace cubicle::sandbox {

std::vector<Checkpoint> Checkpoints::add(Checkpoint checkpoint, std::size_t max) {
    list_.push_back(std::move(checkpoint));
    std::vector<Checkpoint> dropped;
    while (list_.size() > std::max<std::size_t>(max, 1)) {
        dropped.push_back(std::move(list_.front()));
        list_.erase(list_.begin());
    }
    return dropped;
}

void Checkpoints::forget_unless(const std::function<bool(const Checkpoint&)>& live) {
    std::erase_if(list_, [&](const Checkpoint& c) { return !live(c); });
}

const Checkpoint* Checkpoints::find(std::string_view id) const {
    auto it = std::ranges::find(list_, id, &Checkpoint::id);
    return it == list_.end() ? nullptr : &*it;
}

void Checkpoints::replace_pid(std::string_view id, int pid) {
    auto it = std::ranges::find(list_, id, &Checkpoint::id);
    if (it == list_.end()) return;
    if (pid > 0) {
        it->pid = pid;
    } else {
        list_.erase(it);
    }
}

void Checkpoints::set_files(std::string_view id) {
    auto it = std::ranges::find(list_, id, &Checkpoint::id);
    if (it != list_.end()) it->files = true;
}

} // namespace cubicle::sandbox
