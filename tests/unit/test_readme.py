"""README.md stays true of the code: its configuration table is the one Settings prints, it
names no unknown variable, and every name, error class and path it quotes exists."""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

import producer
from shared.settings import Settings
from shared.settings_env import ENV_PREFIX, NON_SETTINGS_VARIABLES

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
CODE_FOLDERS = ("shared", "producer", "workers", "scripts")
TABLE_HEADER = "| variable | default | meaning |"

# `webhook_superseded`, `error_kind`, `max_queued_jobs`: a log event, field, code or quota name.
QUOTED_NAME = re.compile(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`")
# `shared.storage_probe.probe_storage`: a module, or a name defined in one.
QUOTED_DOTTED = re.compile(r"`((?:shared|producer|workers)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")
# `producer/http/read_deadline.py`, (docs/benchmarks.md): a file or folder of the repository.
QUOTED_PATH = re.compile(
    r"[`(]((?:shared|producer|workers|tests|scripts|deploy|docs)/[A-Za-z0-9_./-]*)[`)]"
)


def _docs() -> str:
    return README.read_text() + ARCHITECTURE.read_text()


@functools.cache
def _code() -> str:
    return "\n".join(
        path.read_text() for folder in CODE_FOLDERS for path in (ROOT / folder).rglob("*.py")
    )


@functools.cache
def _code_words() -> frozenset[str]:
    return frozenset(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", _code()))


def _settings_table() -> list[str]:
    script = ROOT / "scripts" / "settings_table.py"
    spec = importlib.util.spec_from_file_location("settings_table", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows: list[str] = module.rows()
    return rows


def _readme_table() -> list[str]:
    lines = README.read_text().splitlines()
    start = lines.index(TABLE_HEADER)
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_every_setting_is_in_the_configuration_table() -> None:
    text = README.read_text()
    missing = [
        ENV_PREFIX + name.upper()
        for name in Settings.model_fields
        if f"| `{ENV_PREFIX}{name.upper()}` |" not in text
    ]
    assert missing == [], "run scripts/settings_table.py and update README.md"


def test_the_configuration_table_is_what_settings_table_prints() -> None:
    """Defaults and meanings too, in the script's order: pasting its output changes nothing."""
    assert _readme_table() == _settings_table(), "paste scripts/settings_table.py's output"


def test_readme_names_only_real_variables() -> None:
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields} | NON_SETTINGS_VARIABLES
    named = set(re.findall(r"COSYQ_[A-Z0-9_]+", README.read_text()))
    assert named - known == set()


def test_every_quoted_name_is_in_the_code() -> None:
    """A log event, error code, field or metric quoted in backticks is a word of the code (a
    Prometheus counter is quoted with the `_total` its client adds)."""
    words = _code_words()
    unknown = sorted(
        name
        for name in set(QUOTED_NAME.findall(_docs()))
        if name not in words and name.removesuffix("_total") not in words
    )
    assert unknown == []


def _module_source(parts: list[str]) -> tuple[Path, list[str]] | None:
    """The longest leading run of `parts` that is a module's file, and the names after it."""
    for cut in range(len(parts), 0, -1):
        folder = ROOT.joinpath(*parts[:cut])
        for source in (folder.with_suffix(".py"), folder / "__init__.py"):
            if source.exists():
                return source, parts[cut:]
    return None


def _defines(source: Path, name: str) -> bool:
    pattern = (
        rf"^\s*(?:(?:async\s+)?def|class)\s+{name}\b|^{name}\s*[:=]|^from\s.*\bimport\b.*\b{name}\b"
    )
    return re.search(pattern, source.read_text(), re.M) is not None


def test_every_quoted_dotted_path_names_a_module_or_what_it_defines() -> None:
    """Or a job function's name as RQ stores it (`workers.documents.assemble_document`, mapped
    to its module by the worker's allow-list)."""
    unknown = []
    for dotted in sorted(set(QUOTED_DOTTED.findall(_docs()))):
        found = _module_source(dotted.split("."))
        if f'"{dotted}"' in _code() or (found is not None and found[1] == []):
            continue
        if found is None or len(found[1]) > 2:
            unknown.append(dotted)  # a module, a name in it, or a class and its method
        elif not all(_defines(found[0], name) for name in found[1]):
            unknown.append(dotted)
    assert unknown == []


def test_every_quoted_repository_path_exists() -> None:
    missing = sorted(p for p in set(QUOTED_PATH.findall(_docs())) if not (ROOT / p).exists())
    assert missing == []


def test_every_error_the_readme_names_is_importable_from_producer() -> None:
    """`from producer import JobCanceledError` works for each error class the README names."""
    named = set(re.findall(r"\b([A-Z][A-Za-z]*Error)\b", README.read_text()))
    assert "JobCanceledError" in named
    assert sorted(name for name in named if not hasattr(producer, name)) == []
