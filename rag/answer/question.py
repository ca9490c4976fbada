"""What a question asks for, read from its words alone: the kind of answer it wants (`Ask`,
from its first question word), what "how many" counts, the names it holds (what no other
passage can stand in for), and where a text holds an answer of the kind asked for. The
evidence score (rag.answer.evidence) and the follow-up resolution (rag.answer.history) build
on these.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Literal

from rag.answer.cite import STOP, stem, stopped


class Ask(Enum):
    """What kind of answer a question wants."""

    PERSON = "person"
    TIME = "time"
    NUMBER = "number"
    PLACE = "place"
    NAME = "name"  # "which magazine", "what treaty": a name
    OTHER = "other"


# A word, numbers and times included ("4.2.1", "09:30", "O'Neill", "mid-1480s").
WORD = re.compile(r"[^\W_]+(?:[.:'-][^\W_]+)*", re.UNICODE)


def _lowered(question: str) -> str:
    """The question's words in lower case, one space apart: what its patterns read."""
    return " ".join(w.lower() for w in WORD.findall(question))


_NUMBER = re.compile(r"\d")
_CLOCK = re.compile(r"\b\d{1,2}[:.]\d{2}\b")
_YEAR = re.compile(r"^(?:1\d{3}|20\d{2}|\d{2,4}s|\d{1,2}(?:st|nd|rd|th))$")
MONTHS = frozenset(
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
WEEKDAYS = frozenset(
    """monday tuesday wednesday thursday friday saturday sunday weekday weekdays weekend
    weekends""".split()
)
NUMBER_WORDS = frozenset(
    """zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
    fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty
    ninety hundred thousand million billion trillion half quarter dozen""".split()
)
# An amount said against another or as none: "A3 prints cost double the A4 price", "free".
RELATIVE = frozenset(stem(w) for w in "free double twice triple half".split())
ORDINAL_WORDS = frozenset(
    """first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth
    fifteenth twentieth thirtieth last""".split()
)
_YEAR_BEFORE = frozenset("in since until by around circa".split())
TIME_WORDS = (
    MONTHS
    | WEEKDAYS
    | frozenset(
        """century centuries decade bc bce ad ce morning noon evening night midnight dawn
        daily weekly monthly yearly annually am pm""".split()
    )
)
PLACE_NOUNS = frozenset(
    """city cities country countries town state states museum museums gallery continent
    island islands river rivers region province capital place places location office
    offices mountain mountains sea ocean lake nation county district street""".split()
)
PERSON_NOUNS = frozenset(
    """author authors writer painter composer artist director founder inventor person
    people king queen emperor president leader scientist architect poet player producer
    discoverer contact manager ghostwriter""".split()
)
# What "what is the ... <noun>" and "what <noun> ..." ask for as a number or an amount.
QUANTITY_NOUNS = frozenset(
    """budget budgets price prices cost costs fee fees limit limits allowance amount number
    size value rate salary deposit discount minimum maximum capacity length population
    percentage share total sum quota threshold uptime availability time""".split()
)
DURATION_UNITS = frozenset(
    """second seconds minute minutes hour hours day days week weeks month months year years
    business working""".split()
)
_PLACE_BEFORE = frozenset("in at from near to into of on across for after".split())
_PERSON_BEFORE = frozenset("by with to for".split())


_ASKS: tuple[tuple[re.Pattern[str], Ask], ...] = (
    (re.compile(r"\bhow (?:many|much|long|old|far|big|large|tall|high|deep|often|fast|soon)\b"),
     Ask.NUMBER),
    (re.compile(r"\b(?:what|which) (?:percentage|number|amount|price|cost|limit|size|value)\b"),
     Ask.NUMBER),
    (re.compile(r"\b(?:when|until when|since when|what year|which year|what date|which date)\b"),
     Ask.TIME),
    (re.compile(r"\b(?:what|which) (?:time|times|day|days|month|decade|century|weekday)\b"),
     Ask.TIME),
    (re.compile(r"\bwho(?:m|se)?\b"), Ask.PERSON),
    (re.compile(r"\bwhere\b"), Ask.PLACE),
    (re.compile(r"\b(?:what|which) \w+"), Ask.OTHER),  # by its noun, below
)  # fmt: skip


_PRICE_VERB = re.compile(r"\b(?:cost|charge|pay|paid|earn|spend)\b")
_YES_NO = re.compile(
    r"(?:do|does|did|is|are|was|were|can|could|will|would|should|shall|may|must|have|has|am)\b"
)
_KNOWN_WHEN = re.compile(
    r"\b(?:know|known|tell|say|find|remember|sure|decided|announced|clear) (?:\w+ )?when$"
)


def ask_of(question: str) -> Ask:
    """The kind of answer `question` wants, from its first question word ("How old was he
    when ..." asks for a number, not a time)."""
    text = _lowered(question)
    text = re.sub(r"\b(what|which|who|where|when|how)'s\b", r"\1 is", text)
    if _CLOCK_ASKED.search(text):
        return Ask.TIME  # "What are the opening hours ...?"
    found = [(m.start(), n, m) for n, (rx, _) in enumerate(_ASKS) if (m := rx.search(text))]
    if not found:
        return Ask.OTHER
    _, n, m = min(found, key=lambda f: (f[0], f[1]))
    ask = _ASKS[n][1]
    if m.group(0) == "when" and _YES_NO.match(text) and not _KNOWN_WHEN.search(text[: m.end()]):
        # "Do I get a day off when I move house?" asks yes or no; "Do you know when ..." asks
        # for a time.
        return Ask.OTHER
    if ask is not Ask.OTHER:
        return ask
    noun = m.group(0).split()[1]
    if noun in ("is", "are", "was", "were"):
        # "What is the one-off home office budget in the UK?": the phrase's last noun
        # before a preposition says what kind of answer it is.
        head = _head(text[m.end() :])
        if head in QUANTITY_NOUNS:
            return Ask.NUMBER
    if noun in QUANTITY_NOUNS:
        return Ask.NUMBER  # "What discount do charities get?", "What uptime ...?"
    if noun in PLACE_NOUNS:
        return Ask.PLACE
    if noun in PERSON_NOUNS:
        return Ask.PERSON
    if noun in ("do", "does", "did", "will", "would") and _PRICE_VERB.search(text, m.end()):
        return Ask.NUMBER  # "What does the Starter plan cost?", "What do you charge for ...?"
    if noun in STOP or noun in ("kind", "type", "sort", "is", "are", "was", "were", "does"):
        return Ask.OTHER
    return Ask.NAME


def _head(rest: str) -> str:
    """The last word of the noun phrase `rest` starts with ("the one-off home office budget
    in the united kingdom": budget)."""
    words = rest.split()[:8]
    head = ""
    for w in words:
        if w in _PLACE_BEFORE or w in _PERSON_BEFORE or w in ("per", "does", "do", "is", "can"):
            break
        head = w
    return head


_CLOCK_ASKED = re.compile(
    r"(?<!within )(?<!in )\b(?:what|which) times?\b(?! (?:limit|frame|period|span))"
    r"|\btimes? of (?:the )?day\b|\bopening hours\b|\bo'clock\b"
)


def asks_clock(question: str) -> bool:
    """Whether a question asks for a time of day ("At what times ...", "opening hours"), not
    a date or a duration ("Within what time ...")."""
    return _CLOCK_ASKED.search(_lowered(question)) is not None


# The words that say what something is called, in a question and in a passage.
_CALLED = "called|known as|named|termed|referred to as"
_CALLED_ASKED = re.compile(rf"\b(?:{_CALLED}|(?:term|name|word) for)\b(?! after)")
_NAMING = re.compile(rf"\b(?:{_CALLED}|dubbed|nicknamed)\b", re.IGNORECASE)


def asks_called(question: str) -> bool:
    """Whether a question asks what something is called ("What is the core of a syllable
    called?", "another name for ..."), not who it is named after."""
    return _CALLED_ASKED.search(_lowered(question)) is not None


def names_something(text: str) -> bool:
    """Whether `text` says what something is called ("is known as", "termed")."""
    return _NAMING.search(text) is not None


_OFTEN_ASKED = re.compile(
    r"\bhow (?:often|frequently)\b|\b(?:what|which|at what) (?:interval|frequency)\b"
)
# "every 6 hours", "every other week", "daily", "twice a year", "3 times per month". Bounded
# repeats only.
_FREQUENCY = re.compile(
    r"\b(?:(?:every|each)\s+(?:[^\W_]+\s+){0,2}?(?:second|minute|hour|day|night|week|"
    r"fortnight|month|quarter|year|(?:business|working)\s+day)s?"
    r"|hourly|daily|nightly|weekly|fortnightly|biweekly|monthly|quarterly|yearly|annually"
    r"|(?:once|twice|thrice|[^\W_]+\s+times)\s+(?:a|an|per|every|each))\b",
    re.IGNORECASE,
)


def asks_often(question: str) -> bool:
    """Whether a question asks how often something happens ("How often are keys rotated?"):
    a frequency answers it, not any number."""
    return _OFTEN_ASKED.search(_lowered(question)) is not None


def frequencies(text: str) -> list[tuple[int, int]]:
    """[start, end) of each frequency `text` states ("every two weeks", "daily")."""
    return [m.span() for m in _FREQUENCY.finditer(text)]


# What a question for a number or a time wants among several in one sentence: a sum of money
# ("What price did it fetch?"), a count ("How many copies ...?": not a year), a measure ("How
# long is the film?": not a year either), or a date ("In which month and year ...?": not a
# duration). A sum, a count or a measure asked for is also what a unit must hold to answer.
Shape = Literal["", "money", "count", "measure", "date"]
_MEASURE_ASKED = re.compile(r"\bhow (?:long|old|far|tall|high|deep|big|large|heavy)\b")
_MONEY_ASKED = re.compile(
    r"\b(?:price|prices|cost|costs|costing|fetch|fetched|sold|sell|spent|spend|fee|fees|"
    r"budget|worth|earn|earned|grossed|salary|charge)\b"
)
_MULTIPLE = re.compile(r"\d+(?:\.\d+)?x")  # "1.5x basic hourly rate"
_CURRENCY = frozenset("€£$¥₹")
# The words a question names a currency by, with its sign.
_SIGN_OF = {
    sign: frozenset(words.split())
    for sign, words in (("$", "dollar dollars usd"), ("€", "euro euros eur"),
                        ("£", "pound pounds sterling gbp"))
}  # fmt: skip
_CURRENCY_WORDS = frozenset(
    "dollar dollars euro euros pound pounds pence cent cents franc francs yen".split()
)


def currency_asked(question: str) -> str:
    """The sign of the currency the question wants its amount in ("in US dollars": $), or
    ""."""
    words = set(_lowered(question).split())
    return next((sign for sign, named in _SIGN_OF.items() if words & named), "")


def shape_of(question: str, ask: Ask) -> Shape:
    """The shape of answer `question` prefers among candidates of its kind (see Shape)."""
    text = _lowered(question)
    if ask is Ask.NUMBER:
        if "how many" in text:
            return "count"
        if _MONEY_ASKED.search(text) or currency_asked(question):
            return "money"
        if "how much" in text:
            return "count"
        return "measure" if _MEASURE_ASKED.search(text) else ""
    return "date" if ask is Ask.TIME and not asks_clock(question) else ""


def fits(text: str, hit: tuple[int, int], shape: Shape) -> bool:
    """Whether the candidate at `hit` of `text` has the shape asked for."""
    word = text[hit[0] : hit[1]].lower()
    following = WORD.match(text, hit[1] + 1) if text[hit[1] : hit[1] + 1] == " " else None
    after = following.group(0).lower() if following is not None else ""
    if shape == "money":
        return (
            text[max(0, hit[0] - 1) : hit[0]] in _CURRENCY
            or after in _CURRENCY_WORDS
            or (word[:1].isdigit() and word.endswith("p"))  # "45p"
            or _MULTIPLE.fullmatch(word) is not None
        )
    dated = bool(_YEAR.match(word)) or word in MONTHS or after in MONTHS
    if shape == "count":
        return not dated and not (word == "one" and after == "of")  # "one of the largest"
    if shape == "measure":
        return not dated  # "How long is the film?": not "a 1954 film"
    if shape == "date":
        return dated or word in WEEKDAYS
    return True


def clock(word: str) -> bool:
    """Whether `word` says a time of day ("09:30", "noon")."""
    return _CLOCK.fullmatch(word) is not None or word.lower() in _DAYTIME


_DAYTIME = frozenset("noon midday midnight am pm morning afternoon evening night".split())


_COUNTED = re.compile(r"\bhow many ([a-z]+)(?: ([a-z]+))?")
# Nouns that count people: a passage says "employs 3,460 people" of "How many staff".
PEOPLE = frozenset(
    stem(w)
    for w in """people person persons staff employees workers speakers residents inhabitants
    members citizens individuals population""".split()
)


def counted(question: str) -> frozenset[str]:
    """What "how many ..." counts ("How many pages does it have?": pages), stemmed: its
    word and the one after ("How many native speakers": native, speakers), and every noun
    of people when it counts people. Empty when it counts nothing said."""
    m = _COUNTED.search(_lowered(question))
    if m is None or m.group(1) in STOP or m.group(1) in ("more", "other", "different"):
        return frozenset()
    words = {stem(w) for w in m.groups() if w and w not in STOP}
    return frozenset(words | PEOPLE) if words & PEOPLE else frozenset(words)


def question_names(question: str) -> set[str]:
    """Capitalised words that do not start a sentence, and numbers: what a question is about
    and no other passage can stand in for ("the capital of Vrelnia", "model X200")."""
    out = set()
    first = True
    for m in WORD.finditer(question):
        w = m.group(0)
        lower = w.lower()
        named = any(ch.isdigit() for ch in w) or (not first and w[:1].isupper())
        if named and not stopped(lower) and not _amount(question, m):
            out.add(stem(lower))
        first = question[m.end() : m.end() + 2].lstrip(" \"'")[:1] in (".", "?", "!", ":")
    return out


_PLAIN_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_DAYTIME_ASKED = re.compile(r"\d{1,2}(?:[:.]\d{2})?(?:am|pm)", re.IGNORECASE)
_MEASURES = frozenset(
    """percent day days week weeks month months year years hour hours minute minutes night
    nights km kg gb tb mb""".split()
)


def _amount(question: str, m: re.Match[str]) -> bool:
    """Whether the number at `m` is an amount the question poses ("receipts from 70 days
    ago", "a £700 course", "uptime of 97%"): a condition the document states as a range or a
    rule, not a name it must repeat."""
    if _DAYTIME_ASKED.fullmatch(m.group(0)) or _CLOCK.fullmatch(m.group(0)):
        return True  # "after 8pm", "at 20:00": the document states hours as a range
    if not _PLAIN_NUMBER.fullmatch(m.group(0)):
        return False
    before = question[max(0, m.start() - 2) : m.start()].strip()
    after = question[m.end() : m.end() + 12].lstrip()
    unit = WORD.match(after)
    return (
        before[-1:] in ("£", "$", "€")
        or after[:1] == "%"
        or (unit is not None and unit.group(0).lower() in _MEASURES)
    )


def candidates(text: str, ask: Ask, asked: set[str]) -> list[tuple[int, int]]:
    """Where `text` holds an answer of the kind asked for that the question does not:
    [start, end) of each word that is one."""
    words = list(WORD.finditer(text))
    out = []
    for n, m in enumerate(words):
        w = m.group(0)
        lower = w.lower()
        if stem(lower) in asked:
            continue
        before = words[n - 1].group(0).lower() if n else ""
        before2 = words[n - 2].group(0).lower() if n > 1 else ""
        after = words[n + 1].group(0).lower() if n + 1 < len(words) else ""
        digit = bool(_NUMBER.search(w))
        # A month or a weekday is a date, never a name, a person or a place ("Monday to
        # Friday").
        capital = (
            w[:1].isupper() and lower not in STOP and lower not in MONTHS
            and lower not in WEEKDAYS
        )  # fmt: skip
        if ask is Ask.NUMBER:
            # "a ten-time champion", "a fourfold rise"
            base = lower.split("-")[0] if "-" in lower else lower.removesuffix("fold")
            times = lower.endswith(("-time", "fold")) and base in NUMBER_WORDS
            hit = digit or lower in NUMBER_WORDS or times
        elif ask is Ask.TIME:
            hit = (
                bool(_YEAR.match(lower))
                or lower in TIME_WORDS
                or bool(_CLOCK.match(w))
                or ((digit or lower in NUMBER_WORDS) and after in DURATION_UNITS)
                or ((digit or lower in NUMBER_WORDS) and before == "at")  # "at nine"
                # "the third day of illness", "the first day of Shawwal"
                or (lower in ORDINAL_WORDS and after in DURATION_UNITS)
                # "collapsed in 476"
                or (w.isdigit() and len(w) == 3 and before in _YEAR_BEFORE)
            )
        elif ask is Ask.PLACE:
            hit = (
                capital
                and n > 0
                and (
                    before in _PLACE_BEFORE
                    or (before == "the" and before2 in _PLACE_BEFORE)
                    or bool(_NUMBER.match(after))  # a street and its number
                )
            )
        elif ask is Ask.PERSON:
            nxt = words[n + 1].group(0) if n + 1 < len(words) else ""
            prev = words[n - 1].group(0) if n else ""
            # A full name: two capitalised words in a row; at the sentence's start, the second
            # ("Daniel Ferreira is our ...").
            hit = (
                capital
                and n > 0
                and (
                    (nxt[:1].isupper() and nxt.lower() not in STOP)
                    or (prev[:1].isupper() and prev.lower() not in STOP)
                )
            )
        elif ask is Ask.NAME:
            hit = (capital and n > 0) or digit or lower in NUMBER_WORDS
        else:
            hit = True
        if hit:
            out.append((m.start(), m.end()))
    return out
