#!/usr/bin/env python3
"""Holds an exported job description against a framework's accepted names.

usage: check_names.py megatron|megatron-deepspeed|torchtitan|deepspeed FILE ACCEPTED.txt [SCHEDULES.txt]
Every flag (megatron), TOML section.key (torchtitan) or dotted JSON key (deepspeed) written must
be in ACCEPTED.txt; prints the first one that is not and exits 1.
"""
import json
import shlex
import sys


def accepted(path):
    with open(path) as f:
        return {line.split("#")[0].strip() for line in f if line.split("#")[0].strip()}


def json_keys(obj, prefix=""):
    for k, v in obj.items():
        yield prefix + k
        if isinstance(v, dict):
            yield from json_keys(v, prefix + k + ".")


def main():
    kind, path, names_path = sys.argv[1:4]
    names = accepted(names_path)
    text = open(path).read()
    if kind in ("megatron", "megatron-deepspeed"):
        lines = [l for l in text.splitlines() if not l.lstrip().startswith("#")]
        written = [t for t in shlex.split(" ".join(lines)) if t.startswith("--")]
    elif kind == "torchtitan":
        import tomllib
        doc = tomllib.loads(text)
        written = [f"{s}.{k}" for s, table in doc.items() for k in table]
        if len(sys.argv) > 4:
            schedule = doc.get("parallelism", {}).get("pipeline_parallel_schedule")
            if schedule is not None and schedule not in accepted(sys.argv[4]):
                sys.exit(f"schedule {schedule!r} not in {sys.argv[4]}")
    elif kind == "deepspeed":
        written = list(json_keys(json.loads(text)))
    else:
        sys.exit(f"unknown kind {kind}")
    if not written:
        sys.exit(f"{path}: nothing written")
    for name in written:
        if name not in names:
            sys.exit(f"{path}: {name} is not among the names in {names_path}")
    print(f"{len(written)} names, all accepted")


main()
