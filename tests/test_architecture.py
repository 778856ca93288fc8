"""The layout shows the architecture, and stays that way: no import loop between the package's
folders (imports inside functions count: a lazy import is still a dependency), no module
beyond 600 lines, no model family named outside its own directory and the registry (the
offline tools and the C++ core included: the tools work from the files a family declares), and
the engine's seam with a family is the typed contract (nothing probed)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from onnx_tts.families import FAMILIES

PACKAGE = Path(__file__).resolve().parents[1] / "onnx_tts"
MAX_MODULE_LINES = 600


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _node(module: str) -> str | None:
    """The folder a module belongs to (`decoding`, `server`, ...), or the module itself when
    it sits at the top of the package (`cli`, `audio`, ...). An entry script (`python -m
    onnx_tts.server`: a `__main__` module, which nothing imports) stands for itself."""
    parts = module.split(".")
    if parts[0] != "onnx_tts" or len(parts) < 2:
        return None
    return ".".join(parts[1:]) if parts[-1] == "__main__" else parts[1]


def _imports(path: Path) -> set[str]:
    """Every onnx_tts module `path` imports, at any depth (functions, TYPE_CHECKING)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("onnx_tts.")}


def folder_graph() -> dict[str, set[str]]:
    """Folder -> the folders (and top-level modules) it imports, from every import."""
    modules = {
        path: ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for path in _modules()
    }
    nodes = {_node(name) for name in modules.values()} - {None}
    graph: dict[str, set[str]] = {}
    for path, name in modules.items():
        source = _node(name)
        if source is None or source == "__init__":
            continue
        targets = {_node(target) for target in _imports(path)}
        graph.setdefault(source, set()).update(t for t in targets if t in nodes and t != source)
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_loop_finder_finds_loops():
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": set()}) == []


def test_no_import_loop_between_folders():
    graph = folder_graph()
    assert {"decoding", "pipeline", "families", "server", "deploy", "cli"} <= set(graph)
    assert loops(graph) == []


def test_no_module_over_600_lines():
    long = {
        str(path.relative_to(PACKAGE)): count
        for path in _modules()
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def _spelling(word: str) -> str:
    """A name as a pattern: '-', '_' and ' ' interchangeable."""
    return "".join("[-_ ]" if ch in "-_ " else re.escape(ch) for ch in word)


def _family_words() -> dict[str, re.Pattern[str]]:
    """Each family's names as they appear in code or prose (its registry name, its module,
    its published names), keyed by the family's directory or module under families/. A name
    that begins another family's name (moss-tts in moss-tts-nano, or in Nano's published
    graph files moss_tts_local_*) does not count where it is that longer name; the words
    spelled out below count as whole words only (nano, not nanoseconds)."""
    words: dict[str, set[str]] = {}
    for family in FAMILIES.values():
        module = family.loader.__module__.split(".")[2]  # onnx_tts.families.<module>...
        words.setdefault(module, set()).add(family.name)
        words[module].add(module)
    spelled = {"moss_tts_nano": {"nano", "moss_tts_local", "moss_tts_*"}}

    def plain(word: str) -> str:
        return re.sub("[-_ ]", "_", word.lower())

    every = {m: names | spelled.get(m, set()) for m, names in words.items()}
    patterns = {}
    for module, names in every.items():
        others = {w for m, ws in every.items() if m != module for w in ws}
        parts = []
        for word in sorted(names):
            longer = [o for o in others if plain(o).startswith(plain(word)) and len(o) > len(word)]
            tails = "|".join(sorted(_spelling(o[len(word) :]) for o in longer))
            pattern = _spelling(word) + (f"(?!{tails})" if tails else "")
            if word in spelled.get(module, ()):
                pattern = rf"\b{pattern}" + (r"\b" if word[-1].isalnum() else "")
            parts.append(pattern)
        patterns[module] = re.compile("|".join(parts), re.IGNORECASE)
    return patterns


def test_no_family_is_named_outside_its_directory_and_the_registry():
    """Every module of the package (runtime and offline tools) and of the C++ core."""
    registry = PACKAGE / "families" / "__init__.py"
    core = sorted(p for p in (PACKAGE.parent / "csrc").rglob("*") if p.suffix in (".h", ".cpp"))
    assert core
    named: dict[str, list[str]] = {}
    for module, pattern in _family_words().items():
        home = PACKAGE / "families" / module
        for path in [*_modules(), *core]:
            if path == registry or home in path.parents or path == home.with_suffix(".py"):
                continue
            if pattern.search(path.read_text(encoding="utf-8")):
                named.setdefault(module, []).append(str(path.relative_to(PACKAGE.parent)))
    assert named == {}


@pytest.mark.parametrize("folder", ["pipeline", "server", "cli.py", "deploy"])
def test_the_engine_and_interfaces_never_probe_a_model(folder):
    """The family contract is typed: what a model can do is declared, never guessed with
    getattr/hasattr on the model or its parts."""
    paths = (
        [PACKAGE / folder] if folder.endswith(".py") else sorted((PACKAGE / folder).rglob("*.py"))
    )
    probing = re.compile(r"(getattr|hasattr)\(\s*[\w.]*(model|backend|vocoder|voices|text)\b")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in paths
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if probing.search(line)
    ]
    assert found == []
