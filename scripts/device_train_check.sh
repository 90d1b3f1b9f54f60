#!/usr/bin/env bash
# End-to-end training on a CUDA machine with torch alone (the simulator-free `dummy` env; the
# device machines have no mjlab / warp): FastTD3 with the GPU recipe's defaults, a resume of it,
# and FastSAC. Prints each run's stderr (the update-mode line, the defaults line) and its last
# metrics row; the run directories go under OUT_DIR.
#   scripts/device_train_check.sh OUT_DIR [SECONDS_PER_RUN]
set -u
out=${1:?usage: device_train_check.sh OUT_DIR [SECONDS_PER_RUN]}
secs=${2:-60}
# A source checkout: the package finds its configs / tasks where the wheel would put them.
[ -e fast_lora_td3/configs ] || ln -s ../configs fast_lora_td3/configs
[ -e fast_lora_td3/tasks ] || ln -s ../tasks fast_lora_td3/tasks
common=(env.backend=dummy env.task=PointMassAsym-v0 env.num_envs=4096 device=cuda seed=1 progress=false export_at_end=false)

train() {  # NAME, then overrides
    local name=$1
    shift
    local t0=$SECONDS
    timeout $((secs + 150)) python3 -m fast_lora_td3.cli train "${common[@]}" \
        "run_dir=$out/$name" "max_wall_s=$secs" "$@" > "$out/$name.stdout" 2> "$out/$name.stderr"
    echo "== $name: rc=$? in $((SECONDS - t0)) s"
    grep -v -i "warn" "$out/$name.stderr" | tail -6
    tail -n 1 "$out/$name/metrics.jsonl" 2> /dev/null
}

train td3 total_steps=20000000
train td3 resume=true total_steps=40000000
train sac algo=fastsac total_steps=20000000
python3 - "$out" << 'EOF'
import json, sys
from pathlib import Path
for name in ("td3", "sac"):
    rows = [json.loads(x) for x in (Path(sys.argv[1]) / name / "metrics.jsonl").read_text().splitlines()]
    keep = ("env_steps", "wall_time_s", "env_steps_per_s", "updates_per_s", "critic_loss")
    print(name, len(rows), "rows; first:", {k: rows[0].get(k) for k in keep})
    print(name, "last:", {k: rows[-1].get(k) for k in keep})
EOF
ls "$out"/td3/checkpoints 2> /dev/null | tail -3
