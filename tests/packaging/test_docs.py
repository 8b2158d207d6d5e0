"""The documentation generated from the option table agrees with --help.

Every flag and variable `cubicle --help` shows must be in the man page, the
bash and zsh completions and server.json; the committed server.json must be
what the generator makes today. Standard library only (the `unit` suite of a
distribution build has no pytest); pytest collects it too.

Environment (meson sets these; the defaults fit a `build/` directory):
  CUBICLE_BIN, CUBICLE_DOCGEN, CUBICLE_MAN, CUBICLE_BASH_COMPLETION, CUBICLE_ZSH_COMPLETION
"""

import gzip
import json
import os
import re
import shutil
import subprocess
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"


def path_from_env(name, default):
    return Path(os.environ.get(name, default))


CUBICLE = path_from_env("CUBICLE_BIN", BUILD / "cubicle")
DOCGEN = path_from_env("CUBICLE_DOCGEN", BUILD / "doc" / "cubicle-docgen")
MAN = path_from_env("CUBICLE_MAN", BUILD / "doc" / "cubicle.1")
BASH_COMPLETION = path_from_env("CUBICLE_BASH_COMPLETION", BUILD / "completions" / "cubicle")
ZSH_COMPLETION = path_from_env("CUBICLE_ZSH_COMPLETION", BUILD / "completions" / "_cubicle")


def run(*args, **kwargs):
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=30, **kwargs).stdout


def help_text():
    return run(str(CUBICLE), "--help")


def help_flags():
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", help_text()))
    assert len(flags) > 10, flags
    return flags


def help_variables():
    variables = set(re.findall(r"\[([A-Z][A-Z0-9_]*)\]", help_text()))
    assert "DOCKER_HOST" in variables, variables
    return variables


def roff_text(page):
    """The words of a roff page, font changes and escapes removed."""
    text = gzip.decompress(page.read_bytes()).decode() if page.suffix == ".gz" else page.read_text()
    text = re.sub(r"\\f[BIRP]", "", text)
    return text.replace("\\-", "-").replace("\\&", "").replace("\\(em", "-")


@unittest.skipUnless(CUBICLE.is_file(), f"no cubicle binary at {CUBICLE}")
class ManPage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not MAN.is_file():
            raise unittest.SkipTest(f"no man page at {MAN} (built with -Dman=enabled and scdoc)")
        cls.text = roff_text(MAN)

    def test_every_flag_of_help_is_documented(self):
        missing = sorted(f for f in help_flags() if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", self.text))
        self.assertEqual(missing, [], "flags in --help but not in the man page")

    def test_every_variable_of_help_is_documented(self):
        missing = sorted(v for v in help_variables() if v not in self.text)
        self.assertEqual(missing, [], "variables in --help but not in the man page")

    def test_sections(self):
        for section in ("NAME", "SYNOPSIS", "OPTIONS", "COMMANDS", "ENVIRONMENT", "EXIT STATUS", "FILES",
                        "SECURITY", "EXAMPLES", "SEE ALSO"):
            self.assertRegex(self.text, rf'\.SH "?{section}"?\n', section)
        for command in ("image build", "image list", "doctor"):
            self.assertIn(command, self.text)

    def test_version_and_paths_filled_in(self):
        version = run(str(CUBICLE), "--version").split()[-1]
        self.assertIn(f'"cubicle {version}"', self.text)
        self.assertNotIn("@", re.sub(r"[\w.+-]+@[\w.-]+", "", self.text), "an unsubstituted @VARIABLE@")
        self.assertNotIn("%%", self.text)

    @unittest.skipUnless(shutil.which("man"), "no man(1)")
    def test_renders_without_warnings(self):
        result = subprocess.run(["man", "--warnings", "-l", str(MAN)], capture_output=True, text=True,
                                env={**os.environ, "MANWIDTH": "80", "MANPAGER": "cat", "PAGER": "cat"}, timeout=30)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr.strip(), "", "groff warnings")
        self.assertIn("--default-image", result.stdout)


@unittest.skipUnless(CUBICLE.is_file(), f"no cubicle binary at {CUBICLE}")
class HelpCommands(unittest.TestCase):
    """--help names the subcommands the man page's SYNOPSIS has, in its usage lines and its own section."""

    @staticmethod
    def commands(lines, prefix):
        found = set()
        for line in lines:
            words = line.strip().removeprefix(prefix).split()
            if not line.strip().startswith(prefix) or not words:
                continue
            name = [w for w in words[:2] if re.fullmatch(r"[a-z]+", w)]
            if name:
                found.add(" ".join(name))
        return found

    def test_help_lists_the_man_pages_subcommands(self):
        source = (REPO / "doc" / "cubicle.1.scd.in").read_text()
        synopsis = source.split("# SYNOPSIS", 1)[1].split("\n# ", 1)[0]
        man = self.commands(re.sub(r"[*_]", "", synopsis).splitlines(), "cubicle ")
        self.assertEqual(man, {"image build", "image list", "image dockerfile", "doctor"})
        text = help_text()
        usage = text.split("\n\n")[1]
        self.assertEqual(self.commands(usage.replace("usage:", "").splitlines(), "cubicle "), man)
        section = text.split("\ncommands:\n", 1)[1].split("\n\n", 1)[0]
        self.assertEqual(self.commands(section.splitlines(), ""), man)


