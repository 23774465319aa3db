"""An engine factory that selects its backend the way the real pipeline must, then scripts.

`workers.pipeline:load_engine` (issue 4) calls `select_backend(settings, model_dir)` before it
loads anything; this stand-in does only that, so the worker-level refusal of Core ML on Linux
is tested before the pipeline exists. Once it does, the test can point at the real factory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.engines import ScriptedEngine
from workers.coreml.backend import select_backend


def selecting(settings: Any) -> ScriptedEngine:
    select_backend(settings, settings.model_dir or Path.cwd())
    return ScriptedEngine(name="test-backend-selected")
