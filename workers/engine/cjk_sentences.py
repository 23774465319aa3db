"""Chinese and Japanese sentences in one CJK span: each read in its own language.

A span of Han and kana is Japanese when it holds kana (`text_spans.japanese_kana`), so a
paragraph of a Chinese sentence and a Japanese one was read wholly as Japanese ("我们2024年去了
东京。" 二千二十四年, not 二零二四年). A span with kana is therefore read sentence by sentence
(`shared.sentences`, the engine's rule) when it also holds a sentence that is Chinese:

- a sentence with kana is Japanese;
- a sentence without kana is Chinese when the request's language is `zh`, or, under `auto`,
  when it shows Chinese: a full-width comma "，" (Japanese writes "、") or a character Japanese
  does not write (`chinese_characters`, derived from OpenCC's tables: simplified forms such as
  这 们 说 时 气 务 联, less Japanese shinjitai and everyday kanji; particles such as 吗 呢 吧);
- any other sentence (Han only, nothing Chinese in it: "東京都港区。") is what the sentence before
  it is, the first one what the first decided sentence is: a kanji-only sentence between
  Japanese ones stays Japanese.

Under `ja` every sentence is Japanese, as before; a span without kana is Chinese, as before.
"""

from __future__ import annotations

from typing import Literal

from shared.sentences import split_sentences
from workers.engine.chinese_characters import chinese_only
from workers.engine.text_spans import japanese_kana

CjkLanguage = Literal["zh", "ja"]


def shows_chinese(sentence: str) -> bool:
    """True for a sentence with a full-width comma or a character only Chinese writes."""
    chinese = chinese_only()
    return any(character == "，" or character in chinese for character in sentence)


def _own(sentence: str, requested: str) -> CjkLanguage | None:
    """A sentence's language if it says one itself (the module's rule), else None."""
    if japanese_kana(sentence):
        return "ja"
    if requested == "zh" or shows_chinese(sentence):
        return "zh"
    return None


def sentence_languages(text: str, requested: str) -> list[tuple[str, CjkLanguage]]:
    """A CJK span as (sentence, language) pairs joining back to `text`: one pair when it is
    one language (no kana: Chinese; `ja`, or no sentence of it Chinese: Japanese)."""
    whole: CjkLanguage = "ja" if requested == "ja" or japanese_kana(text) else "zh"
    if whole == "zh" or requested == "ja":
        return [(text, whole)]
    sentences = split_sentences(text)
    own = [_own(sentence, requested) for sentence in sentences]
    if "zh" not in own:
        return [(text, "ja")]
    language: CjkLanguage = next(lang for lang in own if lang)
    pairs: list[tuple[str, CjkLanguage]] = []
    for sentence, said in zip(sentences, own, strict=True):
        language = said or language
        if pairs and pairs[-1][1] == language:
            pairs[-1] = (pairs[-1][0] + sentence, language)
        else:
            pairs.append((sentence, language))
    return pairs
