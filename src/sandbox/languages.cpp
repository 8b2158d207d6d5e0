#include "sandbox/languages.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <regex>

#include <boost/uuid/detail/sha1.hpp>
#include <fmt/format.h>

#include "sandbox/policy.hpp"

namespace cubicle::sandbox {
namespace {

constexpr std::array<std::string_view, 2> python_aliases{"python3", "py"};
constexpr std::array<std::string_view, 2> javascript_aliases{"node", "js"};
constexpr std::array<std::string_view, 2> bash_aliases{"sh", "shell"};
constexpr std::array<std::string_view, 1> typescript_aliases{"ts"};
constexpr std::array<std::string_view, 2> r_aliases{"rscript", "rlang"};
constexpr std::array<std::string_view, 1> ruby_aliases{"rb"};
constexpr std::array<std::string_view, 1> go_aliases{"golang"};
constexpr std::array<std::string_view, 1> c_aliases{"gcc"};
constexpr std::array<std::string_view, 3> cpp_aliases{"c++", "cxx", "g++"};
constexpr std::array<std::string_view, 0> java_aliases{};
constexpr std::array<std::string_view, 1> rust_aliases{"rs"};

// Compiles run in a scratch directory next to the build's own, with the source saved
// under source_file; the run command gets the finished directory as {dir}.
// Optimisation levels favour a short compile: these are snippets, not releases.
constexpr std::array language_table{
    Language{"python", python_aliases, "", "", "", "python3", "python3 --version", "python3", true, ".py",
             "numpy"},
    Language{"javascript", javascript_aliases, "", "", "", "node", "node --version", "nodejs", true, ".js"},
    Language{"bash", bash_aliases, "", "", "", "bash", "bash --version", "bash", false, ".sh"},
    // Debian has no @types/node: require, process and any imported module are typed `any`.
    Language{"typescript", typescript_aliases, "main.ts",
             "printf 'declare var require: any, process: any, module: any, exports: any, Buffer: any, __dirname: string, "
             "__filename: string;\\ndeclare module \"*\";\\n' > node.d.ts && "
             "tsc --pretty false --target es2020 --module commonjs --lib es2020,dom --outDir . main.ts node.d.ts",
             "node \"{dir}/main.js\"", "tsc", "tsc --version", "node-typescript nodejs", false, ".ts"},
    Language{"r", r_aliases, "main.R", "", "Rscript \"{dir}/main.R\"", "Rscript", "R --version", "r-base-core", true, ".R"},
    Language{"ruby", ruby_aliases, "main.rb", "", "ruby \"{dir}/main.rb\"", "ruby", "ruby --version", "ruby", true, ".rb"},
    Language{"go", go_aliases, "main.go", "go build -o prog main.go", "\"{dir}/prog\"", "go", "go version", "golang-go", false, ".go"},
    Language{"c", c_aliases, "main.c", "gcc -O1 -o prog main.c -lm", "\"{dir}/prog\"", "gcc", "gcc --version", "gcc libc6-dev", false, ".c"},
    Language{"cpp", cpp_aliases, "main.cpp", "g++ -std=c++20 -O1 -o prog main.cpp", "\"{dir}/prog\"", "g++", "g++ --version", "g++",
             false, ".cpp"},
    // Serial GC and the C1 compiler only: the JVM starts noticeably faster in a small container.
    Language{"java", java_aliases, "{class}.java",
             "javac -J-XX:+UseSerialGC -J-XX:TieredStopAtLevel=1 -encoding UTF-8 -d . \"{class}.java\"",
             "java -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp \"{dir}\" {class}", "javac", "javac -version",
             "default-jdk-headless", false, ".java"},
    Language{"rust", rust_aliases, "main.rs", "rustc --edition 2021 -C opt-level=1 -o prog main.rs", "\"{dir}/prog\"", "rustc",
             "rustc --version", "rustc", false, ".rs"},
};

// Beyond this, code no longer fits one argv string (MAX_ARG_STRLEN is 128 KiB).
constexpr std::size_t max_argv_code = 100 * 1024;

std::string replace_all(std::string text, std::string_view from, std::string_view to) {
    for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) text.replace(at, from.size(), to);
    return text;
}

// Java wants the file named after its public class; the class with main() is run.
std::string java_class(const std::string& code) {
    static const std::regex public_class(R"(public\s+(?:final\s+|abstract\s+)*class\s+([A-Za-z_$][A-Za-z0-9_$]*))");
    static const std::regex any_class(R"((?:^|\s)class\s+([A-Za-z_$][A-Za-z0-9_$]*))");
    std::smatch match;
    if (std::regex_search(code, match, public_class) || std::regex_search(code, match, any_class)) return match[1].str();
    return "Main";
}

std::string content_hash(std::string_view language, std::string_view code) {
    boost::uuids::detail::sha1 sha;
    sha.process_bytes(language.data(), language.size());
    sha.process_byte(0);
    sha.process_bytes(code.data(), code.size());
    boost::uuids::detail::sha1::digest_type digest;
    sha.get_digest(digest);
    std::string hex;
    for (auto word : digest) hex += fmt::format("{:08x}", word);
    return hex;
}

// $1 is the build directory. A finished build is marked by .built; a failed one leaves nothing
// behind, and the scratch directory of one killed at its timeout goes at the next build of the
// same code; of two concurrent builds of the same code the second one to finish is dropped.
constexpr std::string_view prepare_script = R"SH(d=$1
[ -f "$d/.built" ] && exit 0
rm -rf "$d".*
t="$d.$$"
mkdir -p "$t" && cd "$t" || exit 1
cat > '{file}'
{compile}
s=$?
if [ "$s" -ne 0 ]; then cd / && rm -rf "$t"; exit "$s"; fi
touch .built && cd .. && { mv -T "$t" "$d" 2>/dev/null || rm -rf "$t"; }
)SH";

} // namespace

