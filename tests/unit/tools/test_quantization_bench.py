"""`bench quantization`: cheap to register, and its flags are checked before any work."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from workers.tools.bench.quantization_cli import register_bench


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser()
    register_bench(root.add_subparsers())
    return root


def test_registering_imports_neither_torch_nor_coremltools() -> None:
    code = (
        "import sys, argparse; from workers.tools.bench.quantization_cli import register_bench; "
        "register_bench(argparse.ArgumentParser().add_subparsers()); "
        "print('torch' in sys.modules, 'coremltools' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False"]


def test_unknown_variants_are_refused_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args(["quantization", "--reference", "x", "--variants", "fp16,int4"])
    assert args.handler(args) == 2
    assert "--variants: unknown ['int4']" in capsys.readouterr().err


def test_a_model_source_is_required() -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["quantization"])
