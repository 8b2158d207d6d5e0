#include "sandbox/owner.hpp"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace cubicle::sandbox {
namespace {

constexpr std::string_view record_version = "v1";

std::string first_line(const std::string& path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
}

std::string machine_id() {
    auto id = first_line("/etc/machine-id");
    return id.empty() ? first_line("/var/lib/dbus/machine-id") : id;
}

std::string hostname() {
    std::array<char, 256> name{};
    if (gethostname(name.data(), name.size() - 1) != 0) return {};
    return name.data();
}

std::string boot_id() { return first_line("/proc/sys/kernel/random/boot_id"); }

// "pid:[4026531836]" -> "4026531836": pids are only comparable inside one namespace.
std::string pid_namespace() {
    std::array<char, 64> link{};
    auto n = readlink("/proc/self/ns/pid", link.data(), link.size() - 1);
    if (n <= 0) return {};
    std::string_view text(link.data(), static_cast<std::size_t>(n));
    auto open = text.find('['), close = text.find(']');
    if (open == text.npos || close == text.npos || close < open) return {};
    return std::string(text.substr(open + 1, close - open - 1));
}

// Field 22 of /proc/<pid>/stat, in clock ticks since boot: with the pid, it
// names one process for the whole boot (a reused pid has another start time).
std::optional<std::string> start_time(int pid) {
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string stat;
    if (!std::getline(in, stat)) return std::nullopt;
    auto comm_end = stat.rfind(')');  // the command name may hold spaces and parentheses
    if (comm_end == std::string::npos) return std::nullopt;
    std::istringstream fields(stat.substr(comm_end + 1));
    std::string field;
    for (int index = 3; fields >> field; ++index) {
        if (index == 22) return field;
    }
    return std::nullopt;
}

std::vector<std::string_view> split(std::string_view text, char separator) {
    std::vector<std::string_view> parts;
    for (std::size_t start = 0;;) {
        auto end = text.find(separator, start);
        parts.push_back(text.substr(start, end == text.npos ? text.npos : end - start));
        if (end == text.npos) return parts;
        start = end + 1;
    }
}

} // namespace

std::string owner_record_of(int pid) {
    auto started = start_time(pid);
    if (!started) return {};
    return fmt::format("{}/{}/{}/{}/{}/{}/{}", record_version, machine_id(), hostname(), boot_id(), pid_namespace(), pid, *started);
}

const std::string& owner_record() {
    static const std::string record = owner_record_of(static_cast<int>(getpid()));
    return record;
}

OwnerState owner_state(std::string_view record) {
    auto fields = split(record, '/');
    if (fields.size() != 7 || fields[0] != record_version) return OwnerState::unknown;
    auto machine = fields[1], host = fields[2], boot = fields[3], pid_ns = fields[4], pid_text = fields[5];
    auto our_boot = boot_id();
    if (boot.empty() || our_boot.empty()) return OwnerState::unknown;
    if (boot != our_boot) {
        auto our_machine = machine_id();
        bool this_machine = !machine.empty() && machine == our_machine && host == hostname();
        return this_machine ? OwnerState::dead : OwnerState::unknown;
    }
    if (pid_ns.empty() || pid_ns != pid_namespace()) return OwnerState::unknown;
    int pid = 0;
    auto [end, ec] = std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
    if (ec != std::errc() || end != pid_text.data() + pid_text.size() || pid <= 0) return OwnerState::unknown;
    if (auto started = start_time(pid)) {
        return *started == fields[6] ? OwnerState::alive : OwnerState::dead;  // else the pid was reused
    }
    // /proc may hide other users' processes (hidepid); kill(2) still tells a missing one.
    return kill(pid, 0) != 0 && errno == ESRCH ? OwnerState::dead : OwnerState::unknown;
}

} // namespace cubicle::sandbox
