"""Text from trace files, safe to print on a terminal: ``terminal_safe``.

Names, file names and reasons in a report come from the trace files (or the command line), and
escape sequences in them would drive the terminal that prints them. Every trace command
(``polyprof report``, ``convert``, ``merge``) and the many-rank report's text (``polyprof.ranks.rank_report``)
print such text through ``terminal_safe``.
"""

from __future__ import annotations

#: Characters that move the cursor, recolour, retitle or reorder a terminal's text: C0 and C1
#: controls and DEL, line and paragraph separators, and the bidirectional overrides and isolates.
_TERMINAL_CONTROLS = (
    *range(0x20),
    *range(0x7F, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    0x2028,
    0x2029,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
    # Lone surrogates (a JSON "\\ud800" the stdlib parser kept): no terminal encoding can write them.
    *range(0xD800, 0xE000),
)
_ESCAPES = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _TERMINAL_CONTROLS}


def terminal_safe(text: str) -> str:
    """``text`` with terminal control characters written as escapes (``"\\x1b"``); other text as is.

    Names in a trace file are the file's text, and escape sequences in them would
    drive the terminal that prints the report. Lone surrogates (``"\\ud800"``, which
    JSON can hold and no encoding can write) are escaped too. Backslashes stay as
    they are, so the escaping is for display, not a reversible encoding.
    """
    return text if text.isprintable() else text.translate(_ESCAPES)


__all__ = ["terminal_safe"]
