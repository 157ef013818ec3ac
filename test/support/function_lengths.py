#!/usr/bin/env python3
"""Lists the longest functions of the C++ sources: `function_lengths.py [--top N] DIR...`.

A heuristic brace matcher, not a parser: a function is a `{` opened at namespace or class level
whose header (the text since the previous `;`, `{` or `}`) holds a `(` and no `=` before it.
Strings, characters and comments are skipped. Lambdas count in the function that holds them.
"""
import os
import re
import sys


def strip(text):
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            m = re.match(r'R"([^(]*)\(', text[i:]) if c == '"' and i and text[i - 1] == "R" else None
            if m:
                end = text.find(")" + m.group(1) + '"', i)
                j = n if end < 0 else end + len(m.group(1)) + 2
            else:
                j = i + 1
                while j < n and text[j] != c:
                    j += 2 if text[j] == "\\" else 1
                j += 1
            out.append(c + "\n" * text.count("\n", i, j) + c)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    line, depth, header, stack = 1, 0, "", []  # stack: (is_function, start line, name)
    inside = 0  # depth of the outermost function body, 0 when outside
    for c in text:
        if c == "\n":
            line += 1
        if c == "{":
            if not inside:
                h = header.strip()
                is_fn = "(" in h and "=" not in h.split("(")[0] and not re.match(
                    r"^(namespace|struct|class|enum|union|extern)\b", h.split("\n")[-1].strip()
                    if h else "")
                if is_fn and not re.search(r"\b(if|for|while|switch)\s*\($", h):
                    name = re.findall(r"([~\w:]+(?:operator\S*)?)\s*\(", h)
                    stack.append((True, line, name[0] if name else "?"))
                    inside = depth + 1
                else:
                    stack.append((False, line, ""))
            else:
                stack.append((False, line, ""))
            depth += 1
            header = ""
        elif c == "}":
            depth -= 1
            fn, start, name = stack.pop() if stack else (False, 0, "")
            if fn and depth + 1 == inside:
                inside = 0
                yield name, start, line - start + 1
            header = ""
        elif c == ";":
            header = ""
        else:
            header += c


def main():
    args = sys.argv[1:]
    top = 10
    if args[:1] == ["--top"]:
        top, args = int(args[1]), args[2:]
    rows = []
    for d in args:
        for root, _, files in os.walk(d):
            for f in files:
                if f.endswith((".cpp", ".hpp", ".cu", ".cuh")):
                    p = os.path.join(root, f)
                    rows += [(n, name, f"{p}:{s}") for name, s, n in functions(p)]
    for n, name, where in sorted(rows, reverse=True)[:top]:
        print(f"{n:5d}  {name}  {where}")


if __name__ == "__main__":
    main()
