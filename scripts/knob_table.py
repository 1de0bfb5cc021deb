"""Prints the README's configuration table from the C++ knob table (the single source).

    python scripts/knob_table.py
"""

from horovodlite._extension import load

C = load()
print("| variable | default | meaning |")
print("|---|---|---|")
for name, default, doc in C.knobs():
    print(f"| `{name}` | `{default or '(unset)'}` | {doc} |")
