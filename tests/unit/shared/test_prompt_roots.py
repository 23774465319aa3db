"""COSYQ_PROMPT_ROOTS is checked where a file really is: symlinks resolved on both sides."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import InvalidRequestError
from shared.prompt_uris import PromptRoots


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    (tmp_path / "root" / "voices").mkdir(parents=True)
    (tmp_path / "root" / "voices" / "a.wav").write_bytes(b"RIFF")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.wav").write_bytes(b"RIFF")
    return tmp_path


def test_file_and_folder_links_leading_out_are_refused(layout: Path) -> None:
    roots = PromptRoots((str(layout / "root"),))
    (layout / "root" / "file.wav").symlink_to(layout / "outside" / "secret.wav")
    (layout / "root" / "folder").symlink_to(layout / "outside", target_is_directory=True)
    (layout / "root" / "up").symlink_to("..", target_is_directory=True)  # relative, to the parent
    for path in ("file.wav", "folder/secret.wav", "up/outside/secret.wav"):
        with pytest.raises(InvalidRequestError, match="symlink, or under one, that leads outside"):
            roots.check((layout / "root" / path).as_uri())


def test_links_that_stay_inside_and_linked_roots_are_followed(layout: Path) -> None:
    (layout / "root" / "same.wav").symlink_to(layout / "root" / "voices" / "a.wav")
    (layout / "root" / "v").symlink_to("voices", target_is_directory=True)
    (layout / "linked-root").symlink_to(layout / "root", target_is_directory=True)
    for root in (layout / "root", layout / "linked-root"):
        roots = PromptRoots((str(root),))
        for path in ("voices/a.wav", "same.wav", "v/a.wav", "not-there-yet.wav"):
            roots.check((root / path).as_uri())


def test_a_path_outside_the_roots_is_still_refused_as_before(layout: Path) -> None:
    roots = PromptRoots((str(layout / "root"), "s3://bucket/voices"))
    uri = (layout / "outside" / "secret.wav").as_uri()
    with pytest.raises(InvalidRequestError, match="is outside the folders"):
        roots.check(uri)
    roots.check("s3://bucket/voices/a.wav")