std::span<const Language> languages() { return language_table; }

const Language* find_language(std::string_view name) {
    std::string lower(name);
    std::ranges::transform(lower, lower.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    for (const auto& language : language_table) {
        if (language.name == lower || std::ranges::find(language.aliases, lower) != language.aliases.end()) return &language;
    }
    return nullptr;
}

std::string language_list() {
    std::string out;
    for (const auto& language : language_table) {
        if (!out.empty()) out += ", ";
        out += language.name;
        if (!language.aliases.empty()) out += fmt::format(" ({})", fmt::join(language.aliases, ", "));
    }
    return out;
}

std::vector<std::string_view> language_names() {
    std::vector<std::string_view> names;
    for (const auto& language : language_table) {
        names.push_back(language.name);
        names.insert(names.end(), language.aliases.begin(), language.aliases.end());
    }
    return names;
}

agent::RunRequest program_for(const Language& language, std::string code) {
    agent::RunRequest request;
    if (language.name == "python") {
        // Python and Node read the whole program from stdin before running it.
        request.argv = {"python3", "-u", "-"};
        request.stdin_data = std::move(code);
        request.fork = true;
    } else if (language.name == "javascript") {
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

std::optional<agent::RunRequest> program_with_stdin(std::string_view language, std::string code) {
    if (code.size() > max_argv_code) return std::nullopt;
    agent::RunRequest request;
    if (language == "python") {
        request.argv = {"python3", "-u", "-c", std::move(code)};
    } else if (language == "javascript") {
        request.argv = {"node", "-e", std::move(code)};
    } else {
        request.argv = {"bash", "-c", std::move(code)};
    }
    return request;
}

Build build_for(const Language& language, std::string code, std::string_view workspace) {
    std::string java = language.name == "java" ? java_class(code) : std::string();
    auto fill = [&](std::string_view text, std::string_view dir) {
        return replace_all(replace_all(std::string(text), "{class}", java), "{dir}", dir);
    };
    Build build;
    build.dir = fmt::format("{}/.cubicle/build/{}-{}", workspace, language.name, content_hash(fill(language.compile, ""), code).substr(0, 24));
    // Go and Cargo keep caches under HOME by default; the workspace is the one place a
    // sandbox may write and execute. Go never reaches for the network.
    std::vector<std::string> env{fmt::format("GOCACHE={}/.cubicle/cache/go", workspace), fmt::format("GOPATH={}/.cubicle/go", workspace),
                                 "GOPROXY=off", fmt::format("CARGO_HOME={}/.cubicle/cargo", workspace)};
    std::string compile = language.compile.empty() ? std::string(":") : fill(language.compile, "");
    auto script = replace_all(replace_all(std::string(prepare_script), "{file}", fill(language.source_file, "")), "{compile}", compile);
    build.prepare.argv = {"/bin/sh", "-c", std::move(script), "sh", build.dir};
    build.prepare.stdin_data = std::move(code);
    build.prepare.env = env;
    build.run.argv = {"/bin/sh", "-c", "exec " + fill(language.run, build.dir)};
    build.run.env = std::move(env);
    return build;
}

namespace {

// Runs cells in one namespace. User code gets /dev/null as stdin (the cell
// stream stays private), a final bare expression is echoed like a REPL,
// tracebacks start at the user's code, and processes a cell forks end with it.
// matplotlib draws with a backend of the driver's (Agg underneath) whose
// show() saves the open figures, like a notebook; figures left open at the end
// of a cell are saved too, so plots come back without savefig.
constexpr std::string_view python_driver = R"PY(
import ast, importlib, importlib.abc, importlib.util, os, signal, site, struct, sys, traceback
figures = {'dir': '', 'count': 0}
def _blas_pool():
    # OpenBLAS's pool (numpy's BLAS) is shut down by OpenBLAS's own fork handler and started again after: not the user's threads
    try: lines = open('/proc/self/maps').read().splitlines()
    except OSError: return 0
    import ctypes
    pools = {}  # one per library loaded, however many names it was mapped under
    for path in {line.split(None, 5)[5] for line in lines if 'openblas' in line and len(line.split(None, 5)) == 6}:
        try: lib = ctypes.CDLL(path)
        except OSError: continue
        for name in ('openblas_get_num_threads', 'openblas_get_num_threads64_', 'scipy_openblas_get_num_threads64_'):
            get = getattr(lib, name, None)
            if get is not None:
                pools[ctypes.cast(get, ctypes.c_void_p).value] = max(get() - 1, 0)
                break
    return sum(pools.values())
def _threads_refusal():
    python = len(sys._current_frames()) - 1
    if python:
        return ('checkpoint refused: the interpreter runs %d thread(s) of its own besides the main one; a fork copies only '
                'the calling thread, so theirs would be lost with any lock they hold. Stop and join them first.' % python)
    native = len(os.listdir('/proc/self/task')) - 1
    if native > 0: native -= _blas_pool()
    if native > 0:
        return ('checkpoint refused: the interpreter runs %d native thread(s) (started by a library) that a fork would not '
                'copy; checkpoints need an interpreter without threads of its own.' % native)
    return None
def _park():
    # The parked copy: out of the live one's session, stopped until the agent restores it (SIGUSR2, then SIGCONT).
    os.setsid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    while True:
        os.kill(os.getpid(), signal.SIGSTOP)
        if signal.SIGUSR2 in signal.sigpending():
            signal.sigwait({signal.SIGUSR2})
            break
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR2})
def _fork_parked(parked):
    # The pid of a new parked copy (once it stopped); 0 in the copy, once restored.
    rand = sys.modules.get('random')
    state = rand.getstate() if rand is not None else None  # random reseeds itself in a fork's child
    for stream in (sys.stdout, sys.stderr):
        try: stream.flush()
        except Exception: pass
    pid = os.fork()
    if pid == 0:
        if state is not None: rand.setstate(state)
        parked.clear()  # the live one's copies are not this one's to reap
        _park()
        return 0
    _, status = os.waitpid(pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status): raise OSError('the copy ended before it was parked')
    parked.add(pid)
    return pid
def _save_figures():
    plt = sys.modules.get('matplotlib.pyplot')
    if plt is None or not figures['dir']: return
    for number in plt.get_fignums():
        if figures['count'] >= 20: break
        figures['count'] += 1
        try:
            os.makedirs(figures['dir'], exist_ok=True)
            plt.figure(number).savefig(os.path.join(figures['dir'], 'figure-%d.png' % figures['count']), format='png')
        except Exception as e:
            figures['count'] -= 1
            print('[cubicle] figure %s could not be saved: %s' % (number, e), file=sys.stderr)
    plt.close('all')
class _Backend(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    # Not through MPLBACKEND: the interpreter's child processes lack this backend.
    def find_spec(self, name, path=None, target=None):
        if name == '_cubicle_backend': return importlib.util.spec_from_loader(name, self)
        if name != 'matplotlib' or 'MPLBACKEND' in os.environ: return None
        sys.meta_path.remove(self)
        try: spec = importlib.util.find_spec(name)
        finally: sys.meta_path.append(self)
        if spec is None or spec.loader is None: return spec
        load = spec.loader.exec_module
        def exec_module(module):
            load(module)
            module.rcParams['backend'] = 'module://_cubicle_backend'
        spec.loader.exec_module = exec_module
        return spec
    def create_module(self, spec): return None
    def exec_module(self, module):
        from matplotlib.backends import backend_agg
        module.__dict__.update({k: v for k, v in vars(backend_agg).items() if not k.startswith('__')})
        module.show = lambda *args, **kwargs: _save_figures()
sys.meta_path.insert(0, _Backend())
def _cubicle():
    cells = os.fdopen(os.dup(0), 'rb', buffering=0)
    null = os.open(os.devnull, os.O_RDONLY); os.dup2(null, 0); os.close(null)
    sys.stdin = open(os.devnull)
    control = os.fdopen(3, 'wb', buffering=0)
    namespace = {'__name__': '__main__', '__builtins__': __builtins__}
    interpreter = os.getpid()
    parked = set()  # our parked copies, reaped once killed
    def checkpoint():
        # "STATUS 0 PID RSS_KB": a parked copy of this interpreter; the restored copy answers the same with its new copy's pid
        nonlocal interpreter
        refusal = _threads_refusal()
        if refusal:
            print(refusal, file=sys.stderr)
            return b'1 0 0 0\n'
        size = os.sysconf('SC_PAGE_SIZE') // 1024
        restored = False
        while True:
            try: rss = int(open('/proc/self/statm').read().split()[1]) * size
            except (OSError, ValueError, IndexError): rss = 0
            try: pid = _fork_parked(parked)
            except OSError as e:
                print('checkpoint failed: %s' % e, file=sys.stderr)
                return b'%d 0 0 0\n' % (0 if restored else 1)
            if pid: return b'0 0 %d %d\n' % (pid, rss)
            interpreter = os.getpid()  # restored: the live interpreter now; a fresh copy keeps the checkpoint usable
            restored = True
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
        for pid in list(parked):
            try:
                if os.waitpid(pid, os.WNOHANG)[0]: parked.discard(pid)
            except ChildProcessError: parked.discard(pid)
        if flags & 4:  # a checkpoint, between cells
            read(size)
            control.write(checkpoint())
            continue
        figures['dir'] = read(struct.unpack('>H', read(2))[0]).decode() if flags & 2 else ''
        figures['count'] = 0
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
        try: _save_figures()
        except BaseException as e: print('[cubicle] figures could not be saved: %s' % e, file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try: stream.flush()
            except Exception: pass
        if os.getpid() != interpreter:
            os._exit(status)  # a child the cell forked must not read the next cells
        control.write(b'%d %d\n' % (status, figures['count']))
_cubicle()
)PY";

// The Python zygote (agent/zygote.h has its wire): imports the modules named in
// argv (those it cannot are named on stderr and skipped), then forks a process per run that
// becomes `python3 [-u] - ARGS` or `python3 [-u] -c CODE ARGS` as exec would
// make it: own session, the run's fds, cwd and environment, fresh stdio, a new
// __main__, reseeded randomness. Runs it would start differently -- other
// options, PYTHON* variables or another PATH, a cwd or user site that shadows
// a preloaded module -- are refused, and the agent execs them instead. The
// zygote never runs a run's code and cannot be traced or read by one.
constexpr std::string_view python_zygote = R"PY(
import os, sys
def _zygote():
    import array, ctypes, importlib, socket, struct
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: runs of the same uid cannot ptrace it or read its memory
    base = dict(os.environ)
    preload = sys.argv[1:]
    missing = []
    for name in preload:
        try: importlib.import_module(name)
        except BaseException as e: missing.append('%s (%s)' % (name, type(e).__name__))
    # To the agent's stderr, which the server reads (Sandbox::note_diagnostics).
    if missing: os.write(2, ('cubicle-zygote: not preloaded: %s\n' % ', '.join(missing)).encode())
    # What every run imports (_start, _run): once here, not from disk in each
    # run, where each module costs a dozen lookups through the image's layers.
    import atexit, io, random, shutil, site, threading, types
    executable = os.path.realpath(sys.executable)  # on the read-only image: fixed
    # What is here now is never collected: a run's collections then leave the
    # zygote's pages alone instead of copying every one of them (gc writes to
    # each object it visits).
    import gc
    gc.collect()
    gc.freeze()
    # Where the agent's marker (agent/protocol.h, CUBICLE_RUN_MARKER) lies in the
    # environment this process's exec made: each run writes its id there, since
    # that copy, not os.environ, is what /proc/PID/environ shows the agent.
    libc.getenv.restype = ctypes.c_void_p
    marker = libc.getenv(b'CUBICLE_RUN')
    if marker and ctypes.string_at(marker) != b'0000000000': marker = None
    sock = socket.socket(fileno=3)
    sock.sendall(b'R')
    def exact(n, first):
        data, fds = b'', []
        while len(data) < n:
            if first:
                chunk, anc, _, _ = sock.recvmsg(n - len(data), socket.CMSG_SPACE(16))
                for level, kind, payload in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        a = array.array('i'); a.frombytes(payload[:len(payload) - len(payload) % 4]); fds += list(a)
                first = False
            else:
                chunk = sock.recv(n - len(data))
            if not chunk: os._exit(0)  # the agent is gone
            data += chunk
        return data, fds
    while True:
        header, fds = exact(4, True)
        body, _ = exact(struct.unpack('>I', header)[0], False)
        if len(fds) != 4: os._exit(1)
        pid = os.fork()
        if pid == 0:
            middle = os.getpid()
            try: child = os.fork()
            except BaseException: os._exit(1)
            if child == 0:
                # Runs only once it is the agent's child (the parent's exit
                # reparents it), so that it never sees another parent.
                while os.getppid() == middle: os.sched_yield()
                return libc, base, preload, sock, fds, body, executable, marker
            os._exit(0)  # the run is orphaned to the agent, which waits for it
        for fd in fds: os.close(fd)
        os.waitpid(pid, 0)
libc, base, preload, sock, fds, body, executable, marker = _zygote()
del _zygote
def _start():
    import io, random, site, types
    os.setsid()
    libc.prctl(4, 1, 0, 0, 0)  # dumpable again, like any process the user starts
    for i in range(3): os.dup2(fds[i], i)
    report = fds[3]
    sock.detach()
    os.closerange(3, report); os.closerange(report + 1, 1 << 16)
    fields = body.split(b'\0')
    cwd = os.fsdecode(fields[0]); argc = int(fields[1])
    argv = [os.fsdecode(a) for a in fields[2:2 + argc]]
    env = [os.fsdecode(e) for e in fields[3 + argc:3 + argc + int(fields[2 + argc])]]
    def refuse(code):
        os.write(report, b'%d %d\n' % (os.getpid(), code)); os._exit(127)
    try:
        if cwd: os.chdir(cwd)
    except OSError as e: refuse(e.errno or 1)
    for key in [k for k in os.environ if k not in base]: del os.environ[k]
    for key, value in base.items():
        if os.environ.get(key) != value: os.environ[key] = value
    for entry in env:
        key, eq, value = entry.partition('=')
        if eq: os.environ[key] = value
        else: os.environ.pop(key, None)
    for key in set(base) | set(os.environ):
        if (key.startswith('PYTHON') or key in ('PATH', 'LD_PRELOAD', 'LD_LIBRARY_PATH', 'VIRTUAL_ENV')) and base.get(key) != os.environ.get(key):
            refuse(-1)
    run = os.environ.get('CUBICLE_RUN', '')
    if marker and run.isdigit() and len(run) <= 10:
        import ctypes
        ctypes.memmove(marker, b'%010d' % int(run), 10)
    import shutil
    found = shutil.which(argv[0]) if argv else None
    if not found or os.path.realpath(found) != executable: refuse(-1)
    args, unbuffered = argv[1:], False
    while args[:1] == ['-u']: unbuffered = True; args = args[1:]
    if args[:1] == ['-']: code, args = None, args
    elif args[:1] == ['-c'] and len(args) >= 2: code, args = args[1], ['-c'] + args[2:]
    else: refuse(-1)
    user_site = site.getusersitepackages()
    tops = {name.split('.')[0] for name in preload}
    for where in ('.', user_site):
        for top in tops:
            if os.path.exists(os.path.join(where, top)) or os.path.exists(os.path.join(where, top + '.py')): refuse(-1)
    if site.ENABLE_USER_SITE and user_site not in sys.path and os.path.isdir(user_site):
        before = list(sys.path)
        site.addsitedir(user_site)
        added = [p for p in sys.path if p not in before]
        system = [i for i, p in enumerate(before) if p in site.getsitepackages()]
        at = system[0] if system else len(before)
        sys.path[:] = before[:at] + added + before[at:]
    os.write(report, b'%d 0\n' % os.getpid()); os.close(report)
    def stream(fd, write, errors, line):
        raw = io.FileIO(fd, 'wb' if write else 'rb', closefd=False)
        buffered = raw if write and unbuffered else io.BufferedWriter(raw) if write else io.BufferedReader(raw)
        text = io.TextIOWrapper(buffered, encoding=sys.stdout.encoding, errors=errors,
                                line_buffering=line or (write and raw.isatty()), write_through=write and unbuffered)
        text.mode = 'w' if write else 'r'
        return text
    sys.stdin = sys.__stdin__ = stream(0, False, sys.stdin.errors, False)
    sys.stdout = sys.__stdout__ = stream(1, True, sys.stdout.errors, False)
    sys.stderr = sys.__stderr__ = stream(2, True, 'backslashreplace', True)
    sys.argv = args
    random.seed()
    numpy = sys.modules.get('numpy.random')
    if numpy is not None: numpy.seed()
    main = types.ModuleType('__main__')
    main.__builtins__ = __builtins__
    sys.modules['__main__'] = main
    source = sys.stdin.buffer.read() if code is None else code
    return main, source, '<stdin>' if code is None else '<string>'
_main, _source, _name = _start()
del _start, libc, base, preload, sock, fds, body, executable, marker
def _run():
    # What the interpreter would do with the program, but for the end: a full
    # finalization of the preloaded modules takes far longer than the fork, so
    # the exit does what a program can see of it -- non-daemon threads are
    # joined, atexit runs, the program's objects are released (files flush),
    # stdio is flushed -- and then leaves.
    import atexit, gc, threading
    status = 0
    try:
        exec(compile(_source, _name, 'exec'), _main.__dict__)
    except SystemExit as e:
        status = e.code
    except BaseException as e:
        e.__traceback__ = e.__traceback__.tb_next  # as the interpreter reports it, without this frame
        sys.excepthook(type(e), e, e.__traceback__)
        if isinstance(e, KeyboardInterrupt): status = 'SIGINT'
        else: status = 1
        del e
    try: threading._shutdown()
    except BaseException: pass
    atexit._run_exitfuncs()
    _main.__dict__.clear()
    gc.collect()
    if status is None: status = 0
    elif status != 'SIGINT' and not isinstance(status, int):
        try: print(status, file=sys.stderr)
        except BaseException: pass
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try: stream.flush()
        except BaseException:
            if status == 0: status = 120
    if status == 'SIGINT':
        import signal
        signal.signal(signal.SIGINT, signal.SIG_DFL); os.kill(os.getpid(), signal.SIGINT)
        status = 130
    os._exit(status & 0xff)
_run()
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

// The same loop for Ruby: cells run in the top-level binding, so local variables,
// methods and requires persist. The driver's own variables live in a method, out of sight.
constexpr std::string_view ruby_driver = R"RB(
def __cubicle
  cells = STDIN.dup
  cells.binmode
  STDIN.reopen(File::NULL)
  control = IO.for_fd(3, 'wb')
  control.sync = true
  $stdout.sync = true
  $stderr.sync = true
  interpreter = Process.pid
  loop do
    header = cells.read(5)
    return if header.nil? || header.bytesize < 5
    size, _flags = header.unpack('NC')
    code = (size > 0 ? cells.read(size) : '').force_encoding(Encoding::UTF_8)
    status = 0
    begin
      TOPLEVEL_BINDING.eval(code, '<cell>', 1)
    rescue SystemExit => e
      status = e.status
    rescue Exception => e
      $stderr.puts e.full_message(highlight: false)
      status = 1
    end
    $stdout.flush
    $stderr.flush
    exit!(status) if Process.pid != interpreter
    control.write("#{status}\n")
  end
end
__cubicle
)RB";

// And for R: cells are evaluated in the global environment, visible values are
// printed as Rscript prints them, warnings appear as they happen.
constexpr std::string_view r_driver = R"R(
local({
  cells <- file("stdin", open = "rb")
  control <- file("/proc/self/fd/3", open = "wb")
  read_exact <- function(n) {
    out <- raw(0)
    while (length(out) < n) {
      chunk <- readBin(cells, "raw", n - length(out))
      if (length(chunk) == 0) return(NULL)
      out <- c(out, chunk)
    }
    out
  }
  options(warn = 1)
  repeat {
    header <- read_exact(5)
    if (is.null(header)) break
    size <- sum(as.integer(header[1:4]) * c(16777216, 65536, 256, 1))
    code <- if (size > 0) rawToChar(read_exact(size)) else ""
    Encoding(code) <- "UTF-8"
    status <- 0L
    tryCatch({
      for (e in parse(text = code, keep.source = FALSE)) {
        result <- withVisible(eval(e, envir = globalenv()))
        if (result$visible) print(result$value)
      }
    }, error = function(err) {
      call <- conditionCall(err)
      where <- if (is.null(call)) "" else paste0(" in ", paste(deparse(call), collapse = " "), " ")
      cat("Error", where, ": ", conditionMessage(err), "\n", sep = "", file = stderr())
      status <<- 1L
    })
    flush(stdout())
    flush(stderr())
    writeBin(charToRaw(paste0(status, "\n")), control)
    flush(control)
  }
})
)R";

} // namespace

