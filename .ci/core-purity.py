#!/usr/bin/env python3
"""Fails when the pure part of leaderd, src/core/, could reach anything but
itself, std and plain-data crates. Prints one line per offence, naming the
file and line.

In the code of every `.rs` file under src/core/ (comments and string
literals left out):

- a path (in a `use`, or written inline) must start with `crate::core`,
  `self`, `super`, `Self`, std (`std`, `core`, `alloc`), a crate of
  PLAIN_DATA (under src/core/model/, the model checker's, also one of
  MODEL_ONLY), a primitive type (`u64::MAX`), a tool of attributes
  (`clippy::`), or a name the file itself declares (`mod x;`) or imports;
  so `crate::lease`, `tokio`, `rand`, `aws_sdk_dynamodb`, `rusqlite`,
  `hyper`, ... are offences;
- no path into the parts of std that do IO, read a clock, start threads
  or share state between them (STD_DENIED, wherever it is written:
  `use std::{fs, ...}` too);
- none of the words that would read a clock, start a thread or take a
  lock, however they were imported (DENIED_WORDS);
- no printing outside the model checker (it prints the states it
  explored);
- the model checker is declared for tests only (`#[cfg(test)] mod model;`).
"""
import itertools
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORE = ROOT / "src" / "core"
MODEL = CORE / "model"

# Plain data: types and derives, no IO, no clock, no threads.
PLAIN_DATA = {"serde", "thiserror"}
# The model checker (tests only) runs on stateright.
MODEL_ONLY = {"stateright"}
STD = {"std", "core", "alloc"}
PRIMITIVES = {
    "bool", "char", "str", "f32", "f64", "i8", "i16", "i32", "i64", "i128",
    "isize", "u8", "u16", "u32", "u64", "u128", "usize",
}
TOOLS = {"clippy", "rustfmt", "rustdoc"}

# Prefixes of std paths (written from `std`) the core may not use, and why.
STD_DENIED = {
    "std::thread": "starts threads",
    "std::sync::Mutex": "takes a lock",
    "std::sync::RwLock": "takes a lock",
    "std::sync::Condvar": "takes a lock",
    "std::sync::Barrier": "takes a lock",
    "std::sync::OnceLock": "is shared state",
    "std::sync::LazyLock": "is shared state",
    "std::sync::mpsc": "is a channel between threads",
    "std::sync::atomic": "is shared state",
    "std::time::Instant": "reads a clock (use crate::core::time::Instant, handed in)",
    "std::time::SystemTime": "reads a clock",
    "std::time::UNIX_EPOCH": "reads a clock",
    "std::fs": "does IO",
    "std::net": "does IO",
    "std::process": "does IO",
    "std::io": "does IO (std::fmt writes text)",
    "std::os": "does IO",
    "std::env": "reads the environment",
}
# std::env: the model checker's state budget is read from the environment.
MODEL_STD_ALLOWED = {"std::env"}

DENIED_WORDS = {
    r"\bInstant\s*::\s*now\b": "reads a clock",
    r"\bSystemTime\b": "reads a clock",
    r"\bthread\s*::": "starts threads",
    r"\bMutex\b": "takes a lock",
    r"\bRwLock\b": "takes a lock",
}
PRINTING = re.compile(r"\b(?:print|println|eprint|eprintln|dbg)\s*!")


