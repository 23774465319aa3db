"""The cache folders a worker writes are those its settings use, and one it cannot write is
one line naming the setting (the start refused: tests/integration/service/test_cache_folders.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import SettingsError
from shared.settings import load_settings
from workers.service.cache_folders import check_worker_folders, worker_folders

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/unit/conftest.py


def test_the_folders_a_worker_writes_are_those_its_settings_use(clean_env: Path) -> None:
    plain = load_settings(llm_precision="native")
    assert worker_folders(plain, platform="linux") == ["hash_cache_dir"]
    assert worker_folders(plain, platform="darwin") == ["hash_cache_dir", "coreml_cache_dir"]
    every = load_settings(compile_decode=True, llm_precision="int8", backend="coreml")
    assert worker_folders(every, platform="darwin") == [
        "hash_cache_dir",
        "compile_cache_dir",
        "ort_cache_dir",
        "coreml_cache_dir",
    ]
    assert worker_folders(load_settings(backend="torch"), platform="darwin") == ["hash_cache_dir"]


def test_a_cache_folder_that_cannot_be_made_is_one_line(clean_env: Path) -> None:
    # /proc takes no new folder, for root too (a 0555 folder as a service user: the
    # integration test tests/integration/service/test_cache_folders.py)
    settings = load_settings(compile_decode=True, compile_cache_dir="/proc/cosyq/inductor")
    with pytest.raises(SettingsError) as caught:
        check_worker_folders(settings, platform="linux")
    assert str(caught.value).startswith(
        "COSYQ_COMPILE_CACHE_DIR=/proc/cosyq/inductor cannot be written by this process ("
    )
    assert "\n" not in str(caught.value)
    fine = load_settings(hash_cache_dir=clean_env / "a" / "b")
    check_worker_folders(fine, platform="linux")
    assert list((clean_env / "a" / "b").iterdir()) == []
