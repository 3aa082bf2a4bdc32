"""The gateway's folders are its layers, and the arrows run one way (docs/design.md, "Layers"):

    api -> realtime -> generation -> safety -> platform -> protocol

A module imports nothing from a layer above its own, even for type checking; the HTTP framework is
imported in api/ only, and the database toolkit in platform/storage/ only. Below the gateway, the models
(inference/) and the media (media/) import nothing of it, and no module imports itself through others. Read
from the sources."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
RANK = {"protocol": 0, "platform": 1, "safety": 2, "generation": 3, "realtime": 4, "api": 5}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(GATEWAY.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The project's modules that `path` imports, relative imports and `from package import module` included
    (type-checking imports too: they are arrows of the design as much as the others)."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found & modules


def _below_the_gateway() -> list[Path]:
    root = GATEWAY.parent
    return sorted(p for folder in ("inference", "media") for p in (root / folder).rglob("*.py"))


def _modules() -> list[Path]:
    return sorted(p for p in GATEWAY.rglob("*.py") if "migrations" not in p.parts)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(GATEWAY)))
def test_a_module_imports_nothing_from_a_layer_above_its_own(path: Path) -> None:
    layer = path.relative_to(GATEWAY).parts[0]
    if layer not in RANK:
        return  # the entry points (cli, __main__) and the bench client stand apart
    above = [name for name in _imports(path)
             if name.startswith("gateway.") and RANK.get(name.split(".")[1], -1) > RANK[layer]]
    assert not above, f"{layer}/ imports from a layer above it: {above}"


def test_each_layer_ranks_strictly_above_the_next() -> None:
    """No two layers share a rank, so no arrow may run both ways between them: platform/ (settings, logs,
    metrics) never imports safety/ (the content policy), which builds on it."""
    order = ["protocol", "platform", "safety", "generation", "realtime", "api"]
    ranks = [RANK[layer] for layer in order]
    assert ranks == sorted(set(ranks)) and len(ranks) == len(RANK)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(GATEWAY)))
def test_frameworks_stay_in_their_layer(path: Path) -> None:
    rel = path.relative_to(GATEWAY).parts
    names = [name.split(".")[0] for name in _imports(path)]
    if rel[0] != "api":
        assert not {"fastapi", "starlette"} & set(names), "the HTTP framework is imported in gateway/api/ only"
    if rel[:2] != ("platform", "storage"):
        assert "sqlalchemy" not in names, "the database toolkit is imported in gateway/platform/storage/ only"
    if rel[0] not in ("api", "bench"):
        assert "aiortc" not in names, "aiortc is imported by the WebRTC transport (and media/) only"


@pytest.mark.parametrize("path", _below_the_gateway(), ids=lambda p: str(p.relative_to(GATEWAY.parent)))
def test_the_models_and_the_media_import_nothing_of_the_gateway(path: Path) -> None:
    found = [name for name in _imports(path) if name == "gateway" or name.startswith("gateway.")]
    assert not found, f"{path.relative_to(GATEWAY.parent)} imports the gateway: {found}"


def test_no_module_imports_itself_through_others() -> None:
    paths = [p for folder in ("gateway", "inference", "media") for p in (GATEWAY.parent / folder).rglob("*.py")
             if "migrations" not in p.parts]
    modules = {_module_name(p) for p in paths}
    arrows = {_module_name(p): _imported_modules(p, modules) - {_module_name(p)} for p in paths}
    done: set[str] = set()

    def cycle_from(module: str, trail: list[str]) -> list[str] | None:
        if module in trail:
            return [*trail[trail.index(module):], module]
        if module in done:
            return None
        for imported in sorted(arrows[module]):
            if (found := cycle_from(imported, [*trail, module])) is not None:
                return found
        done.add(module)
        return None

    for module in sorted(arrows):
        assert (cycle := cycle_from(module, [])) is None, " -> ".join(cycle)
