#!/usr/bin/env python3
"""Sorts the findings of an HDF5 target's campaign (run.sh run): libhdf5's own faults from ours.

usage: triage.py FUZZ_BUILD TARGET ARTIFACT...

Each artifact (crash-, timeout-, oom-, slow-unit-) is replayed under the target (twice in one
process: some faults of libhdf5 need the state the same input left behind), and the
report's stack is read from its innermost frame outwards: the first frame that is either inside
libhdf5 or in stratagem's own sources decides. A fault whose first such frame is inside libhdf5
happened in the library before any stratagem code could look at the data (known-hdf5/README.md);
anything else is ours and fails the campaign. Prints one line per artifact and, last, a line
"ours: N" (N > 0: exit 1).
"""
import collections
import os
import re
import subprocess
import sys

# "#3 0x... in FUNCTION(ARGS) /path/file.cpp:12:5", "#4 0x... in FUNCTION (/lib/module.so+0x...)"
# or "#0 0x... (/lib/module.so+0x...)", any of them followed by " (BuildId: ...)".
FRAME = re.compile(r"^\s*#\d+ 0x[0-9a-f]+\s+(?:in (.*) )?(\S+)$")
BUILD_ID = re.compile(r" \(BuildId: \w+\)$")


def first_deciding_frame(report, root):
    """(where, function) of the innermost frame in libhdf5 or in stratagem's sources."""
    in_hdf5 = False  # inside libhdf5, looking for the first frame with a name
    for line in report.splitlines():
        m = FRAME.match(BUILD_ID.sub("", line))
        if not m:
            continue
        fn, loc = (m.group(1) or "?").split("(")[0].strip(), m.group(2).strip("()")
        if "libhdf5" in loc:
            if fn != "?":
                return "libhdf5", fn
            in_hdf5 = True
            continue
        if in_hdf5:
            return "libhdf5", "?"
        path = os.path.normpath(loc.split(":")[0])
        if path.startswith(root + "/src/") or path.startswith(root + "/test/"):
            return "stratagem", fn
    return None, None


def kind_of(report):
    for pat, kind in ((r"ERROR: libFuzzer: timeout", "hang (over the timeout)"),
                      (r"ERROR: libFuzzer: out-of-memory", "out of memory"),
                      (r"AddressSanitizer: (\S+)", None), (r"runtime error: (.*)", None),
                      (r"ERROR: libFuzzer: deadly signal", "deadly signal")):
        m = re.search(pat, report)
        if m:
            return kind or m.group(1).strip()
    return "no report on replay"


def main():
    build, target, artifacts = sys.argv[1], sys.argv[2], sys.argv[3:]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, OMPI_MCA_plm="isolated", OMPI_MCA_btl="self", OMPI_MCA_opal_signal="",
               TMPDIR=build, ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1")
    counts = collections.Counter()
    ours = 0
    for a in artifacts:
        try:
            r = subprocess.run([os.path.join(build, "fuzz_" + target), "-timeout=10",
                                "-rss_limit_mb=2048", "-malloc_limit_mb=16384", "-runs=1", os.path.abspath(a), os.path.abspath(a)],
                               cwd=build, env=env, capture_output=True, text=True, timeout=120,
                               errors="replace")
            report = r.stdout + r.stderr
            code = r.returncode
        except subprocess.TimeoutExpired as e:
            report = (e.stdout or b"").decode(errors="replace") + \
                (e.stderr or b"").decode(errors="replace")
            code = "killed after 120 s"
        where, fn = first_deciding_frame(report, root)
        kind = kind_of(report)
        # A bad access inside libhdf5 to memory that stratagem owns (a buffer too small for
        # what it asked HDF5 to read, a stack variable) is ours: ASan names the owner after the
        # access's stack.
        # Not for a use after free: ASan names the freed block's last tenant, not who kept the
        # stale pointer (libhdf5 keeps none of stratagem's buffers past a call).
        owner = re.split(r"allocated by thread|is located in stack of thread", report, maxsplit=1)
        if where == "libhdf5" and len(owner) == 2 and \
                "AddressSanitizer: heap-use-after-free" not in report and \
                first_deciding_frame(owner[1], root)[0] == "stratagem":
            where, fn = "stratagem", f"{fn} (into memory of {first_deciding_frame(owner[1], root)[1]})"
        if code == 0:
            where, kind = "not reproduced", "passes on replay"
            took = re.search(r"Executed .* in (\d+) ms", report)
            if os.path.basename(a).startswith(target + "-timeout-") and took:
                # Over the limit only while the machine was loaded (campaigns run at nice 19).
                print(f"{os.path.basename(a)}: slow, not a hang: replays in {took.group(1)} ms")
                counts[("slow under load, not a hang", "-")] += 1
                continue
        if where == "libhdf5":
            counts[(kind, fn)] += 1
            print(f"{os.path.basename(a)}: libhdf5 fault: {kind} in {fn}")
            frames = [BUILD_ID.sub("", x) for x in report.splitlines() if FRAME.match(BUILD_ID.sub("", x))]
            print("\n".join(frames[:24]))
        elif where == "not reproduced":
            print(f"{os.path.basename(a)}: {kind} (a flaky finding: counted as ours)")
            ours += 1
        else:
            ours += 1
            print(f"{os.path.basename(a)}: OURS: {kind} in {fn or '?'} (exit {code}); report:")
            print("\n".join(report.splitlines()[-40:]))
    for (kind, fn), n in sorted(counts.items()):
        print(f"summary: {n} x " + (f"libhdf5 fault: {kind} in {fn}" if fn != "-" else kind))
    print(f"ours: {ours}")
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main())
