"""Every test runs in a temporary folder of its own (issue 41): TMPDIR and Open MPI's session
directory (orte_tmpdir_base, prte_tmpdir_base) are set, all three alike, different for every
test, and made by the fixture before it runs. Reads CTest's own listing of the build tree, so a
test added without the isolation (after test/support/isolate.cmake ran, or by a fragment that
overrides ENVIRONMENT) fails here.

  isolation.py BUILD_DIR
"""
import json
import subprocess
import sys

listing = json.loads(subprocess.run(["ctest", "--show-only=json-v1"], cwd=sys.argv[1],
                                    check=True, capture_output=True, text=True).stdout)
seen, bad = {}, []
for test in listing["tests"]:
    props = {p["name"]: p["value"] for p in test.get("properties", [])}
    if props.get("FIXTURES_SETUP") == ["stratagem_test_tmp"]:
        continue
    env = dict(e.split("=", 1) for e in props.get("ENVIRONMENT", []))
    dirs = {env.get(k) for k in ("TMPDIR", "OMPI_MCA_orte_tmpdir_base", "PRTE_MCA_prte_tmpdir_base")}
    if len(dirs) != 1 or None in dirs:
        bad.append(f"{test['name']}: TMPDIR and the MPI session directory not set alike: {dirs}")
        continue
    (d,) = dirs
    if d in seen:
        bad.append(f"{test['name']}: shares its temporary folder {d} with {seen[d]}")
    seen[d] = test["name"]
    if "stratagem_test_tmp" not in props.get("FIXTURES_REQUIRED", []):
        bad.append(f"{test['name']}: does not require the fixture that makes its folder")
assert not bad, "\n".join(bad)
print(f"ok: {len(seen)} tests, each with a temporary folder of its own")
