"""One target forward of N new tokens over a 200-token cache, with torch's default linear layers and with
`hf_dspark.prepack_linears`, on two copies of the real target in one process, calls alternated (paired ratios).

Every round times each N with both, back to back. Prints, per N, the median milliseconds of each and the median of
the paired ratios prepacked / default; then the verify step's price in one-token steps (N = 8 against N = 1 of the
same round, the full block of a block-7 drafter) for both, and whether the prepacked rows are batch-invariant (each
position's logits bitwise the same at N = 1 and N = 8).

`OMP_NUM_THREADS=2 python scripts/prepacked_linear_speed.py [dtype=float32] [repeats=15]`"""

import statistics
import sys
import time

import torch

from hf_dspark.prepack import is_prepacked
from hf_dspark.targets import load_target

dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 15
models = {
    "default": load_target("smollm2-135m-instruct", dtype=dtype, prepack=False)[0],
    "prepacked": load_target("smollm2-135m-instruct", dtype=dtype, prepack=True)[0],
}
assert is_prepacked(models["prepacked"]) and not is_prepacked(models["default"])
ids = torch.randint(0, models["default"].config.vocab_size, (1, 216), generator=torch.Generator().manual_seed(0))


def step_ms(model, cache, n: int) -> tuple[float, torch.Tensor]:
    """One forward of n new tokens on top of the cache (cropped back afterwards): (milliseconds, logits [n, V])."""
    start = time.perf_counter()
    logits = model(ids[:, 200 : 200 + n], cache=cache, use_cache=True, logits_to_keep=n).logits[0]
    elapsed = (time.perf_counter() - start) * 1e3
    cache.crop(-n)
    return elapsed, logits


SIZES = (1, 2, 4, 8, 16, 64)
print(f"{dtype}, {torch.get_num_threads()} threads, {repeats} rounds, 200 cached tokens")
print("| N | default ms | prepacked ms | prepacked / default |\n|---:|---:|---:|---:|")
with torch.no_grad():
    caches = {kind: model(ids[:, :200], use_cache=True).past_key_values for kind, model in models.items()}
    times = {(kind, n): [] for kind in models for n in SIZES}
    for _ in range(repeats + 1):  # each round times every N with both, back to back; the first round warms up
        for n in SIZES:
            for kind, model in models.items():
                times[kind, n].append(step_ms(model, caches[kind], n)[0])
    times = {key: t[1:] for key, t in times.items()}
    for n in SIZES:
        ratio = statistics.median(p / d for p, d in zip(times["prepacked", n], times["default", n]))
        default, prepacked = statistics.median(times["default", n]), statistics.median(times["prepacked", n])
        print(f"| {n} | {default:.1f} | {prepacked:.1f} | {ratio:.2f} |")
    for kind in models:
        price = statistics.median(a / b for a, b in zip(times[kind, 8], times[kind, 1]))
        print(f"{kind}: a verify step of 8 tokens costs {price:.2f} one-token steps (median over rounds)")
    model, cache = models["prepacked"], caches["prepacked"]
    block = step_ms(model, cache, 8)[1]  # [8, V]
    first = step_ms(model, cache, 1)[1]  # [1, V]: the same first position alone
    print(f"prepacked: the first position's logits at N = 1 and N = 8 bitwise equal: {torch.equal(first[0], block[0])}")
