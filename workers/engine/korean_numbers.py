"""Numbers in Korean text, written out in Hangul as a Korean reader says them.

wetext has no Korean grammar: a Hangul span went to its English one, so "3,500원" was read
"three thousand five hundred 원" and "2026년 12월 7일" "twenty twenty six 년 twelve 월 seven 일".
Here, before any other normalisation of a span with Hangul in it:
- Sino-Korean numbers by default, in groups of four digits (만, 억, 조): 3,500 -> 삼천오백,
  10,000 -> 만, 1,234,567 -> 백이십삼만사천오백육십칠; a one before 십, 백, 천 and a lone 만 is
  not said; decimals digit by digit after 점 (3.5 -> 삼 점 오); a version's dots all 점;
- native numbers (1-99) before the counters that take them (3시 -> 세 시, 2개 -> 두 개,
  20살 -> 스무 살), unless 제 makes it an ordinal (제1장 -> 제일 장);
- the months 6 and 10 as 유월 and 시월; a clock time 3:30 -> 세 시 삼십 분;
- a phone number digit by digit, 0 as 공 (02-1234-5678 -> 공이 일이삼사 오육칠팔);
- a date 2026.12.7. as 2026년 12월 7일 (then read as above);
- %, ℃ and a currency sign before an amount as words (퍼센트, 도, 원, 달러 ...).
"""

from __future__ import annotations

import re

HANGUL_RE = re.compile("[\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f]")
_DIGITS = "영일이삼사오육칠팔구"
_PHONE_DIGITS = "공일이삼사오육칠팔구"
_PLACES = ("", "십", "백", "천")
_GROUPS = ("", "만", "억", "조", "경")
_NATIVE_UNITS = ("", "한", "두", "세", "네", "다섯", "여섯", "일곱", "여덟", "아홉")
_NATIVE_TENS = ("", "열", "스물", "서른", "마흔", "쉰", "예순", "일흔", "여든", "아흔")
_NATIVE_COUNTERS = (
    "시간|시(?!즌|리즈|청|장)|개(?!월)|명|살|마리|잔|권|번째|가지|달|사람|병|그루|송이|켤레|벌"
    "|군데|곳|척|채"
)
_CURRENCY = {"₩": "원", "￦": "원", "$": "달러", "€": "유로", "¥": "엔", "￥": "엔", "£": "파운드"}

_PHONE_RE = re.compile(r"(?<![\d-])(?:\+\d{1,3}[ -]?)?0?\d{1,3}-\d{3,4}-\d{4}(?![\d-])")
_DATE_RE = re.compile(
    r"(?<![\d.])(?P<year>\d{4})\.\s?(?P<month>\d{1,2})\.\s?(?P<day>\d{1,2})\.?(?![\d.])"
)
_TIME_RE = re.compile(r"(?<![\d:])(?P<hour>\d{1,2}):(?P<minute>\d{2})(?![\d:])")
_VERSION_RE = re.compile(r"\d+(?:\.\d+){2,}")
_CURRENCY_RE = re.compile(r"(?P<sign>[₩￦$€¥￥£])\s?(?P<amount>\d[\d,]*(?:\.\d+)?)")
_NATIVE_RE = re.compile(
    rf"(?<![\d.,제])(?P<number>[1-9]\d?)(?![\d.,])(?=\s?(?:{_NATIVE_COUNTERS}))"
)
_MONTH_RE = re.compile(r"(?<![\d.,])(?P<month>6|06|10)(?=\s?월)")
_NUMBER_RE = re.compile(
    r"(?P<sign>(?<![\w\d])-)?(?P<whole>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<fraction>\d+))?"
)


def sino(number: int) -> str:
    """A whole number in Sino-Korean words (0 -> 영, 10000 -> 만)."""
    if number == 0:
        return _DIGITS[0]
    words = []
    for index in range(len(_GROUPS) - 1, -1, -1):
        group = number // 10 ** (4 * index) % 10**4
        if not group:
            continue
        said = "" if group == 1 and index == 1 else _below_ten_thousand(group)
        words.append(said + _GROUPS[index])
    return "".join(words)


def _below_ten_thousand(number: int) -> str:
    words = []
    for place in range(3, -1, -1):
        digit = number // 10**place % 10
        if digit:
            words.append(("" if digit == 1 and place else _DIGITS[digit]) + _PLACES[place])
    return "".join(words)


def native(number: int) -> str:
    """1-99 in native Korean as said before a counter (1 -> 한, 20 -> 스무, 21 -> 스물한)."""
    tens, units = divmod(number, 10)
    if number == 20:
        return "스무"
    return _NATIVE_TENS[tens] + _NATIVE_UNITS[units]


def _number(match: re.Match[str]) -> str:
    whole = sino(int(match["whole"].replace(",", "")))
    fraction = match["fraction"]
    said = whole + (" 점 " + "".join(_DIGITS[int(d)] for d in fraction) if fraction else "")
    return ("마이너스 " if match["sign"] else "") + said


def _phone(match: re.Match[str]) -> str:
    text = match.group().replace("+", "플러스 ")
    return re.sub(
        r"\d+", lambda m: "".join(_PHONE_DIGITS[int(d)] for d in m.group()), text
    ).replace("-", " ")


def _time(match: re.Match[str]) -> str:
    hour, minute = int(match["hour"]), int(match["minute"])
    if hour > 24 or minute > 59:
        return match.group()
    said = f"{native(hour) if 1 <= hour <= 12 else sino(hour)} 시"
    return f"{said} {sino(minute)} 분" if minute else said


def _date(match: re.Match[str]) -> str:
    month, day = int(match["month"]), int(match["day"])
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return match.group()
    return f"{match['year']}년 {month}월 {day}일"


def _native(match: re.Match[str]) -> str:
    number = int(match["number"])
    if number == 1 and match.string.startswith("번째", match.end()):
        return "첫 "
    return native(number) + " "


def _currency(match: re.Match[str]) -> str:
    return f"{match['amount']}{_CURRENCY[match['sign']]}"


def korean(text: str) -> str:
    """`text` with its numbers written out as Korean reads them (the rules above)."""
    text = _PHONE_RE.sub(_phone, text)
    text = _DATE_RE.sub(_date, text)
    text = _TIME_RE.sub(_time, text)
    text = _VERSION_RE.sub(lambda m: " 점 ".join(sino(int(p)) for p in m.group().split(".")), text)
    text = _CURRENCY_RE.sub(_currency, text)
    text = _MONTH_RE.sub(lambda m: "유" if m["month"].endswith("6") else "시", text)
    text = _NATIVE_RE.sub(_native, text)
    text = _NUMBER_RE.sub(_number, text)
    return text.replace("%", " 퍼센트").replace("℃", "도").replace("°C", "도")
