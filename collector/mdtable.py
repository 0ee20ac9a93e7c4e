"""Markdown (pipe) tables, in two layouts:
- the report's (`pipe_table`, `pipe_rows`): exactly what `DataFrame.to_markdown(index=False)` prints (tabulate's
  "pipe" format), worked out in one pass for the values the report's tables hold: strings, ints, floats, None, NaN
  and pd.NA. tabulate looks at every cell in several Python calls, which takes most of a second on a run of a few
  thousand table rows. Here the common shapes (an empty string, a plain integer or decimal number as text, an int,
  a float) take a short path whose result is tabulate's, by its rules; every other value goes through tabulate's
  own functions, and a table it would lay out differently (control characters, multi-line cells, wide characters)
  is left to tabulate whole;
- the history's and `--sql`'s (`plain_rows`): every cell as given, left-aligned, without alignment marks.
pandas loads only with a table that holds more than strings (a frame's, which brings it)."""
from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any, Callable

import tabulate as tb

if TYPE_CHECKING:
    import pandas as pd

_NONE = type(None)
_RANK = {_NONE: 0, bool: 1, int: 2, float: 3, bytes: 4, str: 5}  # tabulate._more_generic's order
_BY_RANK = {rank: kind for kind, rank in _RANK.items()}
# Shapes whose tabulate type is plain: int(s) and float(s) read them, and no float overflows (int() reads at
# most 4300 digits; a float of at most 300 integer digits stays finite).
_INT = re.compile(r"-?[0-9]{1,4000}\Z")
_DECIMAL = re.compile(r"-?[0-9]{1,300}\.[0-9]+\Z")
_AWKWARD = re.compile(r"[\x00-\x1f\x7f]")  # ANSI codes, line breaks, tabulate's separating-line mark
# Every character of an ASCII string that int(), float(), tabulate's thousands pattern or its booleans ("True",
# "False") can read: a string with any other is a plain string to tabulate.
_NUMERIC_CHARS = re.compile(r"[\s0-9+\-.,_eEiInNfFaAtTyYrRuUlLsS]*\Z")


def _kind(v: Any) -> type:
    """tabulate._type(v, has_invisible=False, numparse=True)."""
    t = type(v)
    if t is str:
        if not v:
            return _NONE
        if _INT.match(v):
            return int
        if _DECIMAL.match(v):
            return float
        if v.isascii() and not _NUMERIC_CHARS.match(v):
            return str
    elif v is None:
        return _NONE
    elif t is int:
        return int
    elif t is float:
        return float
    return tb._type(v, False, True)


def _format(v: Any, kind: type, floatfmt: str) -> str:
    """tabulate._format(v, kind, floatfmt, intfmt="", missingval="", has_invisible=False)."""
    t = type(v)
    if v is None or (t is str and not v):
        return ""
    if kind is str and t is str:
        return v
    if kind is float and (t is float or t is int or (t is str and (_DECIMAL.match(v) or _INT.match(v)))):
        return format(float(v), floatfmt)
    if kind is int and (t is int or (t is str and _INT.match(v))):
        return format(v, "")
    return tb._format(v, kind, floatfmt, "", "", False)


def _afterpoint(s: str) -> int:
    """tabulate._afterpoint(s): digits after the decimal point of a formatted number, -1 for none."""
    if not s or _INT.match(s):
        return -1
    if _DECIMAL.match(s):
        return len(s) - s.rfind(".") - 1
    return tb._afterpoint(s)


@functools.cache
def _cells() -> tuple[type, ...]:
    """The kinds of cells laid out here: those of a frame's values."""
    import numpy as np
    import pandas as pd

    return (str, int, float, _NONE, type(pd.NA), np.float64, np.int64)


def _plain(headers: list[Any], columns: list[list[Any]]) -> bool:
    """Whether tabulate would lay these out as this module does: rows, string headers, cells of the kinds
    above, no control characters and (where tabulate counts wide characters) only ASCII."""
    if not columns or not columns[0] or not all(type(h) is str for h in headers):
        return False
    text = list(headers)
    for cells in columns:
        for v in cells:
            t = type(v)
            if t is str:
                text.append(v)
            elif t not in _cells():
                return False
    joined = " ".join(text)
    if _AWKWARD.search(joined):
        return False
    return joined.isascii() or tb.wcwidth is None or not tb.WIDE_CHARS_MODE


def pipe_table(df: pd.DataFrame, floatfmt: str = "g") -> str:
    """`df.to_markdown(index=False, floatfmt=floatfmt)`, the same text."""
    headers = list(df.columns)
    columns = [list(col) for col in zip(*df.values)]  # the cells as tabulate reads them (df.values)
    if not _plain(headers, columns):
        return df.to_markdown(index=False, floatfmt=floatfmt)
    return _layout(headers, columns, floatfmt)


def pipe_rows(rows: list[dict[str, str]]) -> str:
    """`pd.DataFrame(rows).to_markdown(index=False)` for rows of strings that all have the same keys in the
    same order, without building the frame."""
    headers = list(rows[0]) if rows else []
    plain = bool(rows) and all(list(r) == headers and all(type(v) is str for v in r.values()) for r in rows)
    columns = [[r[h] for r in rows] for h in headers] if plain else []
    if not plain or not _plain(headers, columns):
        import pandas as pd

        return pd.DataFrame(rows).to_markdown(index=False)
    return _layout(headers, columns, "g")


def plain_rows(rows: list[dict[str, str]]) -> str:
    """A pipe table of string cells, the keys of the first row as its header: every cell as given, left-aligned,
    each column as wide as its widest cell, and a rule of dashes without alignment marks."""
    heads = list(rows[0])
    widths = [max(len(h), *(len(r[h]) for r in rows)) for h in heads]
    return "\n".join(_lines([[c.ljust(w) for c, w in zip(cells, widths)]
                             for cells in [heads, *([r[h] for h in heads] for r in rows)]],
                            "|" + "|".join("-" * (w + 2) for w in widths) + "|"))


def _lines(rows: list[list[str]], rule: str) -> list[str]:
    """The lines of a pipe table of cells already padded: the first row, the rule, then the others."""
    lines = ["| " + " | ".join(cells) + " |" for cells in rows]
    return [lines[0], rule, *lines[1:]]


def _layout(headers: list[str], columns: list[list[Any]], floatfmt: str) -> str:
    out_cols, aligns = [], []
    for header, cells in zip(headers, columns):
        rank = 1  # tabulate starts from bool
        for v in cells:
            r = _RANK.get(_kind(v), 5)
            if r > rank:
                rank = r
        kind = _BY_RANK[rank]
        text = [_format(v, kind, floatfmt) for v in cells]
        align = "decimal" if kind in (int, float) else "left"
        pad: Callable[[str, int], str]
        if align == "decimal":
            decimals = [_afterpoint(s) for s in text]
            most = max(decimals)
            text = [s + (most - d) * " " for s, d in zip(text, decimals)]
            pad = str.rjust
        else:
            text = [s.strip() for s in text]
            pad = str.ljust
        width = max(max(map(len, text)), len(header) + tb.MIN_PADDING)
        out_cols.append([pad(s, width) for s in text])
        aligns.append((align, width))
    head = [h.ljust(w) if a == "left" else h.rjust(w) for h, (a, w) in zip(headers, aligns)]
    rule = "|" + "|".join((":" + "-" * (w + 1)) if a == "left" else ("-" * (w + 1) + ":") for a, w in aligns) + "|"
    return "\n".join(line.rstrip() for line in _lines([head, *(list(row) for row in zip(*out_cols))], rule))
