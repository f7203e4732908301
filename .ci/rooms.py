#!/usr/bin/env python3
"""Fails when the maps of src/ drift from src/: README.md's room table (the
table of its "## Development" section) and the room lists of the module
files (their `//!` lines). Prints one line per problem, naming the file.

README.md's room table: a row whose first cell names paths under src/ in
backticks (`src/cli/`, `src/main.rs`) describes them in its second cell.
When the first cell names one folder, the second may name what is in it by
paths relative to that folder (`core/`, `session.rs`, `session/tests.rs`);
a path there may also be written from the top (`src/...`). Every `.rs`
file and every folder under src/ must be named so (a path names the folders
it is in), except a folder's `mod.rs`, which its folder's row describes;
and every path named must exist.

A module file's room list: `src/lib.rs`, each `mod.rs` and each `NAME.rs`
beside a folder `NAME/` holds the modules of a folder; its `//!` lines
name, in backticks, each of them (`wire`, `wire.rs`, [`wire`], `core/`):
every `.rs` file and folder in the folder, and every `mod NAME;` the file
declares. `src/main.rs` is the binary's root, not a module of the library,
so `src/lib.rs` need not name it.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
README = ROOT / "README.md"
SECTION = "## Development"

# A path in backticks: a file ending in `.rs`, or a folder ending in `/`.
PATH = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*(?:\.rs|/)")
MOD_DECL = re.compile(
    r"^[ \t]*(?:pub(?:\([^)]*\))?[ \t]+)?mod[ \t]+([a-z_][a-z0-9_]*)[ \t]*;", re.M
)


def rel(path):
    """`path` as written in the repository: from its root, folders with `/`."""
    text = path.relative_to(ROOT).as_posix()
    return text + "/" if path.is_dir() else text


def room_table(problems):
    """The README table's rows: (line number, first cell, second cell)."""
    try:
        lines = README.read_text().splitlines()
    except OSError as e:
        problems.append(f"README.md: cannot be read ({e.strerror})")
        return []
    start = next((i for i, line in enumerate(lines) if line.strip() == SECTION), None)
    if start is None:
        problems.append(f"README.md: no '{SECTION}' section, so no room table")
        return []
    table = []
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("## "):
            break
        if line.startswith("|"):
            table.append((number, line))
        elif table:
            break  # the first table of the section ended
    rows = []
    # The header, and the row of dashes under it, name nothing.
    for number, line in table[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2:
            rows.append((number, cells[0], " | ".join(cells[1:])))
    if not rows:
        problems.append(f"README.md: no room table in its '{SECTION}' section")
    return rows


def named_in_readme(problems):
    """Every path under src/ the room table names, with where: {path: line};
    None without a table (then that is the one problem to tell)."""
    rows = room_table(problems)
    if not rows:
        return None
    named = {}
    for number, where, what in rows:
        roots = [t for t in re.findall(r"`([^`]+)`", where) if t.startswith("src/")]
        bad = [t for t in roots if not PATH.fullmatch(t)]
        for t in bad:
            problems.append(
                f"README.md:{number}: `{t}` in the room table is neither a "
                "`.rs` file nor a folder ending in `/`"
            )
        roots = [t for t in roots if t not in bad]
        if not roots:
            continue  # a row about something else than src/ (tests, helm)
        for t in roots:
            named.setdefault(t, number)
        folder = roots[0] if len(roots) == 1 and roots[0].endswith("/") else None
        for t in re.findall(r"`([^`]+)`", what):
            if not PATH.fullmatch(t) or t.startswith("/"):
                continue
            if t.startswith("src/"):
                named.setdefault(t, number)
            elif folder is None:
                problems.append(
                    f"README.md:{number}: `{t}` is named in a row that does not "
                    "name exactly one folder of src/ it could be in "
                    "(write it from the top: `src/...`)"
                )
            else:
                named.setdefault(folder + t, number)
    return named


def check_readme(problems):
    named = named_in_readme(problems)
    if named is None:
        return
    # A path names the folders it is in: `session/tests.rs` names `session/`.
    implied = {
        f"{parent}/" for path in named for parent in pathlib.PurePosixPath(path).parents
    }
    for path, number in sorted(named.items()):
        p = ROOT / path
        where = f"named in README.md's room table (line {number})"
        if path.endswith("/") and not p.is_dir():
            problems.append(f"{path}: {where}, but there is no such folder")
        elif not path.endswith("/") and not p.is_file():
            problems.append(f"{path}: {where}, but there is no such file")
    if not SRC.is_dir():
        problems.append("src/: no such folder")
        return
    for p in sorted(SRC.rglob("*")):
        path = rel(p)
        table = f"README.md's room table ('{SECTION}')"
        if p.is_dir():
            if path not in named and path not in implied:
                problems.append(f"{path}: not named in {table}")
        elif p.name == "mod.rs":
            # What its folder's row describes.
            if path not in named and rel(p.parent) not in named:
                problems.append(f"{path}: its folder is not named in {table}")
        elif p.suffix == ".rs" and path not in named:
            problems.append(f"{path}: not named in {table}")


def module_files():
    """Each module file with the folder whose modules it holds."""
    yield SRC / "lib.rs", SRC
    for p in sorted(SRC.rglob("*.rs")):
        if p.name == "mod.rs":
            yield p, p.parent
        elif p.parent != SRC or p.name not in ("lib.rs", "main.rs"):
            if p.with_suffix("").is_dir():
                yield p, p.with_suffix("")


def doc_names(text):
    """The names the `//!` lines of `text` give in backticks."""
    doc = "\n".join(
        line.strip()[3:] for line in text.splitlines() if line.strip().startswith("//!")
    )
    names = set()
    for token in re.findall(r"`([^`]+)`", doc):
        token = token.strip().removeprefix("self::")
        names.add(token.removesuffix(".rs").removesuffix("/"))
    return names


def check_room_lists(problems):
    for module, folder in module_files():
        if not module.is_file():
            problems.append(f"{rel(module)}: no such file")
            continue
        text = module.read_text()
        named = doc_names(text)
        wanted = {}
        # Files first: `session.rs` is the one to name, not `session/`.
        for p in sorted(folder.iterdir(), key=lambda p: (p.is_dir(), p.name)):
            if p == module or (folder == SRC and p.name in ("lib.rs", "main.rs")):
                continue
            if p.is_dir():
                wanted.setdefault(p.name, rel(p))
            elif p.suffix == ".rs":
                wanted.setdefault(p.stem, rel(p))
        for name in MOD_DECL.findall(text):
            wanted.setdefault(name, f"its module `{name}`")
        for name, what in wanted.items():
            if name not in named:
                problems.append(
                    f"{rel(module)}: its room list (the //! lines) does not name {what}"
                )


def main():
    problems = []
    check_readme(problems)
    check_room_lists(problems)
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print(f"rooms: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("rooms: README.md's room table and every module's room list name all of src/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
