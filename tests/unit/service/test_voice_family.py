"""A voice records the model family it was extracted for; a worker of the other family refuses
it by name, before the checkpoint check (which would only say "other weights")."""

from __future__ import annotations

import numpy as np
import pytest

from shared.errors import VoiceMismatchError
from shared.voices import VoiceSummary
from workers.engine.api import ModelIdentity, VoicePrompt
from workers.voices.profiles import profile_from_prompt, prompt_from_profile

CV2 = ModelIdentity("CosyVoice2-0.5B", "a" * 16, "torch", "cpu")
CV3 = ModelIdentity("Fun-CosyVoice3-0.5B", "b" * 16, "torch", "cpu", family="cosyvoice3")
PROMPT = VoicePrompt(
    speech_tokens=np.arange(4, dtype=np.int32),
    mel=np.zeros((8, 80), dtype=np.float32),
    embedding=np.zeros(192, dtype=np.float32),
    transcript="hello",
)


def profile(identity: ModelIdentity) -> object:
    return profile_from_prompt(
        "anna", PROMPT, identity=identity, source_sample_rate=24000, source_seconds=1.0
    )


def test_a_voice_is_stamped_with_its_family_and_used_by_that_family() -> None:
    made = profile(CV3)
    assert made.summary.family == "cosyvoice3"  # type: ignore[attr-defined]
    assert prompt_from_profile(made, CV3).transcript == "hello"  # type: ignore[arg-type]


@pytest.mark.parametrize(("made_by", "used_by"), [(CV2, CV3), (CV3, CV2)])
def test_the_other_family_refuses_it_naming_both(
    made_by: ModelIdentity, used_by: ModelIdentity
) -> None:
    names = {"cosyvoice2": "CosyVoice 2", "cosyvoice3": "CosyVoice 3"}
    with pytest.raises(VoiceMismatchError) as refused:
        prompt_from_profile(profile(made_by), used_by)  # type: ignore[arg-type]
    message = str(refused.value)
    assert f"'anna' was extracted for {names[made_by.family]}" in message
    assert f"this worker serves {names[used_by.family]}" in message


def test_profiles_from_before_cosyvoice3_are_cosyvoice2s() -> None:
    doc = profile(CV2).summary.to_dict()  # type: ignore[attr-defined]
    del doc["family"]
    assert VoiceSummary.from_dict(doc).family == "cosyvoice2"
