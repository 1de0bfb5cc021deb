"""Prints (or updates in docs/configuration.md) the configuration table from the C++ knob table,
which is the single source of truth for names, defaults and meanings.

    python scripts/knob_table.py            # print the Markdown table
    python scripts/knob_table.py --update   # rewrite it in docs/configuration.md (between markers)
"""

import sys
from pathlib import Path

from horovodlite._extension import load

START, END = "<!-- knobs:start -->", "<!-- knobs:end -->"


def table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, default, doc in load().knobs():
        rows.append(f"| `{name}` | `{default or '(unset)'}` | {doc} |")
    return "\n".join(rows)


def main() -> int:
    if "--update" not in sys.argv:
        print(table())
        return 0
    page = Path(__file__).parents[1] / "docs" / "configuration.md"
    text = page.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    page.write_text(f"{head}{START}\n{table()}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
