"""Self-distillation speed: make-data's generation against plain `generate()`, same prompts, same batch, one process.

    HF_HUB_OFFLINE=1 python scripts/self_distill_speed.py --prompts runs/prompts-domain.jsonl --num-prompts 128 \
        --batch-size 64 --max-new-tokens 128 --repeats 2

Both contenders decode greedily in bf16 (the target's fast dtype here) with the same chat template:
  generate     `model.generate()` on each batch of `--batch-size` prompts in file order, left-padded, every row kept
               until the longest finishes (what a user would write);
  make-data    `hf_dspark.training.data.generate_responses` (what `hf-dspark make-data` runs): batches of similar
               prompt lengths, finished rows leave the batch and the cache;
  +states      the same, keeping the target's taps + final hidden states as it generates (`make-data
               --cache-hidden`: the feature cache `train` reads instead of running the target's forward).
Reported: generated tokens per second (tokens up to and including EOS; padding after it does not count), the median
over `--repeats` passes that alternate the order, the ratio make-data / generate, and whether the texts are
identical. Nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hf_dspark.bench import load_prompts
from hf_dspark.configuration import default_target_layer_ids
from hf_dspark.targets import fast_dtype, load_target
from hf_dspark.training.data import GenerationSettings, _chat_ids, generate_responses, generate_with_states


def plain_generate(model, tok, prompt_ids: list[list[int]], settings: GenerationSettings) -> list[list[int]]:
    """`model.generate()` per batch of prompts in the given order; responses cut after the first EOS."""
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    out = []
    for start in range(0, len(prompt_ids), settings.batch_size):
        batch = prompt_ids[start : start + settings.batch_size]
        enc = tok.pad({"input_ids": batch}, return_tensors="pt", padding=True)
        seq = model.generate(**enc, max_new_tokens=settings.max_new_tokens, do_sample=False)
        for row in seq[:, enc["input_ids"].shape[1] :].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
            out.append(row[:cut])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", default="mtbench", help="a .jsonl prompt file (text field) or a builtin set name")
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    model, tok = load_target("smollm2-135m-instruct", dtype=fast_dtype(torch.device("cpu")))
    prompts = load_prompts(args.prompts, args.num_prompts)
    ids = [_chat_ids(tok, x, None) for x in prompts]
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    taps = [i + 1 for i in default_target_layer_ids(model.config.num_hidden_layers)]
    runners = {
        "generate": lambda: plain_generate(model, tok, ids, settings),
        "make-data": lambda: [resp for _, resp in generate_responses(model, tok, ids, settings)],
        "+states": lambda: [resp for _, resp in generate_with_states(model, tok, ids, settings, taps)[0]],
    }
    speeds: dict[str, list[float]] = {k: [] for k in runners}
    texts: dict[str, list[list[int]]] = {}
    for r in range(args.repeats):
        for name in (list(runners) if r % 2 == 0 else list(runners)[::-1]):
            t0 = time.perf_counter()
            texts[name] = runners[name]()
            seconds = time.perf_counter() - t0
            speeds[name].append(sum(map(len, texts[name])) / seconds)
            print(f"pass {r + 1} {name:9s}: {speeds[name][-1]:.1f} generated tokens/s ({seconds:.1f} s)", flush=True)
    med = {k: statistics.median(v) for k, v in speeds.items()}
    same = sum(a == b for a, b in zip(texts["generate"], texts["make-data"]))
    print(f"\n{len(ids)} prompts ({args.prompts}), batch {args.batch_size}, {args.max_new_tokens} new tokens max, "
          f"{model.dtype}, {torch.get_num_threads()} threads")
    print(f"generate():  {med['generate']:.1f} tok/s\nmake-data:   {med['make-data']:.1f} tok/s  "
          f"({med['make-data'] / med['generate']:.2f}x generate())")
    print(f"+states:     {med['+states']:.1f} tok/s  ({med['+states'] / med['make-data']:.2f}x make-data; the same "
          f"responses: {texts['+states'] == texts['make-data']})")
    print(f"identical responses: {same}/{len(ids)} (bf16: batch composition can flip near-ties)")


if __name__ == "__main__":
    main()
