"""Where Core ML runs and what its compute units are called: shared by the runtime and the
service layer's backend selection, so neither has to import the other."""

from __future__ import annotations

COREML_SUBDIR = "coreml"  # default conversion folder inside the model directory
MACOS_ONLY = "Core ML runs only on macOS; use COSYQ_BACKEND=torch"
COMPUTE_UNITS_DEVICE = {  # COSYQ_COMPUTE_UNITS -> the device string results report
    "ALL": "ane/gpu/cpu",
    "CPU_AND_NE": "ane/cpu",
    "CPU_AND_GPU": "gpu/cpu",
    "CPU_ONLY": "cpu",
}
