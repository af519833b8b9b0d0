"""Side-by-side benchmark: plain generate(), transformers' prompt lookup and native DFlash, our loop (DFlash =
Markov off, DSpark = full block, DSpark + scheduler, draft trees with and without a prompt-lookup branch, and
`dspark_default`: what a call that names no option gets) and transformers' assisted loop with our candidate generator
(full block, batch 1), in one process, same target, prompts, dtype.

    hf-dspark bench --prompts gsm8k --n 8 --batch-sizes 1,4,16 --json bench.json --plots plots/

Every contender runs the same batches, after a warm-up batch. The timed calls are interleaved as finely as
possible: in every pass, each batch is run by every contender back to back (the order rotates from call to call),
so a machine whose speed drifts -- shared CPUs easily swing +-25% within minutes -- slows the contenders of one
batch alike. Reported per contender:

- tokens/s: new tokens over the median pass time;
- speedup vs plain: the median over all (pass, batch) pairs of plain's seconds / the contender's seconds on the
  same batch, with the smallest and largest pair ratio (the spread says what "within noise" means for this run);
- p slower: the one-sided exact Wilcoxon signed-rank p-value of "slower than plain" over those pairs (small:
  slower beyond the noise; with n pairs it cannot go below 2^-n);
- decode: the same with each call's time to first token (the prefill, identical work for every contender)
  taken out, and the first token of each row not counted; TTFT is the median time to first token per call;
- scheduler ms/step: time in the verify policy (the scheduler's decisions and bookkeeping) per decoding step;
- `identical_to_plain` compares greedy outputs with an untimed plain pass (with `--temperature` every contender
  samples and outputs are not compared: our contenders draw from the target's own distribution, so the lengths of
  their texts follow the same law as plain's and the ratios stay unbiased, if noisier; the sampling exactness is a
  statistical test in `tests/`);
- `other_cpu_cores`: how many cores other processes kept busy during the timed passes; above 0.25 the report warns
  that the timings measure contention (a bench beside a training job is not a bench).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from . import cpu_load

CONTENDERS = (
    "plain", "prompt_lookup", "hf_dflash", "dflash", "dspark", "dspark_no_copy", "dspark_adaptive", "dspark_tree",
    "dspark_tree_lookup", "dspark_hf_loop", "dspark_default",
)
TREE_SIZE = 7  # the dspark_tree contenders' draft_tree_size (--tree-size)
LOOKUP_TOKENS = 7  # the dspark_tree_lookup contender's prompt_lookup_num_tokens (--lookup-tokens): its branch's cap
# contenders whose drafts are not our drafter's chain, which --synthetic-acceptance replaces
NOT_SYNTHETIC = ("prompt_lookup", "hf_dflash", "dspark_tree", "dspark_tree_lookup", "dspark_default")
PROMPT_SETS = ("gsm8k", "humaneval", "mtbench")
BATCH_1_ONLY = {
    "prompt_lookup": "transformers' assisted decoding refuses batches ('assisted generate is only supported for batch_size = 1')",
    "hf_dflash": "transformers' native DFlash runs through assisted decoding, which refuses batch_size > 1",
    "dspark_hf_loop": "transformers' assisted loop (DSparkCandidateGenerator) runs one prompt at a time",
}


@dataclass
class Record:
    contender: str
    prompt_set: str
    batch_size: int
    supported: bool = True
    reason: str = ""
    tokens_per_s: float = float("nan")
    speedup_vs_plain: float = float("nan")  # median of paired per-call ratios (plain seconds / contender seconds)
    speedup_range: list[float] = field(default_factory=list)  # [smallest, largest] paired ratio
    decode_tokens_per_s: float = float("nan")
    decode_speedup_vs_plain: float = float("nan")  # as speedup_vs_plain, time to first token taken out
    ttft_s: float = float("nan")  # median time to first token (prefill) of one batch call
    mean_accepted_length: float = float("nan")
    per_position_acceptance: list[float] = field(default_factory=list)
    verified_drafts_per_request: float = float("nan")
    scheduler_ms_per_step: float = float("nan")  # time in the verify policy per decoding step (our loop only)
    p_slower: float = float("nan")  # one-sided Wilcoxon signed-rank p that it is slower than plain (paired calls)
    step_trace: list[list[list[list[float]]]] = field(default_factory=list)  # [pass][call][step] = [R, verified/req, s]
    identical_to_plain: bool | None = None
    new_tokens: int = 0
    repeats_s: list[float] = field(default_factory=list)  # seconds of each timed pass
    calls_s: list[list[float]] = field(default_factory=list)  # [pass][batch] seconds of each call
    calls_ttft_s: list[list[float]] = field(default_factory=list)  # [pass][batch] time to first token
    synthetic_acceptance: float | None = None  # set when the drafts were synthetic (see --synthetic-acceptance)
    other_cpu_cores: float | None = None  # cores other processes kept busy during the timed passes (cpu_load.py)


def load_prompts(spec: str, n: int) -> list[str]:
    """A builtin set name (gsm8k | humaneval | mtbench) or a JSONL file with a text field."""
    from .training.data import eval_prompts, read_prompts

    if spec in PROMPT_SETS:
        prompts = eval_prompts()[spec]
    elif Path(spec).is_file():
        prompts = read_prompts(spec, fmt="jsonl")
    else:
        raise ValueError(f"Unknown prompt set {spec!r}; use one of {', '.join(PROMPT_SETS)} or a .jsonl file with a text field.")
    if not prompts:
        raise ValueError(f"{spec} has no usable prompts.")
    return [prompts[i % len(prompts)] for i in range(n)]


def parse_batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise ValueError(f"--batch-sizes must be comma-separated positive integers, got {text!r}.") from err
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"--batch-sizes must be comma-separated positive integers, got {text!r}.")
    return sizes


def parse_contenders(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in CONTENDERS]
    if bad or not names:
        raise ValueError(f"Unknown contender(s) {bad or text!r}; choose from {', '.join(CONTENDERS)}.")
    return ["plain"] + [x for x in names if x != "plain"]  # plain always runs: it is the reference


def _new_token_counts(sequences: torch.Tensor, prompt_len: int, eos: set[int]) -> list[int]:
    """New tokens per row, up to and including the first EOS (padding after it does not count)."""
    counts = []
    for row in sequences[:, prompt_len:].tolist():
        n = len(row)
        for i, tok in enumerate(row):
            if tok in eos:
                n = i + 1
                break
        counts.append(n)
    return counts


def check_sampling(temperature: float, synthetic_acceptance: float | None) -> None:
    """A temperature >= 0, and none with synthetic drafts (they are a batch's greedy output)."""
    if not temperature >= 0:
        raise ValueError(f"--temperature must be >= 0 (0: greedy), got {temperature}.")
    if temperature > 0 and synthetic_acceptance:
        raise ValueError("--synthetic-acceptance drafts each batch's greedy output; drop it or --temperature.")


class Bench:
    def __init__(
        self, model, tokenizer, drafter, dflash_drafter=None, max_new_tokens: int = 128, profile_kwargs=None,
        synthetic_acceptance: float | None = None, custom_runners: dict[str, Callable[[dict], Any]] | None = None,
        tree_size: int = TREE_SIZE, lookup_tokens: int = LOOKUP_TOKENS, temperature: float = 0.0, seed: int = 0,
    ) -> None:
        """`custom_runners`: extra contenders by name, each a callable running one encoded batch (`run(enc)` ->
        sequences), timed and checked like the built-in ones (e.g. a scheduler variant in a diagnostic script).
        `temperature` > 0: every contender samples at that temperature (the target's generation config sets the rest,
        e.g. top_k); `seed` seeds torch at the start of each `run`."""
        check_sampling(temperature, synthetic_acceptance)
        self.sampling = dict(do_sample=False)
        if temperature > 0:
            self.sampling = dict(do_sample=True, temperature=float(temperature))
        self.seed = seed
        self.custom_runners = dict(custom_runners or {})
        if clash := set(self.custom_runners) & set(CONTENDERS):
            raise ValueError(f"custom_runners may not reuse built-in contender names: {sorted(clash)}.")
        self.synthetic_acceptance = synthetic_acceptance
        self.profile_kwargs = profile_kwargs or {}
        self.model, self.tok, self.drafter = model, tokenizer, drafter
        self.dflash_drafter = dflash_drafter
        self.max_new_tokens = max_new_tokens
        self.tree_size = tree_size
        self.lookup_tokens = lookup_tokens
        eos = model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self._table = None
        self._adaptive = None  # the dspark_adaptive contender's scheduler (adaptive_policy)
        self._draw = 0  # the synthetic drafts' draw of the next call (a warm-up reuses the last one)

    def encode(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        texts = [self.tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True) for p in prompts]
        return self.tok(texts, return_tensors="pt", padding=True).to(self.model.device)

    def runner(self, contender: str) -> Callable[[dict], Any]:
        m, kw = self.model, dict(max_new_tokens=self.max_new_tokens, **self.sampling)
        if contender in self.custom_runners:
            return self.custom_runners[contender]
        if contender == "plain":
            return lambda enc: m.generate(**enc, **kw)
        if contender == "prompt_lookup":
            return lambda enc: m.generate(**enc, **kw, prompt_lookup_num_tokens=10)
        if contender == "hf_dflash":
            from .native_dflash import NativeDFlashAssistant

            assistant = NativeDFlashAssistant(self.dflash_drafter or self.drafter)
            return lambda enc: m.generate(**enc, **kw, assistant_model=assistant, speculation_type="dflash")
        if contender == "dflash":
            d = self.dflash_drafter or self.drafter
            return lambda enc: m.generate(**enc, **kw, assistant_model=d, markov=False, adaptive_verification=False)
        if contender == "dspark":
            return lambda enc: m.generate(**enc, **kw, assistant_model=self.drafter, adaptive_verification=False)
        if contender == "dspark_no_copy":  # the drafter's own picks at every slot (no copy drafting)
            return lambda enc: m.generate(**enc, **kw, assistant_model=self.drafter, adaptive_verification=False,
                                          copy_ngram=0)
        if contender == "dspark_adaptive":
            policy = self.adaptive_policy()
            return lambda enc: m.generate(**enc, **kw, assistant_model=self.drafter, verify_policy=policy)
        if contender == "dspark_tree":
            return lambda enc: m.generate(**enc, **kw, assistant_model=self.drafter, draft_tree_size=self.tree_size,
                                          prompt_lookup_num_tokens=0)
        if contender == "dspark_tree_lookup":
            return lambda enc: m.generate(**enc, **kw, assistant_model=self.drafter, draft_tree_size=self.tree_size,
                                          prompt_lookup_num_tokens=self.lookup_tokens)
        if contender == "dspark_hf_loop":
            return lambda enc: m.generate(**enc, **kw, assistant_model=self.drafter, dspark_engine="transformers")
        if contender == "dspark_default":  # what a call that names no option gets (a tree or the scheduler)
            return lambda enc: m.generate(**enc, **kw, assistant_model=self.drafter)
        raise ValueError(f"Unknown contender {contender!r}; choose from {', '.join(CONTENDERS + tuple(self.custom_runners))}.")

    def adaptive_policy(self):
        """The `dspark_adaptive` contender's scheduler: the drafter's calibration and held-out tau as the prior (with
        synthetic drafts: uncalibrated confidences, which are exact by construction, and the synthetic tau). One per
        bench, kept across calls and batch sizes (carry_over) like the one `generate()` keeps per drafter: its
        measured step costs at one batch size price the next (with a scheduler per batch size, the first timed pass
        at synthetic batch 4 ran at 0.87x of the full block at e7e5698, the later passes at ~0.98x)."""
        if self._adaptive is not None:
            return self._adaptive
        from .scheduler import AdaptiveVerification, geometric_survival, prior_survival

        B = self.drafter.config.block_size
        if self.synthetic_acceptance:
            temps, prior = None, geometric_survival(1 + sum(self.synthetic_acceptance**k for k in range(1, B + 1)), B)
        else:
            temps, prior = (self.drafter.calibration or {}).get("temperatures"), prior_survival(self.drafter.calibration, B)
        self._adaptive = AdaptiveVerification(self.step_table(), temperatures=temps, carry_over=True, prior_survival=prior)
        return self._adaptive

    def step_table(self):
        """Profiled fresh for this run's batch sizes (a cached table may cover other sizes)."""
        if self._table is None:
            from .step_table import profile

            self._table = profile(self.model, target_id=str(self.model.name_or_path), **self.profile_kwargs)
        return self._table

    def run(self, prompt_set: str, prompts: list[str], batch_size: int, contenders: list[str], repeats: int) -> list[Record]:
        """Time every contender on the same batches: in each pass every batch is run by all contenders back to back,
        in an order that rotates from call to call (see the module docstring)."""
        torch.manual_seed(self.seed)
        total = -(-len(prompts) // batch_size) * batch_size  # whole batches, prompts cycled to fill the last
        cycled = [prompts[i % len(prompts)] for i in range(total)]
        batches = [cycled[i : i + batch_size] for i in range(0, total, batch_size)]
        encoded = [self.encode(b) for b in batches]
        plain = self.runner("plain")
        reference = [plain(enc) for enc in encoded]  # untimed: the outputs every contender must reproduce
        records, runs = [], {}
        for contender in contenders:
            rec = Record(contender, prompt_set, batch_size)
            records.append(rec)
            if batch_size > 1 and contender in BATCH_1_ONLY:
                rec.supported, rec.reason = False, BATCH_1_ONLY[contender]
                continue
            run = plain if contender == "plain" else self.runner(contender)
            if self.synthetic_acceptance and contender != "plain":
                run = self._with_synthetic_drafts(run, encoded, reference)
                rec.synthetic_acceptance = self.synthetic_acceptance
            run(encoded[0])  # warm-up, excluded
            runs[contender] = run
        timed = [r for r in records if r.supported]
        outputs = {r.contender: [None] * len(encoded) for r in timed}  # of the last pass
        stats = {r.contender: [[] for _ in encoded] for r in timed}  # drafter stats of the last pass
        traces = {r.contender: [] for r in timed}  # [pass][call][step] of every pass
        with cpu_load.OtherCpuUse() as load:
            self._timed_passes(encoded, timed, runs, outputs, stats, traces, repeats, f"{prompt_set} bs={batch_size}")
        for rec in timed:
            rec.other_cpu_cores = load.cores
            new = [  # new tokens per row, all batches of the last pass
                n for out, enc in zip(outputs[rec.contender], encoded)
                for n in _new_token_counts(out, enc["input_ids"].shape[1], self.eos)
            ]
            rec.new_tokens = sum(new)
            rec.repeats_s = [sum(calls) for calls in rec.calls_s]
            rec.tokens_per_s = rec.new_tokens / statistics.median(rec.repeats_s)
            decode_tokens = sum(max(n - 1, 0) for n in new)  # each row's first token comes with the prefill
            rec.decode_tokens_per_s = decode_tokens / statistics.median(sum(d) for d in decode_seconds(rec))
            rec.ttft_s = statistics.median(t for ttfts in rec.calls_ttft_s for t in ttfts)
            if not self.sampling["do_sample"]:  # sampled texts differ from call to call
                rec.identical_to_plain = all(torch.equal(a, b) for a, b in zip(outputs[rec.contender], reference))
            if done := [s for per_batch in stats[rec.contender] for s in per_batch]:
                accepted = [a for s in done for a in s.accepted_lengths]
                verified = [v for s in done for v in s.verified_lengths]
                rec.mean_accepted_length = sum(accepted) / max(1, len(accepted))
                rec.verified_drafts_per_request = sum(verified) / max(1, len(verified))
                merged = type(done[0])(block_size=done[0].block_size, accepted_lengths=accepted, verified_lengths=verified)
                rec.per_position_acceptance = merged.per_position_acceptance
                rec.scheduler_ms_per_step = 1000 * sum(s.policy_time_s for s in done) / max(1, sum(s.steps for s in done))
                rec.step_trace = traces[rec.contender]
        compare_with_plain(records)
        return records

    def _timed_passes(self, encoded, timed, runs, outputs, stats, traces, repeats: int, desc: str) -> None:
        """`repeats` passes; in each, every batch is run by all contenders back to back, in an order that rotates from
        call to call. Fills each record's call times, and outputs / stats (of the last pass) / traces (every pass)."""
        for p in tqdm(range(repeats), desc=desc, leave=False):
            for rec in timed:
                rec.calls_s.append([])
                rec.calls_ttft_s.append([])
            for b, enc in enumerate(encoded):
                self._draw = p * len(encoded) + b  # synthetic drafts: one draw per call, shared by its contenders
                k = (p * len(encoded) + b) % len(timed)
                for rec in timed[k:] + timed[:k]:
                    outputs[rec.contender][b], stats[rec.contender][b] = self._timed_call(runs[rec.contender], enc, rec)
            for rec in timed:
                if done := [s for per_batch in stats[rec.contender] for s in per_batch]:
                    traces[rec.contender].append([_trace(s) for s in done])

    def _with_synthetic_drafts(self, run, encoded, reference):
        """Each batch drafts its own plain output with per-token acceptance `synthetic_acceptance`; which tokens are
        wrong is drawn per call (`self._draw`: pass and batch), the same for every contender of the call. (Before
        9a2fc6c every call used the same draw, so each contender met one realization of luck over and over.)"""
        from .testing import synthetic_drafts

        by_batch = {id(enc): ref for enc, ref in zip(encoded, reference)}

        def wrapped(enc):
            with synthetic_drafts(by_batch[id(enc)], self.synthetic_acceptance, seed=self._draw):
                return run(enc)

        return wrapped

    def _timed_call(self, run, enc, rec: Record):
        """Run one batch, appending its seconds and time to first token to rec's current pass -> (output, stats).

        The time to first token ends when the target's first forward (the prefill) returns, for every contender.
        """
        drafters = [d for d in (self.drafter, self.dflash_drafter) if d is not None]
        for d in drafters:
            d.last_stats = None
        first_forward_end: list[float] = []

        def on_forward(*_):
            if not first_forward_end:
                first_forward_end.append(time.perf_counter())

        hook = self.model.register_forward_hook(on_forward)
        try:
            t0 = time.perf_counter()
            out = run(enc)
            seconds = time.perf_counter() - t0
        finally:
            hook.remove()
        rec.calls_s[-1].append(seconds)
        rec.calls_ttft_s[-1].append(first_forward_end[0] - t0 if first_forward_end else 0.0)
        return out, [d.last_stats for d in drafters if d.last_stats is not None]


def _trace(stats) -> list[list[float]]:
    """[R, verified drafts per request, seconds] of each step of one call."""
    return [[n, v, t] for n, v, t in zip(stats.rows_per_step, stats.verified_per_step, stats.step_seconds)]


def compare_with_plain(records: list[Record]) -> None:
    """Set each timed record's paired speedup, its spread, decode speedup and p_slower against the plain record of
    the same prompt set and batch size (records without one are left as they are)."""
    plain = {(r.prompt_set, r.batch_size): r for r in records if r.contender == "plain" and r.calls_s}
    for rec in records:
        ref = plain.get((rec.prompt_set, rec.batch_size))
        if ref is None or not rec.supported or not rec.calls_s:
            continue
        rec.speedup_vs_plain, lo, hi = paired_speedup(ref.calls_s, rec.calls_s)
        rec.speedup_range = [lo, hi]
        rec.decode_speedup_vs_plain = paired_speedup(decode_seconds(ref), decode_seconds(rec))[0]
        rec.p_slower = slower_p_value(ref.calls_s, rec.calls_s)


def slower_p_value(reference_s: list[list[float]], contender_s: list[list[float]]) -> float:
    """One-sided exact Wilcoxon signed-rank p-value for "the contender is slower than the reference", over the paired
    calls' log(reference / contender seconds); exact ties are dropped, NaN without pairs.

    Small p: slower beyond this machine's noise. With n pairs p cannot go below 2^-n (3 pairs: 0.125), so a large p
    from few pairs says little.
    """
    x = [math.log(r / c) for rp, cp in zip(reference_s, contender_s) for r, c in zip(rp, cp) if r > 0 and c > 0 and r != c]
    n = len(x)
    if n == 0:
        return float("nan")
    order = sorted(range(n), key=lambda i: abs(x[i]))
    w_plus = sum(rank + 1 for rank, i in enumerate(order) if x[i] > 0)  # rank sum of the pairs the contender won
    counts = [1] + [0] * (n * (n + 1) // 2)  # counts[s]: sign patterns whose positive ranks sum to s
    for k in range(1, n + 1):
        for total in range(len(counts) - 1, k - 1, -1):
            counts[total] += counts[total - k]
    return sum(counts[: w_plus + 1]) / 2**n


def paired_speedup(reference_s: list[list[float]], contender_s: list[list[float]]) -> tuple[float, float, float]:
    """(median, smallest, largest) of reference / contender seconds over calls paired by [pass][batch]."""
    ratios = [r / c for rp, cp in zip(reference_s, contender_s) for r, c in zip(rp, cp) if c > 0]
    if not ratios:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(ratios), min(ratios), max(ratios)


def decode_seconds(rec: Record) -> list[list[float]]:
    """[pass][batch] seconds after the first token."""
    return [[c - t for c, t in zip(calls, ttfts)] for calls, ttfts in zip(rec.calls_s, rec.calls_ttft_s)]


def contention_warning(records: list[Record]) -> str | None:
    """The warning to print when other processes used the CPU during any timed pass (None when none did)."""
    return cpu_load.contention_warning(max((r.other_cpu_cores for r in records if r.other_cpu_cores is not None), default=None))


def exactness_note(records: list[Record], dtype: torch.dtype) -> str | None:
    """What a "NO" under identical means: bf16/fp16 rounding (expected) or, in fp32, a bug (None when all match)."""
    differ = sorted({r.contender for r in records if r.supported and r.identical_to_plain is False})
    if not differ:
        return None
    if dtype == torch.float32:
        return (f"WARNING: {', '.join(differ)} produced greedy text that differs from plain generate() in fp32. "
                "That is a bug in hf_dspark; please report it with this command.")
    return (f"note: identical = NO for {', '.join(differ)} is {str(dtype).removeprefix('torch.')} rounding, not a bug: "
            "a verify forward over several tokens rounds unlike one-token forwards, so near-tied greedy choices can "
            "flip. Rerun with --dtype float32 to check exactness (identical there).")


def markdown_table(records: list[Record]) -> str:
    """One row per record: throughput, paired speedup with its [min-max] spread, decode-only speedup, TTFT, tau,
    drafts verified per request per step, the scheduler's time per step."""
    lines = [
        "| set | batch | contender | tok/s | speedup vs plain [min-max] | p slower | decode speedup | TTFT s | tau "
        "| verified/req | scheduler ms/step | identical |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    fmt = lambda x, f, unit="": "-" if x != x else format(x, f) + unit  # noqa: E731  (NaN -> "-")
    for r in records:
        if not r.supported:
            lines.append(f"| {r.prompt_set} | {r.batch_size} | {r.contender} | unsupported | - | - | - | - | - | - | - | - |")
            continue
        spread = f" [{r.speedup_range[0]:.2f}-{r.speedup_range[1]:.2f}]" if len(r.speedup_range) == 2 else ""
        lines.append(
            f"| {r.prompt_set} | {r.batch_size} | {r.contender} | {r.tokens_per_s:.1f} | {r.speedup_vs_plain:.2f}x{spread} | "
            f"{fmt(r.p_slower, '.3f')} | {fmt(r.decode_speedup_vs_plain, '.2f', 'x')} | {fmt(r.ttft_s, '.2f')} | {fmt(r.mean_accepted_length, '.2f')} | "
            f"{fmt(r.verified_drafts_per_request, '.2f')} | {fmt(r.scheduler_ms_per_step, '.3f')} | "
            f"{'-' if r.identical_to_plain is None else 'yes' if r.identical_to_plain else 'NO'} |"
        )
    return "\n".join(lines)


def plot(records: list[Record], folder: str | Path) -> list[Path]:
    """Throughput vs batch size, per-position acceptance (DSpark vs DFlash), verify budget vs batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []

    def figure(name: str, title: str, xlabel: str, ylabel: str, curves: dict[str, list[tuple[float, float]]], logx: bool):
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, pts in curves.items():
            if pts:
                ax.plot(*zip(*pts), "o-", label=label)
        if logx:
            ax.set_xscale("log", base=2)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(folder / name)
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    for s in sorted({r.prompt_set for r in records}):
        recs = [r for r in records if r.prompt_set == s and r.supported]
        by = lambda c, key: sorted((r.batch_size, getattr(r, key)) for r in recs if r.contender == c)  # noqa: E731
        figure(f"throughput_{s}.png", f"Throughput ({s})", "batch size", "new tokens / s",
               {c: by(c, "tokens_per_s") for c in CONTENDERS}, logx=True)
        smallest = min(r.batch_size for r in recs)
        acceptance = {}
        for c in ("dflash", "dspark"):
            r = next((r for r in recs if r.contender == c and r.batch_size == smallest), None)
            if r is not None and r.per_position_acceptance:
                acceptance[f"{c} (tau {r.mean_accepted_length:.2f})"] = list(enumerate(r.per_position_acceptance, 1))
        figure(f"acceptance_{s}.png", f"Per-position acceptance ({s}, batch {smallest})", "draft position",
               "P(accept | prefix accepted)", acceptance, logx=False)
        figure(f"verify_budget_{s}.png", f"Verify budget ({s})", "batch size", "drafts verified per request per step",
               {c: by(c, "verified_drafts_per_request") for c in ("dspark", "dspark_adaptive")}, logx=True)
    return written


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m-instruct", help="known target name or a local HF model folder")
    p.add_argument("--drafter", default=str(default_drafter()), help="DSpark drafter folder or Hub repo")
    p.add_argument("--dflash-drafter", default=None, help="DFlash twin (markov_rank 0); default: the DSpark drafter with markov off")
    p.add_argument("--prompts", default="gsm8k", help="comma-separated builtin sets (gsm8k, humaneval, mtbench) or .jsonl files")
    p.add_argument("--n", type=int, default=8, help="prompts per set (cycled to fill batches)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-sizes", default="1", help="e.g. 1,4,16,32,64")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help=f"comma-separated subset of {', '.join(CONTENDERS)}")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="auto = bf16 on CUDA or CPUs with avx512_bf16/AMX, else fp32 (emulated bf16 GEMMs make verification slow)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes over all batches; in each, every contender runs every batch (one untimed warm-up batch first)")
    p.add_argument("--tree-size", type=int, default=TREE_SIZE, metavar="N",
                   help="the dspark_tree contenders verify a tree of N drafts: dspark_tree the drafter's N most likely, "
                        "dspark_tree_lookup those and a prompt-lookup branch competing for the N places")
    p.add_argument("--lookup-tokens", type=int, default=LOOKUP_TOKENS, metavar="K",
                   help="dspark_tree_lookup's prompt-lookup branch: at most K tokens")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy, every output checked against plain generate(); > 0: every contender "
                        "samples at this temperature (outputs not compared)")
    p.add_argument("--seed", type=int, default=0, help="torch's seed at the start of each set and batch size")
    p.add_argument("--json", default=None, help="write the records (a JSON list) here")
    p.add_argument("--plots", default=None, help="write PNG plots into this folder")
    p.add_argument("--synthetic-acceptance", type=float, default=None, metavar="ALPHA",
                   help="replace the drafts of our drafter's contenders by each batch's plain output with every token kept "
                   "with probability ALPHA (else corrupted) and calibrated confidence ALPHA: measures the loop and the "
                   "scheduler for a drafter of known quality (the real drafter pass still runs and is timed)")


def default_drafter() -> Path:
    return Path(__file__).resolve().parent.parent / "model_cards" / "dspark-smollm2-135m-instruct"


def run_cli(args: argparse.Namespace) -> int:
    from .io_utils import write_json_atomic
    from .modeling import DSparkDrafter
    from .targets import load_target

    sizes = parse_batch_sizes(args.batch_sizes)
    contenders = parse_contenders(args.contenders)
    sets = [s.strip() for s in args.prompts.split(",") if s.strip()]
    prompt_lists = {s: load_prompts(s, max(args.n, max(sizes))) for s in sets}  # validate before loading models
    if args.repeats < 1 or args.n < 1 or args.max_new_tokens < 1:
        raise ValueError("--repeats, --n and --max-new-tokens must be positive.")
    check_sampling(args.temperature, args.synthetic_acceptance)
    if args.synthetic_acceptance is not None:
        if not 0 < args.synthetic_acceptance < 1:
            raise ValueError(f"--synthetic-acceptance must be in (0, 1), got {args.synthetic_acceptance}.")
        if refused := [c for c in contenders if c in NOT_SYNTHETIC]:
            chains = [c for c in CONTENDERS if c != "plain" and c not in NOT_SYNTHETIC]
            raise ValueError(
                f"--synthetic-acceptance applies to our drafter's chain contenders only ({', '.join(chains)}); drop "
                f"{', '.join(refused)} from --contenders."
            )
    model, tok = load_target(args.target, dtype=args.dtype)
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=model)
    twin = DSparkDrafter.from_pretrained(args.dflash_drafter, target=model) if args.dflash_drafter else None
    profile_kwargs = {
        "num_requests": tuple(sorted(set(sizes) | {1})),  # one request: where every static batch ends
        "batch_tokens": [n for n in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512) if n <= 8 * max(sizes)],
        "context_len": 128,
        "repeats": 2,
        "warmup": 1,
    }
    bench = Bench(model, tok, drafter, twin, args.max_new_tokens, profile_kwargs, args.synthetic_acceptance,
                  tree_size=args.tree_size, lookup_tokens=args.lookup_tokens, temperature=args.temperature, seed=args.seed)
    records: list[Record] = []
    for s, prompts in prompt_lists.items():
        for bs in sizes:
            records += bench.run(s, prompts, bs, contenders, args.repeats)
    print(markdown_table(records))
    if warning := contention_warning(records):
        print(warning)
    if note := exactness_note(records, model.dtype):
        print(note)
    if args.json:
        write_json_atomic(args.json, [asdict(r) for r in records])
    if args.plots:
        for path in plot(records, args.plots):
            print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hf_dspark.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run_cli(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
