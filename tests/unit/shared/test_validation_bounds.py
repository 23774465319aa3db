"""A request naming many fields the contract lacks: its message names the first few, then how
many more, for a job and a document alike (a document's named every one: 30,000 unknown keys
made 690 KB of answer), and it is found before pydantic builds an error of each."""

from __future__ import annotations

import pytest

from shared.documents import DocumentLimits, validate_document
from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits, SynthesisRequest, validate_request
from shared.validation_messages import unknown_fields

MANY = {f"k{n:05d}": 0 for n in range(30_000)}
FIRST_FEW = "; ".join(f"k{n:05d}: unknown field" for n in range(5)) + "; and 29995 more"


@pytest.mark.parametrize(
    "check",
    [
        lambda: validate_request({"text": "Hi.", **MANY}, RequestLimits()),
        lambda: validate_document({"text": "Hi. There.", **MANY}, DocumentLimits()),
    ],
    ids=["job", "document"],
)
def test_many_unknown_fields_are_named_first_few_then_counted(check: object) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check()  # type: ignore[operator]
    assert str(caught.value) == FIRST_FEW


def test_a_documents_other_errors_are_cut_like_a_jobs() -> None:
    bad = {"text": "Hi. There.", "speed": 9, "seed": "x", "format": 1, "priority": 2, "mode": 3}
    with pytest.raises(InvalidRequestError) as caught:
        validate_document({**bad, "voice": 4, "language": 5}, DocumentLimits())
    assert str(caught.value).endswith("; and 2 more")


def test_a_few_unknown_fields_are_left_to_pydantic_beside_the_other_errors() -> None:
    assert unknown_fields({"text": "Hi.", "colour": "red"}, SynthesisRequest) is None
    with pytest.raises(InvalidRequestError, match=r"^text: required; colour: unknown field$"):
        validate_request({"colour": "red"}, RequestLimits())
