"""StorageCheck on a real storage folder: only a `storage` failure puts storage in doubt, one
probe settles it, and a failed probe is reported once and holds."""

from __future__ import annotations

import shutil
from pathlib import Path

from shared.errors import StorageError
from shared.settings import load_settings
from shared.storage import open_storage
from shared.storage_probe import ProbeOutcome, probe_storage
from workers.service.storage_check import StorageCheck


class Probed:
    """The real probe of a folder's storage, counted, and what was reported."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(exist_ok=True)
        settings = load_settings(env_file=None, storage_url=folder.as_uri())
        self.storage = open_storage(settings)
        self.probes = 0
        self.reported: list[ProbeOutcome] = []

    def probe(self) -> ProbeOutcome:
        self.probes += 1
        return probe_storage(self.storage)

    def report(self, outcome: ProbeOutcome) -> StorageError:
        self.reported.append(outcome)
        return StorageError(outcome.line)


def test_other_failures_leave_storage_trusted(tmp_path: Path) -> None:
    probed = Probed(tmp_path / "out")
    check = StorageCheck(probed.probe, probed.report)
    for kind in ("invalid_request", "transient", "internal", "worker_died"):
        check.note_failure("job-1", kind)
    assert not check.in_doubt
    assert check.recheck() is None and probed.probes == 0


def test_a_passing_probe_clears_the_doubt(tmp_path: Path) -> None:
    probed = Probed(tmp_path / "out")
    check = StorageCheck(probed.probe, probed.report)
    check.note_failure("job-1", "storage")
    assert check.in_doubt
    assert check.recheck() is None
    assert not check.in_doubt and probed.probes == 1 and probed.reported == []
    assert check.recheck() is None and probed.probes == 1  # nothing in doubt: no probe


def test_a_failing_probe_is_reported_once_and_holds(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    probed = Probed(folder)
    check = StorageCheck(probed.probe, probed.report)
    shutil.rmtree(folder)
    folder.write_text("a file where the folder was")  # fails writes for root too
    check.note_failure("job-1", "storage")
    check.note_failure("job-2", "storage")
    lost = check.recheck()
    assert isinstance(lost, StorageError)
    (outcome,) = probed.reported
    assert str(lost) == outcome.line
    assert outcome.line.startswith(f"storage {folder.as_uri()} is not usable (permanent): ")
    assert check.in_doubt and check.lost is lost
    assert check.recheck() is lost and probed.probes == 1  # settled: not probed again
