"""Print the README's configuration table from `Settings` (run: python scripts/settings_table.py).

tests/unit/test_readme.py checks that the README lists every setting, so regenerate after
adding one.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.settings import ENV_PREFIX, Settings

SHOWN_DEFAULTS = {
    "storage_url": "file URL of ./cosyq-output",
    "coreml_cache_dir": "~/.cache/cosyq/coreml",
    "hash_cache_dir": "~/.cache/cosyq/hashes",
    "compile_cache_dir": "~/.cache/cosyq/inductor",
    "ort_cache_dir": "~/.cache/cosyq/onnx",
}


def rows() -> list[str]:
    lines = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        if name in SHOWN_DEFAULTS:
            default = SHOWN_DEFAULTS[name]
        else:
            default = "-" if field.default is None else str(field.default)
        meaning = (field.description or "").replace("|", "\\|")
        lines.append(f"| `{ENV_PREFIX}{name.upper()}` | `{default}` | {meaning} |")
    return lines


if __name__ == "__main__":
    print("\n".join(rows()))
