"""Helpers for scripts/train_on_gpu.sh (the GPU training path); usable on any machine.

  python scripts/gpu_cli.py cli <make-data|train|calibrate|eval-tau> ARGS...
      hf_dspark's training CLI with the target on an accelerator. The CLI itself loads the target on the CPU
      (`targets.load_target(name, dtype)` with the default device), so this wrapper makes `load_target` default to
      $HF_DSPARK_DEVICE (default: cuda when available, else cpu) and moves eval-tau's prompt tensors there; the
      trainer and make-data follow the target's device on their own. Nothing else changes.
  python scripts/gpu_cli.py export-shards SRC DST [--max-shard-mib 15.5] [--dtype bfloat16]
      A trained drafter folder (SRC/config.json + model.safetensors) -> DST with the weights cast to bf16 and split
      into model-0000k-of-0000n.safetensors shards of at most --max-shard-mib, plus model.safetensors.index.json
      (the layout hf_dspark.checkpoints.weight_files reads). Integer buffers (draft vocabulary maps) keep their
      dtype. Every tensor is read back and compared with the source cast before the command succeeds.
  python scripts/gpu_cli.py merge-histories OUT.json RUN NAME...
      RUN/train-NAME/history.json of each variant -> OUT.json ({name: history}; one variant: its history as is).
  python scripts/gpu_cli.py merge-evals OUT.json RUN SETS NAME...
      RUN/eval-NAME-SET.json -> OUT.json ({name: {set: result}, settings}); prints the trained variant (any NAME but
      "baseline") with the highest tau summed over SETS, the one train_on_gpu.sh brings back.
  python scripts/gpu_cli.py summary HISTORY.json SD_TOKENS
      One line per variant: steps, epochs, training tokens, seconds, held-out teacher-forced tau.
  python scripts/gpu_cli.py digest FOLDER_OR_FILE
      A sha256 over the tensors (name, dtype, shape, bytes) of a safetensors file or folder, independent of the
      header's layout: the same digest here and on the GPU machine means the same target weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from pathlib import Path


def _device() -> str:
    import torch

    return os.environ.get("HF_DSPARK_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")


def run_cli(argv: list[str]) -> int:
    import torch

    import hf_dspark.targets as targets
    import hf_dspark.training.evaluate as evaluate
    from hf_dspark.training.cli import main

    device = target_device = _device()
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    original_load, original_inputs = targets.load_target, evaluate.chat_inputs

    def load_target(name, dtype=torch.float32, device=None):  # noqa: F811 - same signature, other default device
        return original_load(name, dtype=dtype, device=device or target_device)

    targets.load_target = load_target
    evaluate.chat_inputs = lambda tokenizer, prompts: original_inputs(tokenizer, prompts).to(device)
    print(f"[gpu_cli] {argv[0] if argv else ''}: target on {device}"
          + (f" ({torch.cuda.get_device_name()})" if device.startswith("cuda") else ""), flush=True)
    return main(argv)


# ------------------------------------------------------------------------------------------ safetensors, no torch
def _header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def tensor_digest(path: Path) -> str:
    """sha256 over (name, dtype, shape, data bytes) of every tensor, names sorted; files of a folder are merged."""
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise SystemExit(f"{path}: no .safetensors files")
    entries = []
    for file in files:
        header, base = _header(file)
        entries += [(name, meta, file, base) for name, meta in header.items() if name != "__metadata__"]
    h = hashlib.sha256()
    for name, meta, file, base in sorted(entries, key=lambda e: e[0]):
        start, stop = meta["data_offsets"]
        h.update(f"{name}|{meta['dtype']}|{meta['shape']}|".encode())
        with open(file, "rb") as f:
            f.seek(base + start)
            left = stop - start
            while left:
                chunk = f.read(min(left, 1 << 24))
                if not chunk:
                    raise SystemExit(f"{file}: truncated at tensor {name}")
                h.update(chunk)
                left -= len(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ sharded bf16 export
def export_shards(src: Path, dst: Path, max_shard_mib: float, dtype_name: str) -> int:
    import shutil

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    dtype = getattr(torch, dtype_name)
    weights = src / "model.safetensors"
    if not weights.is_file() or not (src / "config.json").is_file():
        raise SystemExit(f"{src} is not a drafter folder (config.json + model.safetensors expected)")
    with safe_open(str(weights), framework="pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
    limit = int(max_shard_mib * 2**20) - 64 * 1024  # room for each file's header
    shards: list[dict] = [{}]
    size = 0
    for name in sorted(state, key=lambda k: -state[k].numel() * state[k].element_size()):
        nbytes = state[name].numel() * state[name].element_size()
        if nbytes > limit:
            raise SystemExit(f"tensor {name} alone is {nbytes / 2**20:.1f} MiB > --max-shard-mib {max_shard_mib}")
        placed = False
        for shard in shards:  # first fit, largest tensors first
            used = sum(t.numel() * t.element_size() for t in shard.values())
            if used + nbytes <= limit:
                shard[name] = state[name]
                placed = True
                break
        if not placed:
            shards.append({name: state[name]})
        size += nbytes
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    n = len(shards)
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        save_file(shard, str(dst / fname), metadata={"format": "pt", "producer": "hf_dspark"})
        weight_map.update({k: fname for k in shard})
    index = {"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    shutil.copyfile(src / "config.json", dst / "config.json")
    if (src / "calibration.json").is_file():
        shutil.copyfile(src / "calibration.json", dst / "calibration.json")
    # read back: every tensor, bit for bit
    back = {}
    for fname in sorted(set(weight_map.values())):
        back.update(load_file(str(dst / fname)))
    bad = [k for k in state if k not in back or back[k].dtype != state[k].dtype or not torch.equal(back[k], state[k])]
    if bad or set(back) != set(state):
        raise SystemExit(f"export check failed for {bad[:5] or sorted(set(back) ^ set(state))[:5]}")
    largest = max((dst / f).stat().st_size for f in set(weight_map.values()))
    print(f"[export-shards] {dst}: {len(state)} tensors, {size / 2**20:.1f} MiB as {dtype_name} in {n} shard(s) "
          f"(largest file {largest / 2**20:.2f} MiB); read back bit for bit")
    return 0


# ------------------------------------------------------------------------------------------ variants' results
def merge_histories(out: Path, run: Path, names: list[str]) -> int:
    hist = {n: json.loads((run / f"train-{n}/history.json").read_text())
            for n in names if (run / f"train-{n}/history.json").is_file()}
    out.write_text(json.dumps(hist if len(names) > 1 else next(iter(hist.values()), []), indent=1) + "\n")
    return 0


def merge_evals(out: Path, run: Path, sets: list[str], names: list[str]) -> str:
    merged: dict = {}
    settings = None
    for n in names:
        for s in sets:
            p = run / f"eval-{n}-{s}.json"
            if p.is_file():
                d = json.loads(p.read_text())
                merged.setdefault(n, {})[s] = d[s]
                settings = {k: v for k, v in d["settings"].items() if k != "drafter"}
    if settings is not None:
        merged["settings"] = {**settings, "sets": sets}
        out.write_text(json.dumps(merged, indent=1) + "\n")
    for n in names:
        taus = ", ".join(f"{s} {merged[n][s]['tau']:.3f}" for s in sets if s in merged.get(n, {}))
        print(f"[eval] {n} tau: {taus or 'no result (timed out or failed)'}", file=sys.stderr)

    def summed(n: str) -> float:
        return sum(merged.get(n, {}).get(s, {}).get("tau", 0.0) for s in sets)

    trained = [n for n in names if n != "baseline"]
    return max(trained, key=summed) if trained else ""


def summary(history: Path, sd_tokens: str) -> int:
    h = json.loads(history.read_text())
    for name, hist in h.items() if isinstance(h, dict) else [("main", h)]:
        if hist:
            last = hist[-1]
            print(f"[summary] {name}: steps {last['step']}, epochs {last['epoch']}, training tokens "
                  f"{last['tokens_seen']}, train seconds {last['train_seconds']}, held-out tau_tf {last.get('eval_tau_tf')}")
    print(f"[summary] self-distilled response tokens {sd_tokens}")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "cli":
        return run_cli(rest)
    if command == "digest":
        if len(rest) != 1:
            raise SystemExit("usage: gpu_cli.py digest FOLDER_OR_FILE")
        print(tensor_digest(Path(rest[0])))
        return 0
    if command == "export-shards":
        import argparse

        p = argparse.ArgumentParser(prog="gpu_cli.py export-shards")
        p.add_argument("src", type=Path)
        p.add_argument("dst", type=Path)
        p.add_argument("--max-shard-mib", type=float, default=15.5)
        p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
        a = p.parse_args(rest)
        return export_shards(a.src, a.dst, a.max_shard_mib, a.dtype)
    if command == "merge-histories" and len(rest) >= 3:
        return merge_histories(Path(rest[0]), Path(rest[1]), rest[2:])
    if command == "merge-evals" and len(rest) >= 4:
        print(merge_evals(Path(rest[0]), Path(rest[1]), rest[2].split(","), rest[3:]))
        return 0
    if command == "summary" and len(rest) == 2:
        return summary(Path(rest[0]), rest[1])
    raise SystemExit(f"unknown command or arguments {argv!r}; see --help")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