std::optional<agent::RunRequest> zygote_for(std::string_view language, const std::optional<std::vector<std::string>>& preload) {
    const Language* found = find_language(language);
    if (!found || found->preload.empty() || found->name != "python") return std::nullopt;
    agent::RunRequest request;
    request.argv = {"python3", "-c", std::string(python_zygote)};
    if (preload) {
        request.argv.insert(request.argv.end(), preload->begin(), preload->end());
        return request;
    }
    for (auto rest = found->preload; !rest.empty();) {
        auto end = rest.find(' ');
        if (end != 0) request.argv.emplace_back(rest.substr(0, end));
        rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    }
    return request;
}

bool has_interpreter(std::string_view language) {
    return std::ranges::any_of(language_table, [language](const Language& l) { return l.name == language && l.repl; });
}

agent::RunRequest interpreter_for(std::string_view language) {
    agent::RunRequest request;
    if (language == "python") {
        request.argv = {"python3", "-u", "-c", std::string(python_driver)};
    } else if (language == "javascript") {
        request.argv = {"node", "-e", std::string(node_driver)};
    } else if (language == "ruby") {
        request.argv = {"ruby", "-e", std::string(ruby_driver)};
    } else {
        request.argv = {"Rscript", "-e", std::string(r_driver)};
    }
    return request;
}

