"""Generated regions of one Markdown file: each benchmark rewrites only its own.

``docs/benchmarks.md`` holds the data-path tables (``bench.run``), the comparison with the peer
(``bench.peer``) and hand-written summaries of other benchmarks. A region is the text between
``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``; :func:`replace_region` swaps one region's body and
keeps every other line, so running one benchmark never erases another's section.
"""

from __future__ import annotations

from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def replace_region(text: str, name: str, body: str, *, at_top: bool = False) -> str:
    """``text`` with region ``name`` holding ``body``; a region not there yet is added at the end
    (or at the top with ``at_top``, after nothing)."""
    begin, end = markers(name)
    block = f"{begin}\n{body.rstrip()}\n{end}"
    start = text.find(begin)
    if start >= 0:
        stop = text.find(end, start)
        if stop < 0:
            raise ValueError(f"{begin} without {end}")
        return text[:start] + block + text[stop + len(end):]
    if not text.strip():
        return block + "\n"
    if at_top:
        return block + "\n\n" + text.lstrip("\n")
    return text.rstrip("\n") + "\n\n" + block + "\n"


def write_region(path: Path, name: str, body: str, *, at_top: bool = False) -> None:
    text = path.read_text() if path.exists() else ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(replace_region(text, name, body, at_top=at_top))
