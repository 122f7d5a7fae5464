#!/bin/bash
# Partial credit: half for the total, half for the row count, as {"reward": r} in reward.json.
mkdir -p /logs/verifier
python3 - <<'PY'
import json
def read(path):
    try:
        return float(open(path).read().strip())
    except (OSError, ValueError):
        return None
reward = 0.0
total = read("/app/total.txt")
if total is not None and abs(total - 21.75) < 1e-9:
    reward += 0.5
if read("/app/count.txt") == 3:
    reward += 0.5
json.dump({"reward": reward}, open("/logs/verifier/reward.json", "w"))
PY
