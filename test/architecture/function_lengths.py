#!/usr/bin/env python3
"""The longest functions of src/ and sim/ (issue #37: a function of about 100 lines does more
than one thing). Prints `lines file function`, longest first.

`function_lengths.py [--root REPO] [--top N] [--max L]`
  --root  the repository (default: the folder two levels above this file)
  --top   how many functions to print (default 15; 0: all)
  --max   exit 1 when a function longer than L lines has no `// long:` comment (saying why it
          stays whole) on the comment lines right above it; those functions are printed

A heuristic, not a parser: comments, string and character literals and preprocessor lines are
blanked, then the braces are matched. A `{` at namespace or class level whose header has a
parameter list opens a function definition, counted from its header's first line to its closing
brace; lambdas and local classes inside a function are part of it, not entries of their own.
Functions defined inside a class body are named `Class::name`, as those defined outside it are.
"""
import argparse
import os
import re
import sys

KEYWORDS_NOT_NAMES = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype",
                      "alignof", "static_assert", "noexcept", "requires", "__attribute__"}
ACCESS = re.compile(r"^\s*(?:public|private|protected)\s*:(?!:)")


def blank(text):
    """The text with comments, literals and preprocessor lines replaced by spaces (newlines
    kept, so that offsets keep their line numbers)."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        ch = text[i]
        if line_start and ch in " \t":
            i += 1
            continue
        if line_start and ch == "#":  # a preprocessor line, with its continuations
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            wipe(i, j)
            i = j
            continue
        line_start = ch == "\n"
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            wipe(i, j)
            i = j
        elif ch == "R" and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            wipe(i + 1, j)
            i = j
        elif ch == '"' or (ch == "'" and not (i > 0 and text[i - 1].isalnum())):
            # (a ' after a digit or letter is a digit separator: 1'000)
            j = i + 1
            while j < n and text[j] != ch and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            wipe(i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


def matching(code, at):
    """The index of the brace that closes the one at `at`."""
    depth = 0
    for k in range(at, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(code) - 1


def top_level_paren(header):
    """The index of the first '(' outside <...> brackets, or -1."""
    angle = 0
    for k, ch in enumerate(header):
        if ch == "<" and not header[max(0, k - 8):k].rstrip().endswith("operator"):
            angle += 1
        elif ch == ">" and angle > 0 and header[k - 1] != "-":
            angle -= 1
        elif ch == "(" and angle == 0:
            return k
    return -1


def function_name(header):
    """The name a definition's header declares, or None when it declares no function."""
    m = re.search(r"\boperator\s*(\(\)|\[\]|[^\s(]+)\s*\(", header)
    if m:
        before = re.search(r"((?:[A-Za-z_]\w*\s*::\s*)*)$", header[:m.start()])
        return (before.group(1) + "operator" + m.group(1)).replace(" ", "")
    p = top_level_paren(header)
    if p < 0:
        return None
    m = re.search(r"((?:[A-Za-z_]\w*(?:<[^<>()]*>)?\s*::\s*)*~?[A-Za-z_]\w*)\s*$", header[:p])
    if not m:
        return None
    name = re.sub(r"\s+", "", m.group(1))
    if name.split("::")[-1] in KEYWORDS_NOT_NAMES:
        return None
    return name


def scope_kind(header):
    """'namespace', 'class' (with its name) or None for a header opening a scope that holds
    definitions."""
    h = re.sub(r"^\s*template\s*<.*?>\s*", "", header, flags=re.S)
    h = re.sub(r"\[\[.*?\]\]", " ", h, flags=re.S).strip()
    if re.match(r"(inline\s+)?namespace\b", h) or re.match(r'extern\s*"\s*"', h):
        return ("namespace", None)
    m = re.match(r"(?:class|struct|union)\b\s*(?:alignas\s*\([^)]*\)\s*)?([A-Za-z_]\w*)?", h)
    if m and "(" not in h.split(":")[0] and "=" not in h:
        return ("class", m.group(1) or "")
    return None


def definitions(code, start, end, prefix, out):
    """Appends (first offset, last offset, name) for every function defined in code[start:end],
    a namespace or class body whose members are named `prefix`name."""
    k = start
    header_start = start
    while k < end:
        ch = code[k]
        if ch in ";}":
            k += 1
            header_start = k
            continue
        if ch != "{":
            k += 1
            continue
        header = code[header_start:k]
        # Access specifiers are not part of the next member's header.
        while True:
            m = ACCESS.match(header)
            if not m:
                break
            header_start += m.end()
            header = code[header_start:k]
        close = matching(code, k)
        scope = scope_kind(header)
        if scope and scope[0] == "namespace":
            definitions(code, k + 1, close, prefix, out)
            k = close + 1
            header_start = k
            continue
        if scope and scope[0] == "class":
            definitions(code, k + 1, close, prefix + (scope[1] + "::" if scope[1] else ""), out)
            k = close + 1
            header_start = k
            continue
        name = function_name(header)
        signature = re.sub(r"^\s*template\s*<.*?>\s*", "", header, flags=re.S)
        paren = top_level_paren(signature)
        before_paren = re.sub(r"\boperator\s*\S*?\(", "", signature[:paren if paren >= 0 else None])
        if name is None or "=" in before_paren or re.match(r"\s*enum\b", signature):
            # An initializer, an enum, a brace-initialized variable: not a function.
            k = close + 1
            header_start = k
            continue
        # A constructor's member initialized with braces (`a_{x}`) opens no body: after the
        # init list's ':' a body's brace follows ')' or '}', a member's its name.
        if re.search(r"\)\s*:(?!:)", header) and re.search(r"[\w>]$", header.rstrip()):
            k = close + 1
            continue
        body_start = header_start + (len(header) - len(header.lstrip()))
        out.append((body_start, close, prefix + name))
        k = close + 1
        header_start = k


def functions_of(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    code = blank(text)
    found = []
    definitions(code, 0, len(code), "", found)
    lines = text.split("\n")
    result = []
    for first, last, name in found:
        first_line = code.count("\n", 0, first)  # 0-based
        last_line = code.count("\n", 0, last)
        # The comment lines right above the definition.
        above = []
        j = first_line - 1
        while j >= 0 and lines[j].strip().startswith("//"):
            above.append(lines[j])
            j -= 1
        marked = any("// long:" in a for a in above)
        result.append((last_line - first_line + 1, first_line + 1, name, marked))
    return result


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(here)))
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--max", type=int, default=None)
    args = ap.parse_args()

    rows = []
    for part in ("src", "sim"):
        for d, _, files in os.walk(os.path.join(args.root, part)):
            for name in sorted(files):
                if not name.endswith(".cpp"):
                    continue
                path = os.path.join(d, name)
                rel = os.path.relpath(path, args.root)
                for length, line, fn, marked in functions_of(path):
                    rows.append((length, rel, line, fn, marked))
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    shown = rows if args.top <= 0 else rows[:args.top]
    for length, rel, line, fn, marked in shown:
        print(f"{length:5d} {rel}:{line} {fn}" + ("  (long:)" if marked else ""))
    if args.max is not None:
        over = [r for r in rows if r[0] > args.max and not r[4]]
        if over:
            print(f"\n{len(over)} function(s) over {args.max} lines without a `// long:` comment:")
            for length, rel, line, fn, _ in over:
                print(f"{length:5d} {rel}:{line} {fn}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
