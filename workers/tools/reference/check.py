"""`cosyq-worker model check-reference DIR`: our stages against an official reference set.

Runs every stage's parity checks (LLM, flow, HiFT, audio features) on the set's tiny
checkpoints and, when the full-size key lists are present, checks that the FULL configuration
built on the meta device has exactly the official keys and shapes. One line per array; the
run fails if any gated check exceeds its tolerance or any key list differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from workers.tools.reference.features import check_features
from workers.tools.reference.flow import check_flow, check_flow_full_keys
from workers.tools.reference.hift import check_hift, check_hift_full_keys
from workers.tools.reference.llm import check_llm, check_llm_full_keys
from workers.tools.reference.parity import REFERENCE_ARRAY_FILES, ArrayCheck, ReferenceSet
from workers.tools.reference.streaming import check_streaming

REQUIRED_FILES = ("config.json", "llm.pt", "flow.pt", "hift.pt", *REFERENCE_ARRAY_FILES)
# flow.pt is most of a set's size (59.5 of 73 MB): a set carried to a GPU machine (64 MiB in
# all) leaves it out and checks the other stages there.
FLOW_WEIGHTS = "flow.pt"
FLOW_STAGES = frozenset({"flow", "stream"})
STAGE_CHECKS: dict[str, Callable[[ReferenceSet, torch.device], list[ArrayCheck]]] = {
    "llm": check_llm,
    "flow": check_flow,
    "stream": check_streaming,  # the engine's chunked streaming flow
    "hift": check_hift,
    "features": lambda ref, _device: check_features(ref),
}
FULL_KEY_CHECKS: dict[str, tuple[str, Callable[[ReferenceSet], list[str]]]] = {
    "llm": ("keys-llm.txt", check_llm_full_keys),
    "flow": ("keys-flow.txt", check_flow_full_keys),
    "hift": ("keys-hift.txt", check_hift_full_keys),
}


@dataclass
class ReferenceReport:
    """Every array check and every full-size key-list difference of one run."""

    checks: list[ArrayCheck] = field(default_factory=list)
    key_problems: dict[str, list[str]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        problems = any(self.key_problems.values())
        return all(c.passed for c in self.checks) and not problems

    def lines(self) -> list[str]:
        rows = [_format(c) for c in self.checks]
        for stage, problems in self.key_problems.items():
            verdict = "ok  " if not problems else "FAIL"
            rows.append(f"{verdict} full-size keys {stage}: {len(problems)} differences")
            rows.extend(f"       {p}" for p in problems[:20])
        return rows


def _format(check: ArrayCheck) -> str:
    verdict = "ok  " if check.passed else "FAIL"
    if not check.gated:
        verdict = "info"
    text = (
        f"{verdict} {check.name:<52} max|err| {check.max_abs_error:.3e}  tol {check.tolerance:.1e}"
    )
    return text + (f"  ({check.detail})" if check.detail else "")


def missing_files(ref: ReferenceSet, stages: tuple[str, ...] = ()) -> list[str]:
    """The files `stages` need that the set lacks (no stages named: every stage's)."""
    needs_flow = not stages or bool(FLOW_STAGES & set(stages))
    required = [n for n in REQUIRED_FILES if needs_flow or n != FLOW_WEIGHTS]
    return [name for name in required if not ref.has(name)]


def run_reference_checks(
    ref: ReferenceSet, device: torch.device, stages: tuple[str, ...] = tuple(STAGE_CHECKS)
) -> ReferenceReport:
    """The chosen stages' checks, then the full-size key lists that the set carries."""
    report = ReferenceReport()
    for stage in stages:
        report.checks += STAGE_CHECKS[stage](ref, device)
        key_file, check_keys = FULL_KEY_CHECKS.get(stage, ("", None))
        if check_keys is not None and ref.has(key_file):
            report.key_problems[stage] = check_keys(ref)
    return report
