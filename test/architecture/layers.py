#!/usr/bin/env python3
"""Layers point one way (docs/ARCHITECTURE.md): every #include of src/, sim/ and
include/stratagem/ must follow an allowed arrow, a part's private headers (src/<part>/, sim/)
are included by that part alone, and the parts' CMake libraries (stratagem_part in
CMakeLists.txt) link exactly the parts ALLOWED names. Prints each place that does not and exits 1.
The build runs it before compiling any part (target stratagem_layers), and links each part alone
with its allowed parts (stratagem_link_check_<part>), so that a wrong arrow fails `cmake --build`.

`layers.py [REPO]`: REPO defaults to the folder two levels above this file.
"""
import os
import re
import sys

# The parts and the parts each may include (itself always). The one place the arrows are written;
# docs/ARCHITECTURE.md draws the same picture.
ALLOWED = {
    "base": set(),
    "core": {"base"},
    "cost": {"base", "core"},
    "io": {"base", "core"},
    "sim": {"base", "core", "cost", "io"},
    "runtime": {"base", "core", "io"},
    "search": {"base", "core", "cost", "io", "sim"},
    "profile": {"base", "core", "cost", "io", "runtime"},
    "report": {"base", "core", "io"},
    "interop": {"base", "core", "io", "cost", "sim"},
    "cli": {"base", "core", "cost", "io", "sim", "runtime", "search", "profile", "report", "interop"},
}
# Libraries a part must not include (core states what happens; it reads no file).
FORBIDDEN_LIBS = {"core": ("nlohmann/", "hdf5", "H5")}

# Each public header belongs to the part that implements it.
HEADER_PART = {
    "blocking_section": "base",
    "cluster": "core", "error": "core", "framework": "core", "iteration": "core", "layout": "core",
    "limits": "core", "model": "core", "plan": "core", "program": "core", "version": "core",
    "workload": "core", "workload_moe": "core", "moe_recipe": "core", "schedule": "core", "rank_geometry": "core",
    "cost": "cost", "estimate": "cost", "fabric": "cost",
    "layer_cost": "cost",
    "checkpoint": "io", "trace": "io", "spec_json": "io", "loaders": "io", "json_reader": "io",
    "input_file": "io", "output_file": "io", "hdf5_util": "io", "hdf5_guard": "io",
    "simulate": "sim",
    "backend": "runtime", "comm": "runtime", "cuda_device": "runtime", "data": "runtime",
    "executor": "runtime", "kernel_math": "runtime", "optimizer": "runtime",
    "parallel_state": "runtime", "tensor": "runtime", "trainer": "runtime",
    "transformer": "runtime", "watchdog": "runtime", "stop_signal": "runtime",
    "moe_math": "runtime", "moe_block": "runtime", "moe_dispatch": "runtime",
    "search": "search", "profile": "profile", "report": "report", "interop": "interop",
}


def is_private(inc):
    return inc.startswith(("src/", "sim/"))


def part_of_include(inc):
    if inc.startswith("src/"):
        return inc.split("/")[1]
    if inc.startswith("sim/"):
        return "sim"
    if inc.startswith("stratagem/"):
        stem = os.path.splitext(inc.split("/")[1])[0]
        return HEADER_PART.get(stem, "?" + stem)
    return None


def check_cmake(repo):
    """The parts' libraries in CMakeLists.txt, `stratagem_part(NAME [PARTS ...] [LIBS ...])`,
    link exactly the parts ALLOWED names (the link check then holds the code to them), and a part
    with FORBIDDEN_LIBS links none of them."""
    path = os.path.join(repo, "CMakeLists.txt")
    if not os.path.exists(path):
        return 0
    text = open(path, encoding="utf-8").read()
    bad, declared = 0, {}
    for m in re.finditer(r"^stratagem_part\(([^)]*)\)", text, re.M):
        words = m.group(1).split()
        line = text.count("\n", 0, m.start()) + 1
        part, parts, libs, section = words[0], set(), [], None
        for w in words[1:]:
            if w in ("PARTS", "LIBS"):
                section = w
            elif section == "PARTS":
                parts.add(w)
            else:
                libs.append(w)
        declared[part] = line
        if part not in ALLOWED:
            print(f"CMakeLists.txt:{line}: stratagem_part({part}) is no part of layers.py")
            bad += 1
            continue
        if parts != ALLOWED[part]:
            print(f"CMakeLists.txt:{line}: stratagem_{part} links parts {sorted(parts)}, "
                  f"layers.py allows {sorted(ALLOWED[part])}")
            bad += 1
        for lib in libs:
            if any(f in lib.lower() for f in ("nlohmann", "hdf5")) and part in FORBIDDEN_LIBS:
                print(f"CMakeLists.txt:{line}: {part} must not link {lib}")
                bad += 1
    for part in ALLOWED:
        if part != "cli" and part not in declared:
            print(f"CMakeLists.txt: no stratagem_part({part})")
            bad += 1
    return bad


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    bad = checked = 0
    for top in ("src", "sim", "include/stratagem"):
        for root, _, files in os.walk(os.path.join(repo, top)):
            for f in sorted(files):
                if not f.endswith((".cpp", ".hpp", ".cu", ".cuh", ".h")):
                    continue
                path = os.path.join(root, f)
                rel = os.path.relpath(path, repo)
                if top == "include/stratagem":
                    part = HEADER_PART.get(os.path.splitext(f)[0], "?")
                elif top == "sim":
                    part = "sim"
                else:
                    part = rel.split(os.sep)[1]
                if part not in ALLOWED:
                    print(f"{rel}: belongs to no known part ({part}): add it to layers.py")
                    bad += 1
                    continue
                for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                    m = re.match(r'\s*#\s*include\s*[<"]([^">]+)[">]', line)
                    if not m:
                        continue
                    inc = m.group(1)
                    checked += 1
                    if any(inc.startswith(lib) for lib in FORBIDDEN_LIBS.get(part, ())):
                        print(f"{rel}:{n}: {part} must not include <{inc}>")
                        bad += 1
                    target = part_of_include(inc)
                    if target and target != part and target not in ALLOWED[part]:
                        print(f"{rel}:{n}: {part} -> {target} ({inc}) is not an allowed arrow")
                        bad += 1
                    elif is_private(inc) and (target != part or top == "include/stratagem"):
                        # A public header hands what it includes to every user; another part
                        # reaches a part through its public headers (include/stratagem/).
                        print(f"{rel}:{n}: {part} includes {inc}, private to {target}: "
                              f"use or add a public header in include/stratagem/")
                        bad += 1
    bad += check_cmake(repo)
    print(f"layers: {checked} includes checked, {bad} against the arrows")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
