#!/usr/bin/env python3
"""The tool catalogue: one JSON file per tool, read by the build, the docs and the tests.

index.json      the groups (in the order --help names them) and the order of tools/list
shared.json     fragments several tools share, by name
<tool>.json     name, group, title, description, inputSchema, outputSchema,
                annotations and optionally execution (taskSupport)

A tool file refers to a fragment in two ways: a value {"$shared": "NAME"} is
replaced by the fragment; in an object, a member "$shared": ["NAME", ...]
splices the members of those (object) fragments in at its place. A
description may be a list of strings and fragments, joined.

Strings may hold placeholders such as {memory_mb}: the server fills them from
its configuration (src/tools/catalogue.cpp). A string that is only
"{language_names}" inside an array stands for the list of language names.

  catalogue.py embed OUT.cpp    write the C++ file the server embeds
  catalogue.py readme           print the README's generated part: the groups, with the
                                bytes each adds to tools/list (measured on
                                tests/golden/tools.json), and the tool table
"""

import copy
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parents[2] / "tests" / "golden" / "tools.json"
TOOL_KEYS = {"name", "group", "title", "description", "inputSchema", "outputSchema", "annotations", "execution"}
ANNOTATIONS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


class CatalogueError(Exception):
    pass


def _read(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CatalogueError(f"{path}: {e}") from e


def _expand(node, shared, where):
    if isinstance(node, list):
        return [_expand(item, shared, where) for item in node]
    if not isinstance(node, dict):
        return node
    if set(node) == {"$shared"} and isinstance(node["$shared"], str):
        return _expand(copy.deepcopy(_fragment(shared, node["$shared"], where)), shared, where)
    out = {}
    for key, value in node.items():
        spliced = {}
        if key == "$shared":
            for name in value if isinstance(value, list) else [value]:
                fragment = _fragment(shared, name, where)
                if not isinstance(fragment, dict):
                    raise CatalogueError(f"{where}: fragment {name} is not an object and cannot be spliced")
                spliced.update(_expand(copy.deepcopy(fragment), shared, where))
        else:
            spliced = {key: _expand(value, shared, where)}
        for member in spliced:
            if member in out:
                raise CatalogueError(f"{where}: member {member} given twice")
        out.update(spliced)
    return out


def _fragment(shared, name, where):
    if name not in shared:
        raise CatalogueError(f"{where}: no shared fragment {name!r} (shared.json has {', '.join(shared)})")
    return shared[name]


def load(directory=HERE):
    """The groups and the tools in tools/list order, fragments expanded."""
    directory = Path(directory)
    index = _read(directory / "index.json")
    shared = _read(directory / "shared.json")
    groups = index["groups"]
    group_names = [g["name"] for g in groups]
    files = sorted(p for p in directory.glob("*.json") if p.name not in ("index.json", "shared.json"))
    by_name = {}
    for path in files:
        tool = _expand(_read(path), shared, path.name)
        if isinstance(tool.get("description"), list):
            tool["description"] = "".join(tool["description"])
        name = tool.get("name")
        if path.stem != name:
            raise CatalogueError(f"{path.name}: its name is {name!r}; a tool's file is named after it")
        if set(tool) - TOOL_KEYS or not {"name", "group", "title", "description", "inputSchema", "outputSchema",
                                          "annotations"} <= set(tool):
            raise CatalogueError(f"{path.name}: members must be {', '.join(sorted(TOOL_KEYS))} (execution optional)")
        if tool["group"] not in group_names:
            raise CatalogueError(f"{path.name}: group {tool['group']!r} is not one of {', '.join(group_names)}")
        if sorted(tool["annotations"]) != sorted(ANNOTATIONS):
            raise CatalogueError(f"{path.name}: annotations must be {', '.join(ANNOTATIONS)}")
        by_name[name] = tool
    order = index["tools"]
    if sorted(order) != sorted(by_name):
        raise CatalogueError(f"index.json lists {sorted(order)} but the files are {sorted(by_name)}")
    return groups, [by_name[name] for name in order]


def _compact(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _raw(text):
    delimiter = "catalogue"
    if f"){delimiter}\"" in text:
        raise CatalogueError("a string holds the raw-string delimiter")
    return f'R"{delimiter}({text}){delimiter}"'


def embed(out_path):
    groups, tools = load()
    lines = [
        "// Generated by src/tools/catalogue/catalogue.py from src/tools/catalogue/*.json: edit those files.",
        '#include "tools/catalogue.hpp"',
        "namespace cubicle::tools {",
        "const std::vector<ToolGroup>& tool_groups() {",
        "    static const std::vector<ToolGroup> groups = {",
    ]
    for g in groups:
        lines.append(f"        {{{_compact(g['name'])}, {_raw(g['summary'])}, {str(bool(g['default'])).lower()}}},")
    lines += ["    };", "    return groups;", "}", "const std::vector<CatalogueEntry>& catalogue() {",
              "    static const std::vector<CatalogueEntry> entries = {"]
    for t in tools:
        a = t["annotations"]
        task = t.get("execution", {}).get("taskSupport") == "optional"
        flags = ", ".join(str(bool(a[k])).lower() for k in ANNOTATIONS)
        lines.append(f"        {{{_compact(t['name'])}, {_compact(t['group'])}, {_raw(t['title'])}, {_raw(t['description'])},\n"
                     f"         {_raw(_compact(t['inputSchema']))},\n         {_raw(_compact(t['outputSchema']))},\n"
                     f"         {flags}, {str(task).lower()}}},")
    lines += ["    };", "    return entries;", "}", "} // namespace cubicle::tools", ""]
    Path(out_path).write_text("\n".join(lines))


def _arguments(schema):
    required = set(schema.get("required", []))
    out = []
    for name, prop in schema["properties"].items():
        text = f"`{name}`" if name in required else f"`{name}?`"
        if "enum" in prop and len(prop["enum"]) <= 10 and "{language_names}" not in prop["enum"]:
            text += " (" + "/".join(f"`{v}`" for v in prop["enum"]) + ")"
        elif "default" in prop or "maximum" in prop:
            limits = [json.dumps(prop["default"])] if "default" in prop else []
            limits += [f"at most {prop['maximum']}"] if "maximum" in prop else []
            text += f" ({', '.join(limits)})"
        out.append(text)
    return ", ".join(out)


def _results(schema):
    out = []
    for name, prop in schema["properties"].items():
        items = prop.get("items", {})
        if prop.get("type") == "array" and items.get("type") == "object":
            out.append(f"`{name}: [{{{', '.join(items['properties'])}}}]`")
        else:
            out.append(f"`{name}`")
    return ", ".join(out)


def group_bytes(golden=GOLDEN):
    """Bytes each group adds to a tools/list result (compact JSON, as sent), from the golden list."""
    listed = {t["name"]: len(_compact(t).encode()) + 1 for t in json.loads(Path(golden).read_text())["tools"]}
    groups, tools = load()
    return {g["name"]: sum(listed[t["name"]] for t in tools if t["group"] == g["name"]) for g in groups}


def readme(golden=GOLDEN):
    groups, tools = load()
    sizes = group_bytes(golden)
    rows = ["| group | default | tools | bytes in `tools/list` |", "| --- | --- | --- | --- |"]
    for g in groups:
        names = ", ".join(f"`{t['name']}`" for t in tools if t["group"] == g["name"])
        default = "yes" if g["default"] else {"host": "with `--allow-host-dir`", "project": "with `--allow-host-dir`", "packages": "with `--allow-network`"}.get(g["name"], "no")
        rows.append(f"| `{g['name']}` | {default} | {names} | {sizes[g['name']]:,} |")
    rows.append(f"| `all` | | every tool | {sum(sizes.values()):,} |")
    return "\n".join(rows) + "\n\n" + table()


def table():
    groups, tools = load()
    rows = ["| tool | group | arguments (`?`: optional, default) | result (`structuredContent`) |",
            "| --- | --- | --- | --- |"]
    for t in tools:
        rows.append(f"| `{t['name']}` | `{t['group']}` | {_arguments(t['inputSchema'])} | {_results(t['outputSchema'])} |")
    return "\n".join(rows) + "\n"


def main(argv):
    try:
        if len(argv) == 3 and argv[1] == "embed":
            embed(argv[2])
        elif len(argv) == 2 and argv[1] == "readme":
            sys.stdout.write(readme())
        else:
            sys.stderr.write("usage: catalogue.py embed OUT.cpp | readme\n")
            return 2
    except CatalogueError as e:
        sys.stderr.write(f"catalogue: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