def blank(text):
    """`text` with comments and the insides of string and char literals
    replaced by spaces (newlines kept, so line numbers stay)."""
    out = []
    i, n = 0, len(text)

    def keep_lines(s):
        return "".join(c if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(keep_lines(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(keep_lines(text[i:j]))
            i = j
        elif m := re.compile(r'b?r(#*)"').match(text, i):
            if i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_"):
                out.append(c)
                i += 1
                continue
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j
            out.append('"' + keep_lines(text[m.end() : j]) + '"')
            i = j + len(end)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('"' + keep_lines(text[i + 1 : j]) + '"')
            i = j + 1
        elif c == "'" and (m := re.compile(r"'(?:\\[^']{1,10}|[^\\'])'").match(text, i)):
            out.append("''" + " " * (m.end() - i - 2))
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def use_paths(tree):
    """The paths one `use` tree names: `a::{b, c::d as e}` -> a::b, a::c::d;
    with the name each brings into scope."""
    tree = re.sub(r"\s+as\s+", "@", tree)
    tree = re.sub(r"\s+", "", tree)

    def expand(prefix, t):
        depth, start, parts = 0, 0, []
        for k, ch in enumerate(t):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(t[start:k])
                start = k + 1
        parts.append(t[start:])
        for part in filter(None, parts):
            brace = part.find("{")
            if brace >= 0:
                head = part[:brace].rstrip(":")
                yield from expand(join(prefix, head), part[brace + 1 : part.rindex("}")])
                continue
            part, _, alias = part.partition("@")
            path = join(prefix, part)
            name = alias or path.rsplit("::", 1)[-1]
            if name == "self":
                path = prefix
                name = prefix.rsplit("::", 1)[-1]
            yield path, name

    def join(a, b):
        return f"{a}::{b}" if a and b else a or b

    yield from expand("", tree)


USE = re.compile(r"\buse\s+([^;]+);")
MOD = re.compile(r"\bmod\s+([a-z_][a-z0-9_]*)\s*[;{]")
PATH = re.compile(r"(?<![A-Za-z0-9_:])(::)?([A-Za-z_][A-Za-z0-9_]*)(\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+")


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def module_depth(path):
    """How many modules deep below src/core/ the file `path` is:
    core/mod.rs 0, core/a.rs and core/a/mod.rs 1, core/a/b.rs 2."""
    parts = path.relative_to(CORE).with_suffix("").parts
    return len(parts) - 1 if parts[-1] == "mod" else len(parts)


def inline_modules(code):
    """The spans of the inline modules (`mod tests { ... }`) in `code`."""
    spans = []
    for m in re.finditer(r"\bmod\s+[a-z_][a-z0-9_]*\s*\{", code):
        depth, j = 0, m.end() - 1
        while j < len(code):
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            if depth == 0:
                break
            j += 1
        spans.append((m.start(), j))
    return spans


def check_path(path, in_model, local, depth):
    """Why `path` (segments joined by `::`) may not be used here, `depth`
    modules below src/core/, or None."""
    segments = path.split("::")
    first = segments[0]
    if first == "super":
        ups = len(list(itertools.takewhile(lambda s: s == "super", segments)))
        if ups > depth:
            return f"uses {'::'.join(segments[: depth + 1])} (the crate root), outside src/core/"
        return None
    crates = PLAIN_DATA | (MODEL_ONLY if in_model else set())
    if first == "crate":
        if len(segments) < 2 or segments[1] != "core":
            other = segments[1] if len(segments) > 1 else ""
            return f"uses crate::{other}, outside src/core/"
        return None
    if first in STD:
        written = "std::" + "::".join(segments[1:])
        for denied, why in STD_DENIED.items():
            if in_model and denied in MODEL_STD_ALLOWED:
                continue
            if written == denied or written.startswith(denied + "::"):
                return f"uses {denied}, which {why}"
        return None
    if first in {"self", "super", "Self"} | crates | PRIMITIVES | TOOLS | local:
        return None
    if first[0].isupper():
        return None  # a type or variant in scope: its import is checked
    allowed = ", ".join(sorted(crates | {"std", "crate::core"}))
    return f"uses {first}, which is not allowed in src/core/ (only {allowed})"


def check_file(path, problems):
    rel = path.relative_to(ROOT).as_posix()
    in_model = MODEL in path.parents
    code = blank(path.read_text())
    depth = module_depth(path)
    spans = inline_modules(code)

    def depth_at(pos):
        return depth + sum(1 for a, b in spans if a < pos < b)

    modules = set(MOD.findall(code))
    # Inline paths may start with what the file imports (each import is
    # checked itself); an import only with what it declares.
    local = set(modules)
    uses = []
    for m in USE.finditer(code):
        for full, name in use_paths(m.group(1)):
            uses.append((m.start(), full.lstrip(":")))
            local.add(name)
    for pos, full in uses:
        why = check_path(full, in_model, modules, depth_at(pos))
        if why:
            problems.append(f"{rel}:{line_of(code, pos)}: {why}")
    use_spans = [(m.start(), m.end()) for m in USE.finditer(code)]
    for m in PATH.finditer(code):
        if any(a <= m.start() < b for a, b in use_spans):
            continue
        full = re.sub(r"\s+", "", m.group(0)).lstrip(":")
        if m.group(1):  # `::name`: always a crate
            local_here = set()
        else:
            local_here = local
        why = check_path(full, in_model, local_here, depth_at(m.start()))
        if why:
            problems.append(f"{rel}:{line_of(code, m.start())}: {why}")
    for pattern, why in DENIED_WORDS.items():
        for m in re.finditer(pattern, code):
            word = re.sub(r"\s+", "", m.group(0))
            problems.append(f"{rel}:{line_of(code, m.start())}: `{word}` {why}")
    if not in_model:
        for m in PRINTING.finditer(code):
            problems.append(
                f"{rel}:{line_of(code, m.start())}: prints (only the model checker prints)"
            )


def check_model_is_tests_only(problems):
    mod_rs = CORE / "mod.rs"
    if not MODEL.is_dir() or not mod_rs.is_file():
        return
    code = blank(mod_rs.read_text())
    if not re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+model\s*;", code):
        problems.append(
            "src/core/mod.rs: the model checker (`mod model`) is not declared for tests only "
            "(#[cfg(test)])"
        )


def main():
    if not CORE.is_dir():
        print("src/core/: no such folder", file=sys.stderr)
        return 1
    problems = []
    files = sorted(CORE.rglob("*.rs"))
    for path in files:
        check_file(path, problems)
    check_model_is_tests_only(problems)
    problems.sort(key=lambda p: (p.split(":")[0], int(p.split(":")[1]) if p.count(":") > 1 and p.split(":")[1].isdigit() else 0))
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print(f"core purity: {len(problems)} offence(s)", file=sys.stderr)
        return 1
    print(
        f"core purity: the {len(files)} files of src/core/ use nothing but themselves, "
        f"std and {', '.join(sorted(PLAIN_DATA))} (the model checker also "
        f"{', '.join(sorted(MODEL_ONLY))})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
