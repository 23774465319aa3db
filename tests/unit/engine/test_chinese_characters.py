"""Which language a kana-less sentence in a paragraph with kana is read in: Chinese news lines
and Japanese kanji-only lines (headlines, names, set phrases). The hand-picked list of 70
characters missed most Chinese headlines without a full-width comma ("美联储宣布加息。" was
read as Japanese: 二千二十四年 for a Chinese 2024年); the set is now derived from OpenCC's
tables (`chinese_characters`)."""

from __future__ import annotations

import pytest

from workers.engine.chinese_characters import chinese_only
from workers.engine.cjk_sentences import sentence_languages
from workers.engine.normalizer import TextNormalizer

JAPANESE = "今日は晴れです。"  # a sentence with kana: the paragraph is judged sentence by sentence

CHINESE_LINES = [
    "美联储宣布加息。",
    "国务院发布新规定。",
    "央行下调存款准备金率。",
    "新华社记者报道。",
    "上海股市收盘上涨。",
    "北京举行国际马拉松比赛。",
    "全国人大常委会审议草案。",
    "专家预计经济将继续复苏。",
    "地震造成三人受伤。",
    "乡村振兴取得成效。",
    "中国队获得金牌。",
    "铁路客运量创历史新高。",
    "嫦娥六号完成采样。",
    "气温将降至零下。",
    "这家公司去年营收增长。",
    "台风登陆广东沿海。",
    "外交部发言人答记者问。",
    "春运首日旅客发送量达千万人次。",
    "证监会加强上市公司监管。",
    "深圳房价连续下跌。",
]
JAPANESE_LINES = [
    "東京都港区。",
    "日本経済新聞社。",
    "内閣総理大臣。",
    "国会議事堂前。",
    "机上空論。",
    "猪突猛進。",
    "携帯電話。",
    "剥離骨折。",
    "厨房設備点検。",
    "大阪府知事選挙。",
    "台風十号接近。",
    "本日晴天。",
    "株価急落。",
    "新型車両導入。",
    "学校給食。",
]


@pytest.mark.parametrize("line", CHINESE_LINES)
def test_a_chinese_news_line_beside_japanese_is_chinese(line: str) -> None:
    assert sentence_languages(JAPANESE + line, "auto") == [(JAPANESE, "ja"), (line, "zh")]


@pytest.mark.parametrize("line", JAPANESE_LINES)
def test_a_kanji_only_japanese_line_stays_japanese(line: str) -> None:
    assert sentence_languages(JAPANESE + line, "auto") == [(JAPANESE + line, "ja")]


def test_the_set_is_simplified_forms_less_japanese_ones_and_the_particles() -> None:
    chinese = chinese_only()
    assert set("这们说时气务联华马吗呢吧您") <= chinese
    assert not set("国学会来点写机猪携干后台") & chinese  # shinjitai, everyday kanji, both ways
    assert len(chinese) > 3000


def test_a_chinese_headline_year_is_read_in_chinese() -> None:
    spoken = TextNormalizer(enabled=True)(JAPANESE + "美联储2024年宣布加息。", "auto")
    assert spoken == JAPANESE + "美联储二零二四年宣布加息。"
