"""Languages beyond Python, JavaScript and bash: compile phase, build cache, REPLs, detection (real Docker).

The per-language tests need the polyglot image (cubicle/sandbox-polyglot:latest, or
CUBICLE_POLYGLOT_IMAGE); they share one sandbox. Detection and errors run on the test image.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from typing import Any

import pytest
from conftest import IMAGE, start_server

POLYGLOT = os.environ.get("CUBICLE_POLYGLOT_IMAGE", "cubicle/sandbox-polyglot:latest")
COMPILED = ["typescript", "go", "c", "cpp", "java", "rust"]
INTERPRETED = ["r", "ruby"]
LANGUAGES = COMPILED + INTERPRETED


def _polyglot_present() -> bool:
    return subprocess.run(["docker", "image", "inspect", POLYGLOT], capture_output=True).returncode == 0


needs_polyglot = pytest.mark.skipif(not _polyglot_present(), reason=f"{POLYGLOT} not built (images/polyglot.profile)")

# Per language: hello world; a compile (or syntax) error; exit code 3 with "boom" on stderr;
# a program that reads a number n from input.txt and prints 2n, or when n is 0 prints
# "started" and then runs until it is killed.
PROGRAMS: dict[str, dict[str, str]] = {
    "c": {
        "hello": '#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n',
        "broken": "int main(void) { return undefined_name; }\n",
        "exit": '#include <stdio.h>\nint main(void) { fputs("boom\\n", stderr); return 3; }\n',
        "input": '#include <stdio.h>\n#include <unistd.h>\nint main(void) { int n = -1; FILE *f = fopen("input.txt", "r");\n'
        ' if (!f || fscanf(f, "%d", &n) != 1) return 9;\n if (n == 0) { puts("started"); fflush(stdout); for (;;) sleep(1); }\n'
        ' printf("%d\\n", 2 * n); return 0; }\n',
    },
    "cpp": {
        "hello": '#include <iostream>\nint main() { std::cout << "hello" << std::endl; }\n',
        "broken": "int main() { std::string s; }\n",
        "exit": '#include <iostream>\nint main() { std::cerr << "boom" << std::endl; return 3; }\n',
        "input": "#include <fstream>\n#include <iostream>\n#include <thread>\nint main() { int n = -1; std::ifstream f(\"input.txt\"); f >> n;\n"
        ' if (n == 0) { std::cout << "started" << std::endl; for (;;) std::this_thread::sleep_for(std::chrono::seconds(1)); }\n'
        " std::cout << 2 * n << std::endl; }\n",
    },
    "go": {
        "hello": 'package main\nimport "fmt"\nfunc main() { fmt.Println("hello") }\n',
        "broken": 'package main\nfunc main() { x := 1 }\n',
        "exit": 'package main\nimport ("fmt"; "os")\nfunc main() { fmt.Fprintln(os.Stderr, "boom"); os.Exit(3) }\n',
        "input": 'package main\nimport ("fmt"; "os"; "strconv"; "strings"; "time")\nfunc main() {\n'
        ' b, _ := os.ReadFile("input.txt"); n, _ := strconv.Atoi(strings.TrimSpace(string(b)))\n'
        ' if n == 0 { fmt.Println("started"); for { time.Sleep(time.Second) } }\n fmt.Println(2 * n) }\n',
    },
    "rust": {
        "hello": 'fn main() { println!("hello"); }\n',
        "broken": "fn main() { let x: i32 = \"no\"; }\n",
        "exit": 'fn main() { eprintln!("boom"); std::process::exit(3); }\n',
        "input": "fn main() { let n: i64 = std::fs::read_to_string(\"input.txt\").unwrap().trim().parse().unwrap();\n"
        ' if n == 0 { println!("started"); loop { std::thread::sleep(std::time::Duration::from_secs(1)); } }\n'
        ' println!("{}", 2 * n); }\n',
    },
    "java": {
        "hello": 'public class Hello { public static void main(String[] args) { System.out.println("hello"); } }\n',
        "broken": "public class Broken { public static void main(String[] args) { int x = \"no\"; } }\n",
        "exit": 'public class Exit { public static void main(String[] args) { System.err.println("boom"); System.exit(3); } }\n',
        "input": "import java.nio.file.*;\npublic class Input { public static void main(String[] args) throws Exception {\n"
        ' int n = Integer.parseInt(Files.readString(Path.of("input.txt")).trim());\n'
        ' if (n == 0) { System.out.println("started"); System.out.flush(); while (true) Thread.sleep(1000); }\n'
        " System.out.println(2 * n); } }\n",
    },
    "typescript": {
        "hello": 'const greeting: string = "hello";\nconsole.log(greeting);\n',
        "broken": 'const n: number = "no";\n',
        "exit": 'console.error("boom");\nprocess.exit(3);\n',
        "input": "import * as fs from 'fs';\nconst n: number = parseInt(fs.readFileSync('input.txt', 'utf8'), 10);\n"
        "if (n === 0) { console.log('started'); setInterval(() => {}, 1000); } else { console.log(2 * n); }\n",
    },
    "ruby": {
        "hello": 'puts "hello"\n',
        "broken": "def f(\n",
        "exit": '$stderr.puts "boom"\nexit 3\n',
        "input": "n = File.read('input.txt').to_i\nif n == 0\n  puts 'started'\n  loop { sleep 1 }\nend\nputs 2 * n\n",
    },
    "r": {
        "hello": 'cat("hello\\n")\n',
        "broken": "f <- function( {\n",
        "exit": 'message("boom")\nquit(status = 3)\n',
        "input": 'n <- as.integer(readLines("input.txt"))\nif (n == 0) { cat("started\\n"); repeat Sys.sleep(1) }\ncat(2 * n, "\\n", sep = "")\n',
    },
}


@pytest.fixture(scope="module")
async def srv():
    async with start_server("--max-timeout-s", "120", tag="languages") as s:
        yield s


@pytest.fixture(scope="module")
async def box(srv) -> Any:
    if not _polyglot_present():
        pytest.skip(f"{POLYGLOT} not built")
    async with srv.sandbox(image=POLYGLOT, memory_mb=1536, cpus=2) as sb:
        yield sb["sandbox_id"]


async def run(srv, box: str, language: str, code: str, progress=None, **extra: Any) -> dict[str, Any]:
    arguments = {"sandbox_id": box, "language": language, "code": code, "timeout_s": 90, **extra}
    return await srv.ok("execute_code", arguments, timeout=120, progress=progress)


# ---------------------------------------------------------------- detection (test image)


async def test_unknown_language_lists_what_the_image_has(srv):
    sb = await srv.new_sandbox()
    kind, text = await srv.tool_error("execute_code", {"sandbox_id": sb["sandbox_id"], "language": "cobol", "code": "x"})
    assert kind == "isError"
    assert "unknown language 'cobol'" in text and IMAGE in text, text
    for name in ("python", "javascript", "bash"):
        assert name in text, text
    assert "rust" not in text and "java " not in text, text
    # A known language the image lacks names the packages that would provide it.
    kind, text = await srv.tool_error("execute_code", {"sandbox_id": sb["sandbox_id"], "language": "golang", "code": "x"})
    assert "go is not installed in image" in text and "golang-go" in text and "python" in text, text
    # The server keeps working, in the same sandbox.
    sc = await srv.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "language": "Python", "code": "print(6*7)"})
    assert sc["stdout"] == "42\n" and sc["phase"] == "run"
    await srv.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})


async def test_list_languages_of_the_test_image(srv):
    sc = await srv.ok("list_languages", {"image": IMAGE})
    assert sc["image"] == IMAGE
    found = {entry["name"]: entry for entry in sc["languages"]}
    assert set(found) == {"python", "javascript", "bash"}, found
    assert found["python"]["version"].startswith("3.") and found["python"]["stateful"] is True
    assert found["bash"]["stateful"] is False and found["javascript"]["compiled"] is False
    assert "js" in found["javascript"]["aliases"]
    assert found["python"]["extension"] == ".py" and found["bash"]["extension"] == ".sh"


async def test_languages_resource_lists_every_language_and_its_images(srv):
    import json

    listed = await srv.session.list_resources()
    entry = next(r for r in listed.resources if str(r.uri) == "cubicle://languages")
    assert entry.mime_type == "application/json" and entry.description
    read = await srv.session.read_resource("cubicle://languages")
    assert read.contents[0].mime_type == "application/json"
    doc = json.loads(read.contents[0].text)
    assert doc["default_image"] == IMAGE
    images = {image["image"]: image for image in doc["images"]}
    assert images[IMAGE]["present"] is True and images[IMAGE]["languages"] == ["python", "javascript", "bash"]
    # Every sandbox profile's image is there; one not built says how to build it.
    for name, profile in (("cubicle/sandbox:latest", "sandbox"), ("cubicle/sandbox-minimal:latest", "sandbox-minimal"),
                          (POLYGLOT, "sandbox-polyglot")):
        if name == POLYGLOT and "CUBICLE_POLYGLOT_IMAGE" in os.environ:
            continue
        assert images[name]["profile"] == profile
        if not images[name]["present"]:
            assert images[name]["build"] == f"cubicle image build {profile}"
    assert "cubicle/server:latest" not in images
    polyglot = images.get("cubicle/sandbox-polyglot:latest")
    assert polyglot and set(LANGUAGES) <= set(polyglot["languages"]), polyglot
    # Every language of the table, each with the images that have it; the language part is
    # the very entry list_languages gives for an image, version aside.
    languages = {language["name"]: language for language in doc["languages"]}
    assert set(languages) == {"python", "javascript", "bash", *LANGUAGES}
    assert [language["extension"] for language in doc["languages"]][:3] == [".py", ".js", ".sh"]
    tool = await srv.ok("list_languages", {"image": IMAGE})
    for entry in tool["languages"]:
        in_resource = languages[entry["name"]]
        assert {k: v for k, v in in_resource.items() if k != "images"} == {k: v for k, v in entry.items() if k != "version"}
        assert {"image": IMAGE, "version": entry["version"]} in in_resource["images"]
    if not images.get(POLYGLOT, {}).get("present"):
        assert all(image["image"] != POLYGLOT for image in languages["go"]["images"])
    else:
        assert any(image["image"] == POLYGLOT for image in languages["go"]["images"])
    # Unknown cubicle: URIs are not found, like a missing sandbox file.
    from mcp.shared.exceptions import MCPError

    with pytest.raises(MCPError) as e:
        await srv.session.read_resource("cubicle://nothing")
    assert e.value.error.code == -32002


# ---------------------------------------------------------------- every language (polyglot image)


@needs_polyglot
async def test_list_languages_of_the_polyglot_image(srv, box):
    sc = await srv.ok("list_languages", {"sandbox_id": box})
    found = {entry["name"]: entry for entry in sc["languages"]}
    assert set(LANGUAGES) <= set(found), found
    for name in LANGUAGES:
        assert found[name]["version"][0].isdigit(), found[name]
    assert found["go"]["compiled"] and found["rust"]["compiled"] and not found["ruby"]["compiled"]
    assert found["r"]["stateful"] and found["ruby"]["stateful"] and not found["c"]["stateful"]


@needs_polyglot
@pytest.mark.parametrize("language", LANGUAGES)
async def test_hello_world(srv, box, language):
    sc = await run(srv, box, language, PROGRAMS[language]["hello"])
    assert sc["stdout"] == "hello\n", sc
    assert sc["exit_code"] == 0 and sc["phase"] == "run" and not sc["timed_out"], sc


@needs_polyglot
@pytest.mark.parametrize("language", LANGUAGES)
async def test_compile_error(srv, box, language):
    sc = await run(srv, box, language, PROGRAMS[language]["broken"])
    assert sc["exit_code"] != 0 and not sc["timed_out"], sc
    messages = sc["stdout"] + sc["stderr"]
    if language in COMPILED:
        assert sc["phase"] == "compile", sc
        source = {"java": "Broken.java", "typescript": "main.ts", "cpp": "main.cpp", "rust": "main.rs"}.get(language, f"main.{language}")
        assert source in messages, messages  # the compiler's own message, pointing into the code
        assert "compile_ms" not in sc
    else:
        assert sc["phase"] == "run", sc  # no compiler: the interpreter reports the syntax error
        assert "unexpected" in messages.lower() or "syntax" in messages.lower(), messages


@needs_polyglot
@pytest.mark.parametrize("language", LANGUAGES)
async def test_runtime_error_exit_code(srv, box, language):
    sc = await run(srv, box, language, PROGRAMS[language]["exit"])
    assert sc["exit_code"] == 3, sc
    assert sc["phase"] == "run" and "boom" in sc["stderr"], sc


@needs_polyglot
@pytest.mark.parametrize("language", LANGUAGES)
async def test_input_file_then_streaming_and_timeout(srv, box, language):
    code = PROGRAMS[language]["input"]
    await srv.ok("write_file", {"sandbox_id": box, "path": "input.txt", "content": "21\n"})
    sc = await run(srv, box, language, code)
    assert sc["stdout"] == "42\n" and sc["exit_code"] == 0, sc

    # The same code again (its build is cached), now running until the timeout:
    # what it printed arrives as progress while it still runs.
    await srv.ok("write_file", {"sandbox_id": box, "path": "input.txt", "content": "0\n"})
    seen: list[tuple[float, str]] = []

    async def progress(_progress: float, _total: float | None, message: str | None) -> None:
        if message:
            seen.append((time.monotonic(), message))

    sc = await run(srv, box, language, code, timeout_s=4, progress=progress)
    finished = time.monotonic()
    assert sc["timed_out"] and sc["phase"] == "run", sc
    assert sc["stdout"] == "started\n", sc
    streamed = [at for at, message in seen if "started" in message]
    assert streamed and finished - streamed[0] > 1.5, (seen, finished)


@needs_polyglot
@pytest.mark.parametrize("language", ["c", "rust"])
async def test_unchanged_code_skips_the_compiler(srv, box, language):
    code = PROGRAMS[language]["hello"].replace("hello", "cached")
    first = await run(srv, box, language, code)
    probe = await srv.sh(box, f"stat -c %i .cubicle/build/{language}-*/prog | sort")
    again = await run(srv, box, language, code)
    assert first["stdout"] == again["stdout"] == "cached\n"
    assert (await srv.sh(box, f"stat -c %i .cubicle/build/{language}-*/prog | sort"))["stdout"] == probe["stdout"]
    assert again["compile_ms"] < first["compile_ms"], (first, again)
    # Changed code is built anew.
    changed = await run(srv, box, language, code.replace("cached", "changed"))
    assert changed["stdout"] == "changed\n" and changed["compile_ms"] > again["compile_ms"]


@needs_polyglot
async def test_compile_timeout_is_a_compile_phase_result(srv, box):
    # Constant evaluation the compiler chews on for far longer than the timeout.
    code = ("constexpr long f() { long s = 0; for (long i = 0; i < 200000; ++i) for (long j = 0; j < 200000; ++j) s += i ^ j; return s; }\n"
            "static_assert(f() != 0);\nint main() {}\n")
    for _ in range(2):
        sc = await srv.ok("execute_code", {"sandbox_id": box, "language": "c++", "code": code, "timeout_s": 1}, timeout=60)
        # A killed build is no build: the same code compiles (and times out) again.
        assert sc["phase"] == "compile" and sc["timed_out"] and "compile_ms" not in sc, sc
    # What the killed compilers left is cleared by the next build of the same code.
    left = await srv.sh(box, "ls -d .cubicle/build/cpp-*.* | wc -l")
    assert left["stdout"].strip() == "1", left


@needs_polyglot
@pytest.mark.parametrize("language,define,use,expected", [
    ("ruby", "x = 41\ndef twice(v) = v * 2\n", "puts x + 1, twice(x)", "42\n82\n"),
    ("r", "x <- 41\ntwice <- function(v) v * 2\n", "x + 1\ncat(twice(x), '\\n')", "[1] 42\n82 \n"),
])
async def test_repl_languages_keep_state(srv, box, language, define, use, expected):
    await run(srv, box, language, define)
    sc = await run(srv, box, language, use)
    assert sc["stdout"] == expected and sc["exit_code"] == 0, sc
    fresh = await run(srv, box, language, use, fresh=True)
    assert fresh["exit_code"] != 0 and fresh["stdout"] == "", fresh
    # A failing cell keeps the state.
    await run(srv, box, language, 'stop("x")' if language == "r" else 'raise "x"')
    sc = await run(srv, box, language, use)
    assert sc["stdout"] == expected, sc
