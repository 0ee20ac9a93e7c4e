"""Names and labels a reader takes at face value (a suite, model, sweep or workload name): printable text without
control or format characters (zero-width, bidirectional) and without letters of one script that look like another's
(a Cyrillic `В` in a Latin name, fullwidth or mathematical forms)."""
from __future__ import annotations

import unicodedata

LABEL_MAX = 120


LABEL_TEXT = (f"printable text of at most {LABEL_MAX} characters, without control, format (zero-width, bidirectional) "
              "or line-separator characters, without letters in look-alike forms or of look-alike scripts mixed, and "
              "without leading or trailing spaces")


# Scripts whose letters pass for one another (Latin a, Cyrillic а, Greek α): one name may use one of them only.
# Latin beside Han, kana or Hangul is common in names and stays allowed (as in UTS #39's restriction levels).
LOOKALIKE_SCRIPTS = ("LATIN", "CYRILLIC", "GREEK", "ARMENIAN", "CHEROKEE", "COPTIC")


def _lookalikes(value: str) -> list[str]:
    """Letters and digits in a compatibility form of another (fullwidth, mathematical, circled, superscript: NFKC
    changes them), and, where a name mixes look-alike scripts, the letters outside its main one; each as U+XXXX
    NAME."""
    def named(c: str) -> str:
        return f"U+{ord(c):04X} {unicodedata.name(c, '?')}"
    out = [c for c in value if c.isalnum() and unicodedata.normalize("NFKC", c) != c]
    by_script: dict[str, list[str]] = {}
    for c in value:
        if c.isalpha() and c not in out:
            script = unicodedata.name(c, "").split(" ", 1)[0]
            if script in LOOKALIKE_SCRIPTS:
                by_script.setdefault(script, []).append(c)
    if len(by_script) > 1:
        main = max(by_script, key=lambda k: len(by_script[k]))
        out += [c for script, chars in by_script.items() if script != main for c in chars]
    return [named(c) for c in dict.fromkeys(out)]


def label_problem(value: str) -> str | None:
    """Why a name shown in plans, reports and plots is not what it looks like (None when it is fine): Unicode
    control (Cc), format (Cf: zero-width, bidirectional), surrogate, private-use and unassigned characters and
    line or paragraph separators; letters in look-alike forms or from look-alike scripts mixed (`_lookalikes`);
    spaces around it; an unreadable length."""
    bad = [c for c in value if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")]
    if bad:
        return f"holds {', '.join(sorted({f'U+{ord(c):04X}' for c in bad}))}"
    alike = _lookalikes(value)
    if alike:
        return f"holds look-alike letters: {', '.join(alike[:4])}" + (f" and {len(alike) - 4} more" if len(alike) > 4
                                                                         else "")
    if value != value.strip():
        return "has leading or trailing spaces"
    if len(value) > LABEL_MAX:
        return f"is {len(value)} characters long"
    return None
