"""Folder settings: an empty value is refused (it read as the current folder), a file where a
folder goes is refused at load (it was a bare FileExistsError once the model had loaded), `~` is
the home folder and a relative path is made absolute; an S3 endpoint needs its scheme."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import SettingsError
from shared.settings import load_settings
from shared.settings_paths import FOLDER_FIELDS

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/unit/conftest.py


@pytest.mark.parametrize("name", sorted(FOLDER_FIELDS))
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_folder_is_refused(name: str, empty: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"COSYQ_{name.upper()}", empty)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert str(caught.value) == (
        f"invalid settings: COSYQ_{name.upper()}: Value error, is empty: "
        f"{FOLDER_FIELDS[name]} (got {empty!r})"
    )


@pytest.mark.parametrize("name", sorted(FOLDER_FIELDS))
def test_a_file_where_a_folder_goes_is_refused(
    name: str, clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (clean_env / "afile").write_text("x")
    monkeypatch.setenv(f"COSYQ_{name.upper()}", str(clean_env / "afile"))
    with pytest.raises(SettingsError, match=f"COSYQ_{name.upper()}: Value error, is a file, not"):
        load_settings()
    monkeypatch.setenv(f"COSYQ_{name.upper()}", str(clean_env / "afile" / "below"))
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert f"lies under the file {clean_env / 'afile'}, not a folder" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_relative_folder_is_made_absolute_and_tilde_is_home(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COSYQ_MODEL_DIR", "models/CosyVoice2-0.5B")
    monkeypatch.setenv("COSYQ_HASH_CACHE_DIR", "~/hashes")
    settings = load_settings()
    assert settings.model_dir == clean_env.resolve() / "models" / "CosyVoice2-0.5B"
    assert settings.hash_cache_dir == Path.home() / "hashes"


def test_a_folder_that_does_not_exist_yet_is_taken(clean_env: Path) -> None:
    settings = load_settings(model_dir=clean_env / "later", ort_cache_dir=clean_env / "a" / "b")
    assert settings.model_dir == clean_env / "later"
    assert settings.ort_cache_dir == clean_env / "a" / "b"


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("minio:9000", "must start with http:// or https://"),
        ("", "must start with http:// or https://"),
        ("ak:endpoint-secret-5M@minio:9000", "must start with http:// or https://"),
    ],
)
def test_an_s3_endpoint_needs_its_scheme(
    endpoint: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # botocore refused "minio:9000" only when a worker first wrote ("Invalid endpoint")
    monkeypatch.setenv("COSYQ_S3_ENDPOINT_URL", endpoint)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert str(caught.value).startswith(
        f"invalid settings: COSYQ_S3_ENDPOINT_URL: Value error, {why}"
    )
    assert "endpoint-secret-5M" not in str(caught.value)
    monkeypatch.setenv("COSYQ_S3_ENDPOINT_URL", "https://s3.example:9000")
    assert load_settings().s3_endpoint_url == "https://s3.example:9000"