@unittest.skipUnless(CUBICLE.is_file() and BASH_COMPLETION.is_file(), "no cubicle binary or bash completion")
class BashCompletion(unittest.TestCase):
    def complete(self, *words):
        """COMPREPLY for `cubicle WORDS…` with the cursor at the end of the last word."""
        script = (f"source {BASH_COMPLETION}\n"
                  f"COMP_WORDS=(cubicle {' '.join(repr(w) if w else repr('') for w in words)})\n"
                  f"COMP_CWORD={len(words)}\n"
                  "_cubicle\n"
                  "printf '%s\\n' \"${COMPREPLY[@]}\"\n")
        return set(run("bash", "--norc", "--noprofile", "-c", script).split())

    def test_offers_every_flag_of_help(self):
        self.assertEqual(help_flags() - self.complete("--"), set())

    def test_prefix_and_subcommands(self):
        self.assertEqual(self.complete("--pool-s"), {"--pool-size"})
        self.assertEqual(self.complete(""), {"image", "doctor"})
        self.assertEqual(self.complete("image", "b"), {"build"})

    def test_directories_for_host_dirs_and_nothing_for_values(self):
        offered = self.complete("--allow-host-dir", "/")
        self.assertIn("/usr", offered)
        self.assertEqual(self.complete("--memory-mb", ""), set())


@unittest.skipUnless(CUBICLE.is_file() and ZSH_COMPLETION.is_file(), "no cubicle binary or zsh completion")
class ZshCompletion(unittest.TestCase):
    def test_lists_every_flag_of_help(self):
        text = ZSH_COMPLETION.read_text()
        self.assertTrue(text.startswith("#compdef cubicle\n"))
        missing = sorted(f for f in help_flags() if f"'{f}" not in text and f"'*{f}" not in text
                         and f"{{-h,{f}}}" not in text and f"{{-V,{f}}}" not in text)
        self.assertEqual(missing, [])

    @unittest.skipUnless(shutil.which("zsh"), "no zsh")
    def test_parses(self):
        run("zsh", "-n", str(ZSH_COMPLETION))


@unittest.skipUnless(CUBICLE.is_file() and DOCGEN.is_file(), "no cubicle binary or cubicle-docgen")
class ServerJson(unittest.TestCase):
    def test_committed_file_is_current(self):
        generated = run(str(DOCGEN), "server-json")
        committed = (REPO / "server.json").read_text()
        self.assertEqual(committed, generated,
                         f"server.json is stale: regenerate it with `{DOCGEN} server-json > server.json`")

    def test_variables_and_shape(self):
        server = json.loads((REPO / "server.json").read_text())
        version = run(str(CUBICLE), "--version").split()[-1]
        self.assertEqual(server["version"], version)
        self.assertLessEqual(len(server["description"]), 100)
        self.assertRegex(server["name"], r"^[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+$")
        (package,) = server["packages"]
        self.assertEqual(package["transport"], {"type": "stdio"})
        self.assertTrue(package["identifier"].endswith(f":{version}"))
        names = {v["name"] for v in package["environmentVariables"]}
        self.assertEqual(names, help_variables())
        for variable in package["environmentVariables"]:
            self.assertIn(variable["format"], {"string", "number", "boolean", "filepath"})
            self.assertFalse(variable["isSecret"])

    def test_valid_against_the_registry_schema(self):
        try:
            import jsonschema
        except ImportError:
            self.skipTest("no python3-jsonschema")
        schema = json.loads((REPO / "tests" / "packaging" / "server.schema.json").read_text())
        server = json.loads((REPO / "server.json").read_text())
        self.assertEqual(server["$schema"], schema["$id"])
        validator = jsonschema.Draft7Validator(schema)
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(server)]
        self.assertEqual(errors, [])
        # The validator really checks: a description over the registry's limit fails.
        self.assertFalse(validator.is_valid({**server, "description": "x" * 101}))

    def test_names_agree(self):
        """The registry name, the published image and the label the registry checks on it are one name."""
        server = json.loads((REPO / "server.json").read_text())
        namespace, _, short = server["name"].partition("/")
        self.assertTrue(namespace.startswith("io.github."), "an io.github.* name is verified through GitHub")
        owner = namespace.removeprefix("io.github.")
        (package,) = server["packages"]
        self.assertEqual(package["registryType"], "oci")
        self.assertTrue(package["identifier"].startswith(f"ghcr.io/{owner}/"), package["identifier"])
        profile = (REPO / "images" / "server.profile").read_text()
        self.assertIn(f"io.modelcontextprotocol.server.name={server['name']}", profile)
        self.assertEqual(short, "cubicle")


if __name__ == "__main__":
    unittest.main(verbosity=2)
