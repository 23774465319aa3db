"""The test processes' scheduler (tests/conftest.py): its units exist and keep their promises."""

from __future__ import annotations

import ast
from collections import OrderedDict
from pathlib import Path
from typing import Any

from tests.conftest import (
    OWN_CONVERSION_FILES,
    OWN_CONVERSION_UNIT,
    REPO_ROOT,
    SHARED_CONVERSION_FOLDER,
    SLOW_UNITS_FIRST,
    FilesAndConversionScheduling,
)

SESSION_CONVERSIONS = {"converted", "converted3", "converted_programs"}


def fixture_names(path: Path) -> set[str]:
    """Every argument name of a function in the file: the fixtures its tests and fixtures take."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            names.update(arg.arg for arg in node.args.args)
    return names


def test_every_slow_unit_is_a_file_or_a_coreml_unit() -> None:
    for unit in SLOW_UNITS_FIRST:
        if unit not in (SHARED_CONVERSION_FOLDER, OWN_CONVERSION_UNIT):
            assert (REPO_ROOT / unit).is_file(), unit
    assert len(set(SLOW_UNITS_FIRST)) == len(SLOW_UNITS_FIRST)


def test_the_own_conversion_files_take_no_session_conversion() -> None:
    """Run beside the folder's other unit, they would wait on its file lock if they did."""
    for name in OWN_CONVERSION_FILES:
        path = REPO_ROOT / name
        assert path.is_file(), name
        assert fixture_names(path) & SESSION_CONVERSIONS == set(), name


class Node:
    def __init__(self) -> None:
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def scheduler(nodeids: list[str], node: Node) -> Any:
    """The scheduler's state after collection, without xdist's controller around it."""
    sched = FilesAndConversionScheduling.__new__(FilesAndConversionScheduling)
    sched.workqueue = OrderedDict()
    for nodeid in nodeids:
        sched.workqueue.setdefault(sched._split_scope(nodeid), {})[nodeid] = False
    sched.assigned_work = {node: {}}
    sched.registered_collections = {node: nodeids}
    return sched


def test_the_coreml_folder_is_two_units_and_other_files_one_each() -> None:
    sched = scheduler([], Node())
    assert sched._split_scope("tests/unit/coreml/test_llm.py::test_x") == OWN_CONVERSION_UNIT
    assert sched._split_scope("tests/unit/coreml/test_compress.py::test_x[a]") == (
        SHARED_CONVERSION_FOLDER
    )
    assert sched._split_scope("tests/unit/shared/test_jobs.py::test_x") == (
        "tests/unit/shared/test_jobs.py"
    )


def test_the_next_unit_goes_out_when_one_test_is_left_not_two() -> None:
    node = Node()
    ids = ["a.py::t1", "a.py::t2", "a.py::t3", "b.py::t1", "c.py::t1"]
    sched = scheduler(ids, node)
    sched._assign_work_unit(node)
    assert node.sent == [[0, 1, 2]]
    sched.assigned_work[node]["a.py"]["a.py::t1"] = True
    sched._reschedule(node)  # two left: t2 runs, t3 is known
    assert node.sent == [[0, 1, 2]]
    sched.assigned_work[node]["a.py"]["a.py::t2"] = True
    sched._reschedule(node)  # t3 waits to know what follows it
    assert node.sent == [[0, 1, 2], [3]]
    sched.assigned_work[node]["a.py"]["a.py::t3"] = True
    sched._reschedule(node)
    assert node.sent == [[0, 1, 2], [3], [4]]
    sched._reschedule(node)
    assert node.shutting_down
