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

from workers.tools.reference.causal_hift import (
    causal_hift_key_differences,
    check_causal_hift,
    check_causal_session,
    load_reference_causal_hift,
)
from workers.tools.reference.configs import (
    causal_hift_config_from_reference,
    dit_flow_config_from_reference,
    reference_family,
)
from workers.tools.reference.cosyvoice3_llm import (
    check_cosyvoice3_llm,
    cosyvoice3_llm_key_differences,
)
from workers.tools.reference.dit_flow import (
    check_dit_flow,
    dit_flow_key_differences,
    load_reference_dit_flow,
)
from workers.tools.reference.features import check_features
from workers.tools.reference.flow import check_flow, check_flow_full_keys
from workers.tools.reference.hift import check_hift, check_hift_full_keys
from workers.tools.reference.llm import check_llm, check_llm_full_keys
from workers.tools.reference.parity import REFERENCE_ARRAY_FILES, ArrayCheck, ReferenceSet
from workers.tools.reference.streaming import check_streaming

REQUIRED_FILES = ("config.json", "llm.pt", "flow.pt", "hift.pt", *REFERENCE_ARRAY_FILES)
# flow.pt is most of a set's size (59.5 of 73 MB): a set carried to a GPU machine (64 MiB in
# all) leaves it out and checks the other stages there ("session" is CosyVoice 3's flow + HiFT).
FLOW_WEIGHTS = "flow.pt"
FLOW_STAGES = frozenset({"flow", "stream", "session"})
StageCheck = Callable[[ReferenceSet, torch.device], list[ArrayCheck]]
KeyCheck = tuple[str, Callable[[ReferenceSet], list[str]]]
STAGE_CHECKS: dict[str, StageCheck] = {
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


def _session(ref: ReferenceSet, device: torch.device) -> list[ArrayCheck]:
    flow, hift = load_reference_dit_flow(ref, device), load_reference_causal_hift(ref, device)
    return check_causal_session(ref, flow, hift)


def _hift3_keys(ref: ReferenceSet) -> list[str]:
    config = causal_hift_config_from_reference(ref.config, "full")
    listings = ("keys-hift.txt", "keys-hift-legacy-weightnorm.txt")
    return [
        p
        for name in listings
        if ref.has(name)
        for p in causal_hift_key_differences(config, ref.root / name)
    ]


# CosyVoice 3 sets (`reference_family`): the same stage names where the stage exists;
# "session" is flow + HiFT in the official streaming schedule (`CausalTokenStream`).
STAGE_CHECKS3: dict[str, StageCheck] = {
    "llm": check_cosyvoice3_llm,
    "flow": check_dit_flow,
    "hift": check_causal_hift,
    "session": _session,
    "features": lambda ref, _device: check_features(ref),
}
FULL_KEY_CHECKS3: dict[str, KeyCheck] = {
    "llm": (
        "keys-llm.txt",
        lambda ref: cosyvoice3_llm_key_differences(ref, "full", "keys-llm.txt"),
    ),
    "flow": (
        "keys-flow.txt",
        lambda ref: dit_flow_key_differences(
            dit_flow_config_from_reference(ref.config, "full"), ref.root / "keys-flow.txt"
        ),
    ),
    "hift": ("keys-hift.txt", _hift3_keys),
}


def family_checks(ref: ReferenceSet) -> tuple[dict[str, StageCheck], dict[str, KeyCheck]]:
    """The stage and key checks for the set's model family (read from its config.json)."""
    if reference_family(ref.config) == "cosyvoice3":
        return STAGE_CHECKS3, FULL_KEY_CHECKS3
    return STAGE_CHECKS, FULL_KEY_CHECKS


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
    ref: ReferenceSet, device: torch.device, stages: tuple[str, ...] | None = None
) -> ReferenceReport:
    """The chosen stages' checks (default: all of the set's family), then the full-size key
    lists that the set carries."""
    stage_checks, key_checks = family_checks(ref)
    report = ReferenceReport()
    for stage in stages if stages is not None else tuple(stage_checks):
        report.checks += stage_checks[stage](ref, device)
        key_file, check_keys = key_checks.get(stage, ("", None))
        if check_keys is not None and ref.has(key_file):
            report.key_problems[stage] = check_keys(ref)
    return report
