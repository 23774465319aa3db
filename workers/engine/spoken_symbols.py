"""Rewrites before wetext, per language, for what its grammars read wrong or not at all.

English (wetext 0.1 en):
- money: "$4.50" is read "four point five dollars" and "$1,250.50" loses its "one"; a sign it
  has no grammar for ("₹500") fails the whole text. Amounts after $ € £ ¥ ₹ are written out as
  "4 dollars and 50 cents", which it reads right.
- "1,250" is read "thousand two hundred and fifty": written "1 thousand 250".
- "1990s" is read "... ninety seconds": written "19 90s" ("nineteen nineties").
- × ÷ √ ± and "#1" fail or are left unread: written as words.
- "v2.0.1" is read "v two.zero point one", "100 m/s" "... minutes per second".
Chinese: "¥88.5元" is read "八元八点五元" (the sign and the unit both as a unit): a sign
before an amount already followed by its currency's name (or 万元, 亿元) is dropped, and
"¥1,234.56万" ("一元两百三十四点五六万") is written "1234.56万元"; "¥1,250.50" is read
"一元,两百五十..." after a sign: thousands separators are dropped; √ is "根号"; a version
"v2.3.1" is read "v二.三点一": written "2点3点1"; a phone number written in groups
("+86 138 0013 8000" was "正八十六一百三十八零零十三八千", "0755-8888 6666" "零七百五十五减
...") is written digit by digit, 1 as 幺, the groups apart, "+" as 加; a range "3～5" (the
wave dash left unread) is "3到5"; a lone 2 is written 二 or 两 as Mandarin says it
(`chinese_numbers`: 3月2日 三月二日, 第2个 第二个, 2点 两点, 2次 两次).
Japanese: the same for ¥ before 円 and separators, versions, ranges (から) and phone numbers (after
"番号は" wetext read "03-1234-5678" "〇三マイナス千二百三十四..."; now "ゼロ三の一二三四の
五六七八", its own reading elsewhere); √ is "ルート"; "25℃" is read "二十五摂氏": ℃ and °C
after a number are "度".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from workers.engine.chinese_numbers import mandarin

# sign: (singular, plural, minor singular, minor plural); "" minor: amounts are read decimal
_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", "", ""),
    "₹": ("rupee", "rupees", "paisa", "paise"),
}
_SCALE = r"thousand|million|billion|trillion"
_EN_MONEY_RE = re.compile(
    r"(?P<sign>[$€£¥₹])\s?(?P<whole>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<fraction>\d+))?"
    rf"(?:\s(?P<scale>{_SCALE})\b)?(?![\d,]\d)"
)
_EN_ONE_THOUSAND_RE = re.compile(r"(?<![\d.,])1,(?P<rest>\d{3})(?!\d|,\d)")
_EN_DECADE_RE = re.compile(r"\b(?P<century>1\d|20)(?P<decade>[1-9]0)s\b")
_EN_VERSION_RE = re.compile(r"\b(?P<word>v|[Vv]ersion )(?P<number>\d+(?:\.\d+){1,3})\b")
_EN_WORDS = (
    (re.compile(r"(?<=\d)\s?m/s\b"), " meters per second"),
    (re.compile(r"\s*×\s*"), " times "),
    (re.compile(r"\s*÷\s*"), " divided by "),
    (re.compile(r"\s*±\s*"), " plus or minus "),
    (re.compile(r"√\s*"), "square root of "),
    (re.compile(r"#(?=\d)"), "number "),
)
_ZH_SIGN_BEFORE_NAME_RE = re.compile(
    r"[¥￥$€£₹]\s*(?P<amount>\d[\d,]*(?:\.\d+)?)\s*"
    r"(?=(?:[万亿]|千万|百万)?(?:元|块|圆|美元|美金|欧元|英镑|卢比))"
)
_ZH_YUAN_SCALE_RE = re.compile(r"[¥￥]\s*(?P<amount>\d[\d,]*(?:\.\d+)?)\s*(?P<scale>[万亿])(?!元)")
# A version (two dots or more: "v2.3.1") is read digit group by digit group, "二点三点一".
_VERSION_RE = re.compile(r"(?<![\d.])\d+(?:\.\d+){2,}(?![\d.])")
# A phone number read digit by digit: a mobile (138 0013 8000), a landline with its area code
# (0755-8888 6666, 010-12345678), a 400 or 800 line, each after an optional country code.
# Written in groups (a plain 13800138000 is wetext's, which reads it so already; a plain
# 15000000000 may be an amount), or after a country code.
_PHONE_RE = re.compile(
    r"(?<![\d.])(?:(?P<country>\+\d{1,3}[ -]?)(?P<mobile>1[3-9]\d{9})"
    r"|(?P<grouped>\+\d{1,3}[ -]?)?"
    r"(?P<number>1[3-9]\d[ -]\d{4}[ -]\d{4}|0\d{1,3}[ -]\d{3,4}[ -]?\d{4}"
    r"|[48]00[ -]\d{3}[ -]\d{4}))"
    r"(?![\d.])"
)
_RANGE_RE = re.compile(r"(?<=\d)\s*[～〜~]\s*(?=\d)")  # 3～5: 三到五, 三から五
_ZH_PHONE_DIGITS = "零幺二三四五六七八九"
_JA_PHONE_DIGITS = ("ゼロ", "一", "二", "三", "四", "五", "六", "七", "八", "九")
_JA_SIGN_BEFORE_NAME_RE = re.compile(r"[¥￥]\s*(?P<amount>\d[\d,]*(?:\.\d+)?)\s*(?=円)")
_THOUSANDS_SEPARATOR_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_JA_DEGREES_RE = re.compile(r"(?<=\d)\s?(?:℃|°C)")


def _en_money(match: re.Match[str]) -> str:
    one, many, minor_one, minor_many = _CURRENCIES[match["sign"]]
    whole, fraction, scale = match["whole"], match["fraction"], match["scale"]
    if scale or not minor_one or (fraction and len(fraction) > 2):
        number = whole + (f".{fraction}" if fraction else "")
        return f"{number} {scale} {many}" if scale else f"{number} {many}"
    cents = int(fraction.ljust(2, "0")) if fraction else 0
    major = f"{whole} {one if whole == '1' else many}"
    if not cents:
        return major
    minor = f"{cents} {minor_one if cents == 1 else minor_many}"
    return minor if whole == "0" else f"{major} and {minor}"


def _en_one_thousand(match: re.Match[str]) -> str:
    rest = int(match["rest"])
    if not rest:
        return "1 thousand"
    return f"1 thousand {'and ' if rest < 100 else ''}{rest}"


def _en_version(match: re.Match[str]) -> str:
    word = "version " if match["word"] == "v" else match["word"]
    return word + " point ".join(match["number"].split("."))


def english(text: str) -> str:
    text = _EN_MONEY_RE.sub(_en_money, text)
    text = _EN_VERSION_RE.sub(_en_version, text)
    text = _EN_ONE_THOUSAND_RE.sub(_en_one_thousand, text)
    text = _EN_DECADE_RE.sub(r"\g<century> \g<decade>s", text)
    for pattern, words in _EN_WORDS:
        text = pattern.sub(words, text)
    return text


def _phone(match: re.Match[str], digits: Sequence[str], plus: str, separator: str) -> str:
    groups = re.findall(r"\d+", match["number"] or match["mobile"])
    said = separator.join("".join(digits[int(d)] for d in group) for group in groups)
    country = match["country"] or match["grouped"]
    if not country:
        return said
    code = "".join(digits[int(d)] for d in country.strip(" -+"))
    return f"{plus}{code}{separator}{said}"


def _version(match: re.Match[str]) -> str:
    return "点".join(match.group().split("."))


def chinese(text: str) -> str:
    text = mandarin(_PHONE_RE.sub(lambda m: _phone(m, _ZH_PHONE_DIGITS, "加", " "), text))
    text = _VERSION_RE.sub(_version, _THOUSANDS_SEPARATOR_RE.sub("", text))
    text = _ZH_YUAN_SCALE_RE.sub(r"\g<amount>\g<scale>元", _RANGE_RE.sub("到", text))
    return _ZH_SIGN_BEFORE_NAME_RE.sub(r"\g<amount>", text).replace("√", "根号")


def japanese(text: str) -> str:
    text = _PHONE_RE.sub(lambda m: _phone(m, _JA_PHONE_DIGITS, "プラス", "の"), text)
    text = _JA_DEGREES_RE.sub("度", _THOUSANDS_SEPARATOR_RE.sub("", text))
    text = _RANGE_RE.sub("から", _VERSION_RE.sub(_version, text))
    return _JA_SIGN_BEFORE_NAME_RE.sub(r"\g<amount>", text).replace("√", "ルート")


REWRITES: dict[str, Callable[[str], str]] = {"en": english, "zh": chinese, "ja": japanese}
