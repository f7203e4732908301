#!/usr/bin/env python3
"""Fails when two top-level modules of src/ import each other, directly or
through others. A module is a file src/NAME.rs or a directory src/NAME/; an
import is any path `crate::OTHER` in its code (comments and doc links are
left out). Prints the graph and every cycle found."""
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
ROOTS = {"main.rs", "lib.rs"}


def top_modules():
    mods = {}
    for p in SRC.iterdir():
        if p.suffix == ".rs" and p.name not in ROOTS:
            mods.setdefault(p.stem, []).append(p)
        elif p.is_dir():
            mods.setdefault(p.name, []).extend(sorted(p.rglob("*.rs")))
    return mods


def code_of(path):
    lines = []
    for line in path.read_text().splitlines():
        stripped = line.lstrip()
        if stripped.startswith("//"):
            continue
        lines.append(line.split("//")[0])
    return "\n".join(lines)


def graph():
    mods = top_modules()
    edges = {m: set() for m in mods}
    for m, files in mods.items():
        for f in files:
            for other in re.findall(r"\bcrate::([a-z_][a-z0-9_]*)", code_of(f)):
                if other in mods and other != m:
                    edges[m].add(other)
            # `use crate::{a, b::c}` groups
            for group in re.findall(r"\bcrate::\{([^}]*)\}", code_of(f), re.S):
                for other in re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", group):
                    if other in mods and other != m:
                        edges[m].add(other)
    return edges


def cycles(edges):
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                found.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return found


def main():
    edges = graph()
    for m in sorted(edges):
        print(f"{m} -> {', '.join(sorted(edges[m])) or '(nothing)'}")
    found = cycles(edges)
    for c in found:
        print("import cycle: " + " -> ".join(c), file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
