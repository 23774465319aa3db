"""Stack rows: torch and MPS, coremltools and its native runtime, onnxruntime providers,
numpy < 2.4, and the audio formats libsndfile offers.

Versions are read from package metadata where possible, so a broken install shows as a ✗ row
rather than an import error that stops the report.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

from workers.coreml.convert.compat import NUMPY_LIMIT
from workers.tools.doctor.rows import COREML_ONLY_ON_MACOS, Row, fail, ok, one_line, skip

GROUP = "stack"
TESTED_COREMLTOOLS = "9.0"  # the version our conversion workarounds are written for (compat.py)
MPS_ONLY = "MPS is Apple's GPU: macOS only"
TORCH_ROW = "torch"
MPS_ROW = "MPS built and available"
COREMLTOOLS_ROW = "coremltools"
COREML_RUNTIME_ROW = "Core ML native runtime (libcoremlpython)"
ONNXRUNTIME_ROW = "onnxruntime providers"
NUMPY_ROW = f"numpy < {'.'.join(str(v) for v in NUMPY_LIMIT)}"
SOUNDFILE_ROW = "soundfile formats"
ROW_NAMES = (  # in report order
    TORCH_ROW,
    MPS_ROW,
    COREMLTOOLS_ROW,
    COREML_RUNTIME_ROW,
    ONNXRUNTIME_ROW,
    NUMPY_ROW,
    SOUNDFILE_ROW,
)


def stack_rows(*, system: str = sys.platform, device: str = "auto") -> list[Row]:
    return [
        torch_row(),
        mps_row(system=system, device=device),
        coremltools_row(),
        coreml_runtime_row(system=system),
        onnxruntime_row(system=system),
        numpy_row(),
        soundfile_row(),
    ]


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def torch_row() -> Row:
    try:
        import torch  # noqa: PLC0415 (only when doctor runs)
    except ImportError as e:
        return fail(
            GROUP, TORCH_ROW, one_line(e), "install the worker: pip install 'cosyq[worker]'"
        )
    return ok(GROUP, TORCH_ROW, str(torch.__version__), version=str(torch.__version__))


def mps_row(*, system: str = sys.platform, device: str = "auto") -> Row:
    if system != "darwin":
        return skip(GROUP, MPS_ROW, MPS_ONLY)
    import torch  # noqa: PLC0415

    built, available = torch.backends.mps.is_built(), torch.backends.mps.is_available()
    detail = f"built {'yes' if built else 'no'}, available {'yes' if available else 'no'}"
    if available:
        return ok(GROUP, MPS_ROW, detail)
    return fail(
        GROUP,
        MPS_ROW,
        detail,
        "install the arm64 macOS torch wheel (pip install torch) on macOS 14+, or use "
        "COSYQ_DEVICE=cpu",
        required=device.startswith("mps"),
    )


def coremltools_row() -> Row:
    version = _version("coremltools")
    if version is None:
        return fail(
            GROUP,
            COREMLTOOLS_ROW,
            "not installed: no conversion, no Core ML backend",
            "pip install 'cosyq[coreml]'",
            required=False,
        )
    return ok(GROUP, COREMLTOOLS_ROW, f"{version} (we test {TESTED_COREMLTOOLS})", version=version)


def coreml_runtime_row(*, system: str = sys.platform) -> Row:
    name = COREML_RUNTIME_ROW
    if system != "darwin":
        return skip(GROUP, name, COREML_ONLY_ON_MACOS)
    if _version("coremltools") is None:
        return skip(GROUP, name, "coremltools is not installed")
    try:
        importlib.import_module("coremltools.libcoremlpython")
    except ImportError as e:
        return fail(
            GROUP,
            name,
            f"coremltools cannot predict: {one_line(e)}",
            "reinstall coremltools from its macOS arm64 wheel in an arm64 Python "
            f"(pip install --force-reinstall coremltools=={TESTED_COREMLTOOLS})",
        )
    return ok(GROUP, name, "loads: Core ML prediction available")


def onnxruntime_row(*, system: str = sys.platform) -> Row:
    try:
        import onnxruntime as ort  # noqa: PLC0415
    except ImportError as e:
        return fail(GROUP, ONNXRUNTIME_ROW, one_line(e), "pip install 'cosyq[worker]'")
    providers = ort.get_available_providers()
    detail = f"{ort.__version__}: {', '.join(providers)}"
    if system == "darwin" and "CoreMLExecutionProvider" not in providers:
        return fail(
            GROUP,
            ONNXRUNTIME_ROW,
            detail + " (no CoreMLExecutionProvider: prompt models run on the CPU)",
            "install the standard macOS onnxruntime wheel (pip install --force-reinstall "
            "onnxruntime)",
            required=False,
        )
    return ok(GROUP, ONNXRUNTIME_ROW, detail, providers=providers)


def numpy_row() -> Row:
    import numpy as np  # noqa: PLC0415

    major, minor = (int(part) for part in np.__version__.split(".")[:2])
    limit = ".".join(str(v) for v in NUMPY_LIMIT)
    if (major, minor) < NUMPY_LIMIT:
        return ok(GROUP, NUMPY_ROW, np.__version__)
    return fail(
        GROUP,
        NUMPY_ROW,
        f"numpy {np.__version__} breaks coremltools conversion (coremltools#2633)",
        f"pip install 'numpy<{limit}'",
    )


def soundfile_row() -> Row:
    from shared.audio import soundfile_codecs  # noqa: PLC0415

    try:
        import soundfile as sf  # noqa: PLC0415
    except (ImportError, OSError) as e:
        return fail(GROUP, SOUNDFILE_ROW, one_line(e), "pip install soundfile (bundles libsndfile)")
    missing = [
        f"{fmt} ({sf_format} {subtype})"
        for (fmt, sample), (sf_format, subtype) in soundfile_codecs().items()
        if sample == "pcm16" and subtype not in sf.available_subtypes(sf_format)
    ]
    detail = f"libsndfile {sf.__libsndfile_version__}"
    if missing:
        return fail(
            GROUP,
            SOUNDFILE_ROW,
            f"{detail} cannot write {', '.join(missing)}",
            "install soundfile >= 0.12 (its wheel bundles libsndfile with MP3 and Opus)",
        )
    formats = sorted({fmt for fmt, _ in soundfile_codecs()})
    return ok(GROUP, SOUNDFILE_ROW, f"{detail}: {', '.join(formats)}")
