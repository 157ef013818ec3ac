"""Output checks for test/slurm/run.sh (run by /usr/bin/python3, which has h5py).

  check.py json FILE [KEY ...]        valid JSON holding each KEY (at any depth)
  check.py h5 FILE                    an HDF5 file h5py opens; prints its top-level names
  check.py steps LOG                  "first last count" of the step numbers in a log.jsonl
  check.py compare RESUMED REFERENCE FIRST_PART
      RESUMED: log.jsonl of the interrupted-and-requeued run; REFERENCE: the uninterrupted
      run's; FIRST_PART: RESUMED as it was when the first start ended. Checks that the second
      start continued where the first stopped (not at step 0) and that every step's loss is the
      same %.9g string as in the reference run.
Exit 0 when the check passes, 1 with one line saying why otherwise.
"""
import json
import re
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def find_key(obj, key):
    if isinstance(obj, dict):
        if key in obj:
            return True
        return any(find_key(v, key) for v in obj.values())
    if isinstance(obj, list):
        return any(find_key(v, key) for v in obj)
    return False


def cmd_json(path, *keys):
    try:
        with open(path) as f:
            obj = json.load(f)
    except Exception as e:  # noqa: BLE001
        fail(f"{path}: not valid JSON ({e})")
    missing = [k for k in keys if not find_key(obj, k)]
    if missing:
        fail(f"{path}: no key {', '.join(missing)} (top-level keys: {list(obj)[:20] if isinstance(obj, dict) else type(obj).__name__})")
    print(f"ok: {path} is JSON with {', '.join(keys) or 'no required keys'}")


def cmd_h5(path):
    import h5py

    try:
        with h5py.File(path, "r") as f:
            names = list(f.keys())
            attrs = list(f.attrs.keys())
    except Exception as e:  # noqa: BLE001
        fail(f"{path}: h5py cannot open it ({e})")
    print(f"ok: {path} opens; groups/datasets {names[:8]}, attributes {attrs[:8]}")


# Raw text of "step" and "loss" per line: the loss is compared as written (%.9g), not re-parsed.
STEP = re.compile(r'"step"\s*:\s*(\d+)')
LOSS = re.compile(r'"loss"\s*:\s*("?[-+0-9.eEinfaINF]+"?)')


def read_log(path):
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                json.loads(line)
            except Exception as e:  # noqa: BLE001
                fail(f"{path}:{n}: not a JSON line ({e})")
            s, l = STEP.search(line), LOSS.search(line)
            if s and l:
                out.append((int(s.group(1)), l.group(1)))
    return out


def cmd_steps(path):
    log = read_log(path)
    if not log:
        print("none none 0")
    else:
        print(log[0][0], log[-1][0], len(log))


def cmd_compare(resumed, reference, first_part):
    res, ref, first = read_log(resumed), read_log(reference), read_log(first_part)
    if not first:
        fail(f"{first_part}: the first start logged no step")
    if not res:
        fail(f"{resumed}: no step logged")
    # The second start's records: what follows the first part (appended), or the whole file when
    # the runtime rewrote it.
    second = res[len(first):] if res[: len(first)] == first else res
    if not second:
        fail(f"{resumed}: nothing logged after the restart")
    stop, restart = first[-1][0], second[0][0]
    if restart == res[0][0] and restart <= first[0][0]:
        fail(f"the requeued run started again at step {restart}, not after step {stop}")
    if restart != stop + 1:
        fail(f"the requeued run resumed at step {restart}; the first start had logged up to step {stop}")
    ref_loss = dict(ref)
    compared = 0
    for step, loss in res:
        if step not in ref_loss:
            fail(f"step {step} of the resumed run is missing from the reference run")
        if loss != ref_loss[step]:
            fail(f"step {step}: loss {loss} (resumed run) != {ref_loss[step]} (uninterrupted run)")
        compared += 1
    if res[-1][0] != ref[-1][0]:
        fail(f"the resumed run ended at step {res[-1][0]}, the reference at {ref[-1][0]}")
    print(f"ok: stopped after step {stop}, resumed at step {restart} (not 0), "
          f"{compared} losses identical to the uninterrupted run (first resumed: "
          f"{second[0][1]} at step {restart}), last step {res[-1][0]}")


if __name__ == "__main__":
    cmds = {"json": cmd_json, "h5": cmd_h5, "steps": cmd_steps, "compare": cmd_compare}
    if len(sys.argv) < 3 or sys.argv[1] not in cmds:
        print(__doc__)
        sys.exit(2)
    cmds[sys.argv[1]](*sys.argv[2:])
