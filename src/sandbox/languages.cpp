#include "sandbox/languages.hpp"

#include <array>

#include "sandbox/policy.hpp"

namespace cubicle::sandbox {
namespace {

struct Alias {
    std::string_view name;
    std::string_view language;
};

constexpr std::array aliases{
    Alias{"python", "python"}, Alias{"python3", "python"}, Alias{"py", "python"},
    Alias{"javascript", "javascript"}, Alias{"node", "javascript"}, Alias{"js", "javascript"},
    Alias{"bash", "bash"}, Alias{"sh", "bash"}, Alias{"shell", "bash"},
};

// Beyond this, code no longer fits one argv string (MAX_ARG_STRLEN is 128 KiB).
constexpr std::size_t max_argv_code = 100 * 1024;

} // namespace

std::optional<std::string_view> canonical_language(std::string_view name) {
    for (const auto& alias : aliases) {
        if (alias.name == name) return alias.language;
    }
    return std::nullopt;
}

std::string_view language_list() { return "python (python3, py), javascript (node, js), bash (sh, shell)"; }

agent::RunRequest program_for(std::string_view language, std::string code) {
    agent::RunRequest request;
    if (language == "python") {
        // Python and Node read the whole program from stdin before running it.
        request.argv = {"python3", "-u", "-"};
        request.stdin_data = std::move(code);
    } else if (language == "javascript") {
        request.argv = {"node", "-"};
        request.stdin_data = std::move(code);
    } else if (code.size() <= max_argv_code) {
        // Bash reads stdin as it goes, so a script reading stdin would eat itself: pass it as an argument.
        request.argv = {"bash", "-c", std::move(code)};
    } else {
        request.argv = {"bash", "-c", "f=$(mktemp) && cat > \"$f\" && exec bash \"$f\" </dev/null"};
        request.stdin_data = std::move(code);
    }
    return request;
}

namespace {

// Runs cells in one namespace. User code gets /dev/null as stdin (the cell
// stream stays private), a final bare expression is echoed like a REPL,
// tracebacks start at the user's code, and processes a cell forks end with it.
constexpr std::string_view python_driver = R"PY(
import ast, importlib, os, site, struct, sys, traceback
def _cubicle():
    cells = os.fdopen(os.dup(0), 'rb', buffering=0)
    null = os.open(os.devnull, os.O_RDONLY); os.dup2(null, 0); os.close(null)
    sys.stdin = open(os.devnull)
    control = os.fdopen(3, 'wb', buffering=0)
    namespace = {'__name__': '__main__', '__builtins__': __builtins__}
    interpreter = os.getpid()
    def read(n):
        data = b''
        while len(data) < n:
            chunk = cells.read(n - len(data))
            if not chunk: return None
            data += chunk
        return data
    while True:
        header = read(5)
        if header is None: return
        size, flags = struct.unpack('>IB', header)
        code = read(size).decode('utf-8', 'replace')
        status = 0
        user_site = site.getusersitepackages()  # packages installed since start-up become importable
        if user_site not in sys.path and os.path.isdir(user_site):
            site.addsitedir(user_site)
            importlib.invalidate_caches()
        try:
            tree = ast.parse(code, '<cell>', 'exec')
            last = None
            if flags & 1 and tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, '<cell>', 'exec'), namespace)
            if last is not None:
                value = eval(compile(last, '<cell>', 'eval'), namespace)
                if value is not None: print(repr(value))
        except SystemExit as e:
            if isinstance(e.code, int): status = e.code
            elif e.code is not None: print(e.code, file=sys.stderr); status = 1
        except BaseException as e:
            traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
            status = 1
        for stream in (sys.stdout, sys.stderr):
            try: stream.flush()
            except Exception: pass
        if os.getpid() != interpreter:
            os._exit(status)  # a child the cell forked must not read the next cells
        control.write(b'%d\n' % status)
_cubicle()
)PY";

constexpr std::string_view node_driver = R"JS(
const vm = require('vm'), fs = require('fs'), util = require('util');
globalThis.require = require;
let pending = Buffer.alloc(0), queue = Promise.resolve();
async function run(code, echo) {
  let status = 0;
  try {
    let value = vm.runInThisContext(code, { filename: '<cell>' });
    if (value && typeof value.then === 'function') value = await value;
    if (echo && value !== undefined) console.log(util.inspect(value));
  } catch (e) {
    console.error(e && e.stack ? e.stack : String(e));
    status = 1;
  }
  fs.writeSync(3, status + '\n');
}
process.stdin.on('data', (chunk) => {
  pending = Buffer.concat([pending, chunk]);
  while (pending.length >= 5 && pending.length >= 5 + pending.readUInt32BE(0)) {
    const size = pending.readUInt32BE(0), echo = (pending[4] & 1) === 1;
    const code = pending.subarray(5, 5 + size).toString('utf8');
    pending = pending.subarray(5 + size);
    queue = queue.then(() => run(code, echo));
  }
});
process.stdin.on('end', () => queue.then(() => process.exit(0)));
)JS";

} // namespace

bool has_interpreter(std::string_view language) { return language == "python" || language == "javascript"; }

agent::RunRequest interpreter_for(std::string_view language) {
    agent::RunRequest request;
    if (language == "python") {
        request.argv = {"python3", "-u", "-c", std::string(python_driver)};
    } else {
        request.argv = {"node", "-e", std::string(node_driver)};
    }
    return request;
}

std::string encode_cell(std::string_view code, bool echo) {
    auto n = static_cast<std::uint32_t>(code.size());
    std::string out{static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8), static_cast<char>(n),
                    static_cast<char>(echo ? 1 : 0)};
    out += code;
    return out;
}

agent::RunRequest shell_command(std::string command) {
    agent::RunRequest request;
    request.argv = {"/bin/sh", "-c", std::move(command)};
    return request;
}

} // namespace cubicle::sandbox
