"""docs/configuration.md's options table is the one the settings generate, and the docs name no flag that does not
exist: every `--flag` in README.md and docs/*.md is one of `gateway serve`'s (or of another command the docs run,
read from its own parser), or on the short allow-list below."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

import pytest

from gateway.platform import config_docs

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / "docs" / "configuration.md"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")

# Flags of tools that are not ours, as the docs show them being run.
OTHER_TOOLS = {
    "--served-model-name", "--enable-prefix-caching",  # vllm serve
    "--continuous-batching", "--dtype",  # transformers serve
    "--routing-logic", "--session-key",  # vLLM production stack's router
}


def documented_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def help_flags(command: str) -> set[str]:
    """The flags `gateway <command> --help` prints: the parser's own word, not the settings' field names."""
    from gateway.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([command, "--help"])
    # argparse's option lines: two spaces, the option and its alternatives, two spaces, the help (which may name
    # other flags, and is left out).
    return {flag for line in out.getvalue().splitlines() if line.startswith("  -") and not line.startswith("   ")
            for flag in FLAG.findall(line.strip().split("  ")[0])}


def benchmark_flags() -> set[str]:
    """Every `--flag` the scripts under benchmarks/ declare with argparse's add_argument (and `--no-flag` for a
    BooleanOptionalAction)."""
    flags: set[str] = set()
    for path in (ROOT / "benchmarks").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                named = {arg.value for arg in node.args
                         if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--")}
                negated = any(kw.arg == "action" and isinstance(kw.value, ast.Attribute)
                              and kw.value.attr == "BooleanOptionalAction" for kw in node.keywords)
                flags |= named | ({f"--no-{flag[2:]}" for flag in named} if negated else set())
    return flags


def table_flags(table: str) -> set[str]:
    return {flag for line in table.splitlines()[2:] for flag in FLAG.findall(line.split(" | ")[0])}


def test_the_generated_flags_are_the_ones_gateway_serve_takes() -> None:
    assert config_docs.flags() == help_flags("serve") - {"--help"}


def test_every_option_is_in_the_table_and_every_row_is_an_option() -> None:
    documented = table_flags(config_docs.documented_table(CONFIGURATION.read_text(encoding="utf-8")))
    options = config_docs.flags()
    assert not options - documented, f"options missing from {CONFIGURATION.name}: {sorted(options - documented)}"
    assert not documented - options, f"documented options that do not exist: {sorted(documented - options)}"


def test_the_table_is_what_the_generator_prints() -> None:
    assert config_docs.documented_table(CONFIGURATION.read_text(encoding="utf-8")) == config_docs.table(), (
        "docs/configuration.md's options table is stale: run "
        "`python -m gateway.platform.config_docs --write docs/configuration.md`")


def test_the_generator_writes_between_the_markers(tmp_path: Path) -> None:
    doc = tmp_path / "configuration.md"
    doc.write_text(f"intro\n\n{config_docs.BEGIN}\nold\n{config_docs.END}\n\nnotes\n", encoding="utf-8")
    config_docs.write(doc)
    text = doc.read_text(encoding="utf-8")
    assert config_docs.documented_table(text) == config_docs.table()
    assert text.startswith("intro\n\n") and text.endswith(f"{config_docs.END}\n\nnotes\n")
    assert config_docs.main([]) == 0 and config_docs.main(["--bogus"]) == 2


def test_the_docs_name_only_flags_that_exist() -> None:
    known = (config_docs.flags() | help_flags("bench") | help_flags("cluster") | benchmark_flags()
             | {"--write"} | OTHER_TOOLS)  # --write: python -m gateway.platform.config_docs
    unknown = {f"{path.relative_to(ROOT)}: {flag}" for path in documented_docs()
               for flag in FLAG.findall(path.read_text(encoding="utf-8")) if flag not in known}
    assert not unknown, f"flags no command has: {sorted(unknown)}"
