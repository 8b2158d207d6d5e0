"""The tool catalogue (src/tools/catalogue/*.json): valid JSON Schema 2020-12,
input schemas OpenAI's strict tool mode accepts, a golden file that covers
every tool and group, and a README whose tool tables are made from it.

Needs jsonschema (tests/requirements.txt); no binary, no Docker.
"""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src" / "tools" / "catalogue"))
import catalogue  # noqa: E402

pytestmark = pytest.mark.no_image  # data files only (conftest still wants a built binary)

GROUPS, TOOLS = catalogue.load()
GOLDEN = json.loads((REPO / "tests" / "golden" / "tools.json").read_text())["tools"]


class NotStrict(Exception):
    pass


def strict_schema(schema):
    """The conversion the OpenAI Agents SDK applies before strict mode
    (agents.strict_schema.ensure_strict_json_schema): every object gets
    additionalProperties: false, or is refused when it allows more; every
    property becomes required; a None default is dropped. Properties that were
    optional become nullable, as strict mode needs for a value a caller may
    leave out (cubicle reads null as absent)."""
    schema = copy.deepcopy(schema)
    _strict(schema, "")
    return schema


def _strict(node, where):
    if not isinstance(node, dict):
        raise NotStrict(f"{where}: a schema must be an object")
    for defs in ("$defs", "definitions"):
        for name, sub in node.get(defs, {}).items():
            _strict(sub, f"{where}/{defs}/{name}")
    if node.get("type") == "object":
        if node.get("additionalProperties"):
            raise NotStrict(f"{where}: additionalProperties must be false in strict mode")
        node["additionalProperties"] = False
    properties = node.get("properties")
    if isinstance(properties, dict):
        optional = set(properties) - set(node.get("required", []))
        node["required"] = list(properties)
        for name, sub in properties.items():
            _strict(sub, f"{where}/properties/{name}")
            if name in optional:
                properties[name] = _nullable(sub)
    if isinstance(node.get("items"), dict):
        _strict(node["items"], f"{where}/items")
    for sub in node.pop("oneOf", []):
        node.setdefault("anyOf", []).append(sub)
    for i, sub in enumerate(node.get("anyOf", [])):
        _strict(sub, f"{where}/anyOf/{i}")
    for i, sub in enumerate(node.get("allOf", [])):
        _strict(sub, f"{where}/allOf/{i}")
    if "default" in node and node["default"] is None:
        del node["default"]


def _nullable(schema):
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"], **({"enum": schema["enum"] + [None]} if "enum" in schema else {})}
    if "anyOf" in schema:
        return {**schema, "anyOf": schema["anyOf"] + [{"type": "null"}]}
    return {"anyOf": [schema, {"type": "null"}]}


def strict_problems(node, where=""):
    """What OpenAI's strict mode refuses in a converted schema."""
    problems = []
    if isinstance(node, dict):
        if node.get("type") == "object" or (isinstance(node.get("type"), list) and "object" in node["type"]):
            if node.get("additionalProperties") is not False:
                problems.append(f"{where}: additionalProperties is not false")
            if sorted(node.get("required", [])) != sorted(node.get("properties", {})):
                problems.append(f"{where}: not every property is required")
        for key, value in node.items():
            problems += strict_problems(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            problems += strict_problems(value, f"{where}/{i}")
    return problems


@pytest.mark.parametrize("tool", TOOLS, ids=[t["name"] for t in TOOLS])
def test_schemas_are_json_schema_2020_12(tool):
    for key in ("inputSchema", "outputSchema"):
        Draft202012Validator.check_schema(tool[key])
        assert tool[key]["type"] == "object", key


@pytest.mark.parametrize("tool", TOOLS, ids=[t["name"] for t in TOOLS])
def test_input_schema_passes_openai_strict_mode(tool):
    converted = strict_schema(tool["inputSchema"])
    assert strict_problems(converted) == []
    Draft202012Validator.check_schema(converted)


def test_strict_check_refuses_a_map():
    old_env = {"type": "object", "properties": {"env": {"type": "object", "properties": {},
                                                        "additionalProperties": {"type": "string"}}}}
    with pytest.raises(NotStrict, match="additionalProperties"):
        strict_schema(old_env)
    converted = strict_schema({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
                               "required": ["a"]})
    assert converted["required"] == ["a", "b"] and converted["additionalProperties"] is False
    assert converted["properties"]["b"]["type"] == ["integer", "null"]


def test_env_takes_the_list_and_the_map():
    (init,) = [t for t in TOOLS if t["name"] == "initialize_sandbox"]
    validator = Draft202012Validator(init["inputSchema"])
    validator.validate({"env": [{"name": "A", "value": "1"}]})
    assert "accepted too" in init["inputSchema"]["properties"]["env"]["description"]


def test_golden_file_covers_every_tool_and_group():
    assert [t["name"] for t in GOLDEN] == [t["name"] for t in TOOLS]
    for tool, listed in zip(TOOLS, GOLDEN):
        assert listed["title"] == tool["title"]
        assert listed["annotations"] == {"title": tool["title"], **tool["annotations"]}
        Draft202012Validator.check_schema(listed["inputSchema"])
    assert {t["group"] for t in TOOLS} == {g["name"] for g in GROUPS}


def test_every_group_in_help_and_every_default_group_first():
    names = [g["name"] for g in GROUPS]
    assert "all" not in names
    defaults = [g["default"] for g in GROUPS]
    assert defaults == sorted(defaults, reverse=True), "default groups come first in index.json"


def test_readme_tool_tables_are_current():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "tool-table"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _references(node):
    if isinstance(node, list):
        return [name for item in node for name in _references(item)]
    if not isinstance(node, dict):
        return []
    names = [name for key, value in node.items() if key == "$shared"
             for name in (value if isinstance(value, list) else [value])]
    return names + [name for value in node.values() for name in _references(value)]


def test_every_shared_fragment_is_used():
    directory = REPO / "src" / "tools" / "catalogue"
    shared = json.loads((directory / "shared.json").read_text())
    used = set()
    for path in directory.glob("*.json"):
        if path.name != "index.json":
            used.update(_references(json.loads(path.read_text())))
    assert set(shared) - used == set()