std::string encode_cell(std::string_view code, bool echo, std::string_view figure_dir) {
    auto n = static_cast<std::uint32_t>(code.size());
    auto d = static_cast<std::uint16_t>(figure_dir.size());
    std::string out{static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8), static_cast<char>(n),
                    static_cast<char>((echo ? 1 : 0) | (d ? 2 : 0))};
    if (d) {
        out += static_cast<char>(d >> 8);
        out += static_cast<char>(d);
        out += figure_dir.substr(0, d);
    }
    out += code;
    return out;
}

std::string encode_checkpoint() { return std::string{'\0', '\0', '\0', '\0', '\4'}; }

agent::RunRequest shell_command(std::string command) {
    agent::RunRequest request;
    request.argv = {"/bin/sh", "-c", std::move(command)};
    return request;
}

std::string language_probe_script() {
    // The version commands run side by side: a JVM or R takes a while to start.
    std::string script = "d=$(mktemp -d) || exit 1\n";
    for (const auto& language : language_table) {
        script += fmt::format("if command -v {} >/dev/null 2>&1; then ({}) >\"$d/{}\" 2>&1 </dev/null & fi\n", language.program,
                              language.version, language.name);
    }
    script += "wait\nfor n in";
    for (const auto& language : language_table) script += fmt::format(" {}", language.name);
    script += "; do [ -e \"$d/$n\" ] && printf '%s\\t%s\\n' \"$n\" \"$(sed -n '/[0-9]/{p;q}' \"$d/$n\")\"; done\nrm -rf \"$d\"\n";
    return script;
}

std::string version_number(std::string_view output) {
    static const std::regex number(R"(\d+(?:\.\d+)+)");
    std::match_results<std::string_view::const_iterator> match;
    if (std::regex_search(output.begin(), output.end(), match, number)) return match.str();
    return std::string(output);
}

} // namespace cubicle::sandbox
