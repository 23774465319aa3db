"""The plain-data reader of upstream's HyperPyYAML configs."""

from pathlib import Path

import pytest

from shared.errors import ModelLoadError
from workers.model.yaml_plain import TARGET_KEY, load_plain_yaml

CONFIG = """\
__set_seed: !apply:random.seed [1986]
sample_rate: 24000
token_frame_rate: 25
token_mel_ratio: 2
llm: !new:cosyvoice.llm.llm.Qwen2LM
    speech_token_size: 6561
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
        static_chunk_size: !ref <token_frame_rate> * <token_mel_ratio> # comment
hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    sampling_rate: !ref <sample_rate>
hifigan: !new:cosyvoice.hifigan.hifigan.HiFiGan
    generator: !ref <hift>
"""


def test_tags_become_plain_data_and_refs_resolve(tmp_path: Path) -> None:
    path = tmp_path / "cosyvoice2.yaml"
    path.write_text(CONFIG)
    doc = load_plain_yaml(path)
    assert doc["llm"][TARGET_KEY] == "cosyvoice.llm.llm.Qwen2LM"
    assert doc["llm"]["sampling"] == {
        TARGET_KEY: "cosyvoice.utils.common.ras_sampling",
        "top_p": 0.8,
    }
    assert doc["flow"]["estimator"]["static_chunk_size"] == 50
    assert doc["hift"]["sampling_rate"] == 24000
    assert doc["hifigan"]["generator"] == doc["hift"]
    assert doc["__set_seed"] == {TARGET_KEY: "random.seed", "args": [1986]}


def test_unknown_reference_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("a: !ref <missing>\n")
    with pytest.raises(ModelLoadError, match=r"bad\.yaml: unresolvable !ref"):
        load_plain_yaml(path)


def test_code_in_expressions_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text("a: 1\nb: !ref <a> + __import__('os').getpid()\n")
    with pytest.raises(ModelLoadError):
        load_plain_yaml(path)
