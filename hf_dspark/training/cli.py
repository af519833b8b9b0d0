"""`hf-dspark make-data | train | calibrate | finetune | eval-tau`: argparse subcommands for the training package.

The top-level CLI calls `add_subcommands(subparsers)`; each subcommand sets `func(args) -> int`.
Run one here with `python -m hf_dspark.training.cli <subcommand> ...`.
"""

from __future__ import annotations

import argparse
import sys


def _add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m-instruct", help="known target name or a local HF model folder")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="target dtype (default bfloat16)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda when available, else cpu)")


def _load(args):
    import torch

    from ..targets import load_target

    torch.manual_seed(getattr(args, "seed", 0))
    device = getattr(args, "device", "auto")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except RuntimeError as err:
        raise SystemExit(f"--device {device!r} is not a torch device ({err}); use cpu, cuda or cuda:N.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {device} asked for CUDA, but this torch build sees no GPU; use --device cpu.")
    return load_target(args.target, dtype=getattr(torch, args.dtype), device=device)


# ------------------------------------------------------------------------------------------- make-data
def _make_data(args) -> int:
    from .data import (
        CONTINUOUS_SAMPLING_REFUSED,
        DataError,
        GenerationSettings,
        cache_hidden_states,
        decontaminate,
        last_of_shuffle,
        later_turn_prompts,
        make_data,
        read_conversations,
        read_prompts,
    )

    if args.as_written:
        for flag, given in (("--heldout", args.heldout is not None), ("--start-prompt", args.start_prompt != 0),
                            ("--later-turns", args.later_turns)):
            if given:
                raise SystemExit(f"{flag} picks prompts to self-distill; --as-written reads whole conversations and "
                                 "cannot honour it. Drop one of them.")
        return _make_data_as_written(args)
    if args.engine == "continuous" and args.temperature > 0:
        raise SystemExit(CONTINUOUS_SAMPLING_REFUSED)  # before the target loads
    if args.later_turns:  # the conversations' second and later user turns, the turns before them as written
        from .evaluate import HELDOUT_POOL, drop_heldout_conversations

        prompts = later_turn_prompts(drop_heldout_conversations(read_conversations(args.prompts)))
        print(f"[make-data] {len(prompts)} later user turns of the conversations in {args.prompts} (none of the "
              f"{HELDOUT_POOL} held-out ShareGPT conversations)")
    else:
        prompts = read_prompts(args.prompts, fmt=args.format, field=args.field)
    if not args.no_decontaminate:
        prompts, dropped = decontaminate(prompts)
        print(f"[make-data] {len(prompts)} prompts ({dropped} dropped as GSM8K/HumanEval/MT-Bench-like)")
    if args.skip_prompts:
        prompts = prompts[args.skip_prompts :]
    if args.heldout is not None:  # 0 is refused by last_of_shuffle, never read as "off"
        prompts = last_of_shuffle(prompts, args.heldout, args.seed)
    model, tok = _load(args)
    settings = GenerationSettings(
        max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        batch_size=args.batch_size,
        prompts_per_shard=args.prompts_per_shard,
        do_sample=args.temperature > 0,
        temperature=args.temperature if args.temperature > 0 else 1.0,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        system_prompt=args.system_prompt,
    )
    # the loop engine keeps the target's states as it generates; continuous batching returns tokens only, so its
    # directory is cached afterwards with one more forward per sequence
    during = args.cache_hidden and args.engine == "loop"
    try:
        manifest = make_data(model, tok, prompts, args.out, settings, max_prompts=args.max_prompts,
                             start_prompt=args.start_prompt, engine=args.engine,
                             tap_ids=_tap_ids(args, model) if during else None)
        print(f"[make-data] {args.out}: {len(manifest['shards'])} shards, next prompt {manifest['next_prompt']}")
        if args.cache_hidden and not during:
            cache_hidden_states(args.out, model, _tap_ids(args, model))
    except DataError as err:
        raise SystemExit(str(err)) from None
    return 0


def _tap_ids(args, model) -> list[int]:
    """The HF hidden_states indices to cache: the taps of --drafter, else those a new drafter gets for this target."""
    from ..configuration import DSparkConfig, default_target_layer_ids

    if args.drafter:
        layer_ids = DSparkConfig.from_pretrained(args.drafter).target_layer_ids
    else:
        layer_ids = default_target_layer_ids(model.config.get_text_config().num_hidden_layers)
    return [i + 1 for i in layer_ids]


def _make_data_as_written(args) -> int:
    from .data import cache_hidden_states, decontaminate, make_data_as_written, read_conversations
    from .evaluate import HELDOUT_POOL, drop_heldout_conversations

    conversations = drop_heldout_conversations(read_conversations(args.prompts))
    print(f"[make-data] {len(conversations)} conversations in {args.prompts} (none of the {HELDOUT_POOL} held-out "
          "ShareGPT conversations)")
    if not args.no_decontaminate:
        first = [c[0]["content"] for c in conversations]
        kept = set(decontaminate(first)[0])
        before = len(conversations)
        conversations = [c for c in conversations if c[0]["content"] in kept]
        print(f"[make-data] {len(conversations)} conversations ({before - len(conversations)} dropped as GSM8K/HumanEval/MT-Bench-like)")
    if args.max_prompts:
        conversations = conversations[: args.max_prompts]
    model, tok = _load(args)
    manifest = make_data_as_written(model, tok, conversations, args.out, max_tokens=args.max_tokens, seed=args.seed)
    print(f"[make-data] {args.out}: {sum(s['num_sequences'] for s in manifest['shards'])} sequences, "
          f"{sum(s['num_response_tokens'] for s in manifest['shards'])} response tokens")
    if args.cache_hidden:  # no generation here to keep states from: one forward per sequence
        cache_hidden_states(args.out, model, _tap_ids(args, model))
    return 0


def _add_make_data(sub) -> None:
    p = sub.add_parser(
        "make-data",
        help="self-distillation data: prompts -> the target's responses -> sharded token ids + loss masks",
        description="Generate responses with the target itself (chat template, batched) and store token ids + "
        "loss masks in atomic shards. Rerunning the same command resumes where a killed run stopped.",
    )
    p.add_argument("--prompts", required=True,
                   help="JSONL (a text field, or a messages list ending with a user turn) or ShareGPT-style JSON; "
                   "'sharegpt' = the wheel's file")
    p.add_argument("--later-turns", action="store_true",
                   help="answer the second and later user turns of the ShareGPT-style conversations in --prompts, the "
                   "turns before them as written (by default a conversation gives its first user turn only); the held-out "
                   "ShareGPT conversations are left out")
    p.add_argument("--format", default="auto", choices=["auto", "jsonl", "sharegpt"])
    p.add_argument("--field", default=None, help="JSONL field with the prompt (default text/prompt/instruction/question/input)")
    p.add_argument("--out", required=True, help="data directory (created; resumed if it exists)")
    _add_target(p)
    p.add_argument("--max-prompts", type=int, default=None, help="stop after this many prompts of the shuffled list")
    p.add_argument(
        "--skip-prompts", type=int, default=0,
        help="drop the first N prompts of the file (after decontamination, before the seeded shuffle; e.g. to keep a "
        "held-out set). To extend a directory with more prompts of the same list, rerun it with a larger --max-prompts: "
        "a new --out with --skip-prompts would reuse some of the prompts it already holds",
    )
    p.add_argument(
        "--start-prompt", type=int, default=0, metavar="N",
        help="start a new --out at position N of the seeded shuffle, e.g. where another directory over the same list "
        "stopped (its manifest's next_prompt), so the two hold no prompt twice; --max-prompts still counts from 0",
    )
    p.add_argument(
        "--heldout", type=int, default=None, metavar="N",
        help="use only the last N prompts of the seeded shuffle, which runs with --max-prompts below (prompts - N) "
        "never reach (the held-out prompts calibrate and eval-tau use): a held-out set for train --eval-data",
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-prompt-tokens", type=int, default=384, help="prompts longer than this are skipped")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--prompts-per-shard", type=int, default=64)
    p.add_argument("--engine", default="loop", choices=["loop", "continuous"],  # data.GENERATION_ENGINES (not imported:
                   # building the parser stays free of torch)
                   help="loop (default): our batched loop, finished rows leave the batch; continuous: transformers' "
                   "continuous batching (model.generate_batch: paged cache, waiting prompts take finished rows' places, "
                   "CUDA graphs on a GPU; greedy only; --batch-size is how many requests its paged cache holds at once)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (matches greedy evaluation)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--no-decontaminate", action="store_true", help="keep prompts that look like the eval sets")
    p.add_argument("--cache-hidden", action="store_true",
                   help="also store the target's taps + final hidden states (bf16, ~6.9 KB per SmolLM2 token) for "
                   "`train`, which then skips the target's forward: kept as the loop engine generates (no extra "
                   "forward), computed afterwards for --engine continuous and --as-written")
    p.add_argument("--drafter", default=None,
                   help="with --cache-hidden: the drafter that will train on the data (its taps; default: the taps a "
                   "new drafter gets for this target)")
    p.add_argument("--as-written", action="store_true",
                   help="take the conversations as written (ShareGPT-style file; no generation): the training labels "
                   "come from the target's forward over the text (EAGLE-1's recipe). Millions of tokens in minutes. The "
                   "held-out ShareGPT conversations are left out.")
    p.add_argument("--max-tokens", type=int, default=512, help="--as-written: cut each conversation at this many tokens")
    p.set_defaults(func=_make_data)


# ------------------------------------------------------------------------------------------- cache-hidden
def _cache_hidden(args) -> int:
    from .data import DataError, _weighted_dir, cache_hidden_states

    model, _ = _load(args)
    taps = _tap_ids(args, model)  # HF hidden_states indices
    for spec in args.data.split(","):
        directory, _ = _weighted_dir(spec)  # `dir:N` as in train's --data; the weight does not matter here
        print(f"[cache] {directory}: the target's taps {taps} (hidden_states indices) and final states")
        try:
            cache_hidden_states(directory, model, taps)
        except DataError as err:
            raise SystemExit(str(err)) from None
    return 0


def _add_cache_hidden(sub) -> None:
    p = sub.add_parser(
        "cache-hidden",
        help="compute the target's taps + final hidden states of data directories once (bf16 on disk) for training",
        description="Run the target over every sequence of the data directories once and store its tapped hidden "
        "states and final hidden states (bf16, ~(m + 1) x hidden_size x 2 bytes per token: 6.9 KB for SmolLM2 with 5 "
        "taps) next to the shards. `train` then reads them instead of running the target's forward for those "
        "sequences: about half of a CPU training step. Shards already cached are skipped (rerun to resume); a cache "
        "made for other taps, target or dtype is refused by train and here.",
    )
    p.add_argument("--data", required=True, help="data directories, comma-separated (as train's --data; weights ignored)")
    p.add_argument("--drafter", default=None, help="the drafter that will train on them (its taps; default: the taps "
                   "a new drafter gets for this target, as train without --target-layer-ids)")
    _add_target(p)
    p.set_defaults(func=_cache_hidden)


# ------------------------------------------------------------------------------------------- train
def _train(args) -> int:
    import torch

    from ..modeling import DSparkDrafter
    from ..targets import fast_dtype
    from .data import TokenDataset
    from .losses import LossWeights
    from .trainer import (
        TrainConfig,
        Trainer,
        build_drafter,
        choose_draft_vocab,
        grow_drafter,
        plot_learning_curve,
        remap_draft_vocab,
    )

    growable = ("layers", "markov_rank", "markov_head_type")  # with --init: grow that drafter (trainer.grow_drafter)
    # with --init, --dflash only says the drafter has no Markov head (checked once it is loaded), so a DFlash twin
    # continues with the same command as its DSpark twin plus --dflash
    if args.init and (shaped := _options_given(args, [k for k in _SHAPE_DEFAULTS if k not in growable + ("dflash",)])):
        describe, them = _agreeing(shaped, "describe", "them")
        raise SystemExit(f"{', '.join(shaped)} {describe} a new drafter's shape; --init {args.init} already has one. "
                         f"Leave {them} out to continue that drafter (its config says its shape), or drop --init for a "
                         "new one. (--layers, --markov-rank and --markov-head-type gated beside --init grow it.)")
    if args.dflash and (markov := _options_given(args, ["markov_rank", "markov_head_type"])):
        describe, them = _agreeing(markov, "describe", "them")
        raise SystemExit(f"{', '.join(markov)} {describe} a Markov head, and --dflash trains a drafter without one. "
                         f"Drop {them} for the DFlash twin, or --dflash for DSpark.")
    grow = {k: getattr(args, k) for k in growable} if args.init else {}
    for k, v in _SHAPE_DEFAULTS.items():
        setattr(args, k, v if getattr(args, k) is None else getattr(args, k))
    model, tok = _load(args)
    accelerator = None
    if args.accelerate:
        from accelerate import Accelerator

        accelerator = Accelerator()
        model.to(accelerator.device)
    data = TokenDataset(args.data, model, tok)
    eval_data = _eval_dataset(args, data, model, tok)
    draft_ids = None
    if args.draft_vocab_size is not None and args.draft_vocab_size <= 0:
        raise SystemExit(f"--draft-vocab-size {args.draft_vocab_size} must be a positive number of tokens (e.g. 8192); "
                         "leave it out for the target's full vocabulary.")
    # fp32 master weights whatever the target's dtype (bf16 weights lose every AdamW update below their resolution)
    drafter = DSparkDrafter.from_pretrained(args.init, target=model, dtype=torch.float32) if args.init else None
    if drafter is not None and args.dflash and drafter.config.markov_rank:
        raise SystemExit(f"--dflash trains a drafter without a Markov head, and --init {args.init} has one (rank "
                         f"{drafter.config.markov_rank}). Drop --dflash to continue it as DSpark, or --init for a fresh "
                         "DFlash twin.")
    if args.draft_vocab_size:
        vocab = model.config.get_text_config().vocab_size
        eos = model.generation_config.eos_token_id
        always = [e for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
        own = drafter.draft_target_ids() if drafter is not None else None
        growing = own is not None and args.draft_vocab_size >= own.numel()  # the --init drafter keeps all its tokens
        draft_ids, coverage = choose_draft_vocab(data, args.draft_vocab_size, vocab, own.cpu().tolist() if growing else always)
        chosen = f"its {own.numel()} tokens and the data's most frequent others" if growing else "the most frequent response tokens of the data"
        print(f"[train] draft vocabulary: {draft_ids.numel()} tokens, {chosen}, cover {100 * coverage:.2f}% of the "
              f"data's response tokens (of {vocab} target tokens)")
    if drafter is not None:
        if drafter.calibration is not None:  # training moves the confidence head: the old temperatures no longer fit
            drafter.calibration = None
            print("[train] dropping the --init drafter's calibration.json; run `hf-dspark calibrate` on the result")
        if draft_ids is not None:  # keep what the drafter learned, propose the data's vocabulary from now on
            old = drafter.draft_target_ids()
            shared = draft_ids.numel() if old is None else int(torch.isin(draft_ids, old.cpu()).sum())
            drafter = remap_draft_vocab(drafter, model, draft_ids)
            print(f"[train] --init drafter remapped to the new draft vocabulary: {shared} of its {draft_ids.numel()} "
                  "tokens keep their trained rows, the rest start from the target's lm_head rows mapped onto the "
                  "trained ones (trainer.remap_draft_vocab)")
        if any(v is not None for v in grow.values()):
            shape = lambda c: f"{c.num_hidden_layers} layers, {c.markov_head_type} Markov head of rank {c.markov_rank}"  # noqa: E731
            before = shape(drafter.config)
            try:
                drafter = grow_drafter(drafter, model, num_hidden_layers=grow["layers"], markov_rank=grow["markov_rank"],
                                       markov_head_type=grow["markov_head_type"])
            except ValueError as e:
                raise SystemExit(f"--init {args.init}: {e}") from None
            print(f"[train] --init drafter grown from {before} to {shape(drafter.config)}: it drafts as before until "
                  "the new parts train")
    else:
        drafter = build_drafter(
            model,
            tok,
            draft_token_ids=draft_ids,
            init_from_target=not args.random_init,
            num_hidden_layers=args.layers,
            block_size=args.block_size,
            markov_rank=0 if args.dflash else args.markov_rank,
            markov_head_type=args.markov_head_type,
            target_layer_ids=args.target_layer_ids,
            mask_token_id=args.mask_token_id,
            target_model_id=args.target,
        )
    dflash = drafter.config.markov_rank == 0  # --dflash, or an --init drafter without a Markov head
    if args.paper_losses:
        weights = LossWeights.dflash() if dflash else LossWeights.paper()
    else:
        weights = LossWeights(
            args.ce_weight, args.l1_weight, 0.0 if dflash else args.bce_weight, args.decay, args.kl_weight, args.ce_label,
            args.accept_weight,
        )
    cfg = TrainConfig(
        **_loop_config(args),
        batch_size=args.batch_size,
        warmup_ratio=args.warmup_ratio,
        grad_clip=args.grad_clip,
        bf16_autocast=fast_dtype(model.device) == torch.bfloat16 if args.bf16_autocast == "auto" else args.bf16_autocast == "on",
        losses=weights,
    )
    n = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    print(f"[train] {len(data)} sequences ({data.num_tokens} tokens), drafter {n / 1e6:.1f}M trainable parameters "
          f"(fp32 master weights, bf16 autocast {'on' if cfg.bf16_autocast else 'off'}), "
          f"{'DFlash (no Markov head, no confidence head)' if dflash else 'DSpark'}, losses {weights}")
    drafter.to(model.device)
    trainer = Trainer(drafter, model, data, cfg, pad_id=tok.pad_token_id or 0, accelerator=accelerator,
                      eval_dataset=eval_data)
    last = trainer.run(progress=not args.no_progress and trainer.rank == 0)
    if trainer.rank:
        return 0
    plot_learning_curve(trainer.history, f"{args.out}/learning_curve.png")
    print(f"[train] done: step {last['step']}, tokens {last['tokens_seen']}, held-out tau_tf {last.get('eval_tau_tf')}")
    return 0


def _add_loop_args(p, *, max_steps: int, lr: float, eval_every: int, eval_sequences: int) -> None:
    """The training-loop options `train` and `finetune` share (defaults differ)."""
    p.add_argument("--max-steps", type=int, default=max_steps, help="optimizer steps (fixes the cosine schedule)")
    p.add_argument("--time-budget-min", type=float, default=None,
                   help="checkpoint and stop after this many wall-clock minutes (the schedule is not shortened)")
    p.add_argument("--schedule-minutes", type=float, default=None,
                   help="the warmup + cosine span this many minutes of training time, whatever the step rate; the "
                   "run ends when they are spent (--max-steps stays a cap). Resumes continue the same schedule")
    p.add_argument("--num-anchors", type=int, default=128, help="blocks (anchors) per sequence")
    p.add_argument("--anchors", choices=["uniform", "decoded"], default="uniform",
                   help="where blocks start: uniform over the response, or decoded: where greedy decoding with the "
                        "current drafter starts them (after each rejection; needs greedy self-distilled data; a "
                        "no-grad pass over every position per step)")
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--ema-decay", type=float, default=0.0, metavar="D",
                   help="keep a moving average of the weights (avg <- D x avg + (1 - D) x weights after every step, "
                   "starting from the initial weights) and evaluate and export it instead of the last weights; e.g. "
                   "0.999 averages over ~1000 steps (default 0: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-minutes", type=float, default=5.0)
    p.add_argument("--eval-every", type=int, default=eval_every, help="steps between held-out tau evaluations (0 = at the end)")
    p.add_argument("--eval-sequences", type=int, default=eval_sequences, help="last sequences of the data held out for evaluation")
    p.add_argument("--eval-data", default=None,
                   help="evaluate on the last --eval-sequences sequences of this data directory instead, holding none of "
                   "--data out: a fixed held-out set while the training data grows (e.g. make-data --heldout 32)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar (log lines only)")


def _eval_dataset(args, data, model, tok):
    """--eval-data as a TokenDataset (None without it); refused when it is also training data."""
    from .data import TokenDataset

    if not args.eval_data:
        return None
    held = TokenDataset(args.eval_data, model, tok)
    trained = {d.resolve() for d, _, _ in data.where}
    if overlap := sorted(str(d) for d in {d.resolve() for d, _, _ in held.where} & trained):
        raise SystemExit(f"--eval-data {', '.join(overlap)} is also in --data: its sequences would be trained on. "
                         "Evaluate on a directory that no --data entry names.")
    return held


def _loop_config(args) -> dict:
    """TrainConfig fields from the shared loop options."""
    import time

    if args.schedule_minutes is not None and args.schedule_minutes <= 0:
        raise SystemExit(f"--schedule-minutes {args.schedule_minutes} must be a positive number of minutes.")
    if not 0.0 <= args.ema_decay < 1.0:
        raise SystemExit(f"--ema-decay {args.ema_decay} must be in [0, 1): e.g. 0.999 to average over ~1000 steps, "
                         "or 0 to turn the average off.")
    return dict(
        data_dir=args.data,
        out_dir=args.out,
        max_steps=args.max_steps,
        num_anchors=args.num_anchors,
        anchors=args.anchors,
        lr=args.lr,
        seed=args.seed,
        checkpoint_minutes=args.checkpoint_minutes,
        eval_every=args.eval_every,
        eval_sequences=args.eval_sequences,
        stop_at=time.time() + 60 * args.time_budget_min if args.time_budget_min else None,
        schedule_minutes=args.schedule_minutes,
        ema_decay=args.ema_decay,
    )


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _options_given(args, names: list[str]) -> list[str]:
    """The command-line spellings (--markov-rank) of the options among `names` (args attributes) that were given."""
    return [f"--{k.replace('_', '-')}" for k in names if getattr(args, k) is not None]


def _agreeing(options: list[str], verb: str, pronoun: str) -> tuple[str, str]:
    """The verb and pronoun ("describe", "them") as they agree with one option ("describes", "it") or several."""
    return (verb, pronoun) if len(options) > 1 else (verb + "s", "it")


# A new drafter's shape (None on the command line = not given; refused with --init, which brings its own).
_SHAPE_DEFAULTS = {"dflash": False, "layers": 1, "block_size": 7, "markov_rank": 64, "markov_head_type": "vanilla",
                   "target_layer_ids": None, "mask_token_id": None, "random_init": False}


def _add_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a DSpark (or, with --dflash, DFlash) drafter online on a make-data directory",
        description="Online training: the frozen target computes its taps on the fly (or reads the optional bf16 "
        "cache). Rerunning the same command resumes exactly from <out>/checkpoint. Multi-GPU: "
        "`accelerate launch -m hf_dspark.training.cli train ...` (see hf_dspark/training/trainer.py).",
    )
    p.add_argument("--data", required=True, help="data directory from make-data (same target and tokenizer); several: a,b")
    p.add_argument("--out", required=True, help="run directory: checkpoint/, drafter/, history.json, learning_curve.png")
    _add_target(p)
    p.add_argument("--init", default=None, help="start from this drafter folder instead of a fresh drafter")
    p.add_argument("--dflash", action="store_const", const=True, default=None,
                   help="the DFlash twin: markov_rank 0, no confidence head, the same distillation loss; with --init, "
                        "continues a drafter that has no Markov head")
    p.add_argument("--layers", type=int, default=None,
                   help="drafter decoder layers (default 1); with --init, more than its own adds layers that start as no-ops")
    p.add_argument("--block-size", type=int, default=None, help="drafts per block (default 7)")
    p.add_argument("--markov-rank", type=int, default=None,
                   help="Markov head rank (default 64); with --init, more than its own adds components that start at zero")
    p.add_argument("--markov-head-type", default=None, choices=["vanilla", "gated", "rnn"],
                   help="default vanilla; with --init, gated turns its vanilla head into a gated one that starts as it was")
    p.add_argument("--target-layer-ids", type=_int_list, default=None, help="comma-separated taps (default: spread 1..L-3)")
    p.add_argument("--mask-token-id", type=int, default=None, help="default: an unused vocab row found via the tokenizer")
    _add_loop_args(p, max_steps=1000, lr=6e-4, eval_every=100, eval_sequences=8)
    p.add_argument("--batch-size", type=int, default=1, help="sequences per step")
    p.add_argument("--warmup-ratio", type=float, default=0.04)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help="draft over the N most frequent response tokens of the data (speculators' reduced vocabulary; "
                   "the coverage is printed); with --init, at least its own size keeps its tokens and adds the data's "
                   "most frequent others; default: the target's full vocabulary (or --init's)")
    p.add_argument("--random-init", action="store_const", const=True, default=None,
                   help="random drafter layers (default: start from the target's last layers, fc = identity on the last tap)")
    p.add_argument("--kl-weight", type=float, default=1.0, help="KL(target || draft) distillation loss")
    p.add_argument("--ce-weight", type=float, default=0.0, help="cross-entropy on the greedy labels (--ce-label)")
    p.add_argument("--ce-label", choices=["data", "target"], default="data",
                   help="the cross-entropy's label: the data's next token (greedy self-distilled data: the target's "
                   "greedy token) or the target's argmax there (sampled answers or text as written)")
    p.add_argument("--accept-weight", type=float, default=0.0,
                   help="1 - the draft's probability of its block's greedy labels up to each slot (--ce-label picks "
                   "them): the expected accepted drafts that greedy decoding rewards")
    p.add_argument("--l1-weight", type=float, default=0.0, help="L1 between the two distributions (the paper's 0.9)")
    p.add_argument("--bce-weight", type=float, default=1.0, help="confidence head BCE against 1 - TV")
    p.add_argument("--paper-losses", action="store_true", help="the paper's mix 0.1 CE + 0.9 L1 + 1.0 BCE (DFlash: CE only)")
    p.add_argument("--decay", type=float, default=4.0, help="position weights exp(-k/decay)")
    p.add_argument("--bf16-autocast", choices=["auto", "on", "off"], default="auto",
                   help="bf16 autocast over fp32 master weights; auto = where the hardware multiplies bf16 natively "
                   "(CUDA, CPUs with avx512_bf16 or AMX)")
    p.add_argument("--accelerate", action="store_true",
                   help="multi-GPU/multi-node: run under `accelerate launch -m hf_dspark.training.cli train --accelerate ...`")
    p.set_defaults(func=_train)


# ------------------------------------------------------------------------------------------- calibrate / eval-tau
def _load_drafter(args, model):
    from ..modeling import DSparkDrafter

    drafter = DSparkDrafter.from_pretrained(args.drafter, target=model, dtype=model.dtype)
    if getattr(args, "adapter", None):
        from .peft import load_adapter

        return load_adapter(drafter, args.adapter)
    return drafter


def _calibrate(args) -> int:
    import json
    from pathlib import Path

    from ..calibration import fit_sts, plot_reliability, save_calibration
    from .evaluate import heldout_prompts, measure

    model, tok = _load(args)
    drafter = _load_drafter(args, model)
    if drafter.confidence_head is None:
        raise SystemExit("This drafter has no confidence head (a DFlash drafter); there is nothing to calibrate.")
    drafter.calibration = None  # collect raw logits
    prompts = heldout_prompts(args.num_prompts, seed=args.seed) if args.prompts == "heldout" else None
    if prompts is None:
        from .data import read_prompts

        prompts = read_prompts(args.prompts)[: args.num_prompts]
    # no copy drafting: the policies that read calibrated confidences draft without copies (generate()'s copy_ngram)
    res = measure(drafter, model, tok, prompts, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, copy_ngram=0)
    cal = fit_sts(res["conf_logits"], res["num_accepted"], res["num_verified"])
    cal["source"] = {"prompts": args.prompts, "num_prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                     "tau": res["tau"], "dtype": args.dtype}
    out = Path(args.out or Path(args.drafter) / "calibration.json")
    save_calibration(cal, out)
    plot_reliability(res["conf_logits"], res["num_accepted"], cal, out.with_name("reliability.png"), num_verified=res["num_verified"])
    print(json.dumps({k: v for k, v in cal.items() if k != "source"}, indent=1))
    print(f"[calibrate] wrote {out} and {out.with_name('reliability.png')}")
    return 0


def _eval_tau(args) -> int:
    import json

    from ..io_utils import write_json_atomic
    from .evaluate import eval_set, heldout_prompts, measure

    model, tok = _load(args)
    drafter = _load_drafter(args, model)
    results = {}
    for name in args.sets.split(","):
        prompts = heldout_prompts(args.num_prompts) if name == "heldout" else eval_set(name, args.num_prompts)
        res = measure(drafter, model, tok, prompts, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                      markov=not args.no_markov, draft_tree_size=args.draft_tree_size, temperature=args.temperature,
                      seed=args.seed, prompt_lookup_num_tokens=args.prompt_lookup_num_tokens, copy_ngram=args.copy_ngram)
        keys = ("tau", "per_position_acceptance", "steps", "num_prompts", "steps_per_call", "tokens_per_call")
        results[name] = {k: res[k] for k in keys}
        print(f"[eval-tau] {name}: tau {res['tau']:.3f} over {res['steps']} steps; per position "
              + " ".join("-" if x is None else f"{x:.2f}" for x in res["per_position_acceptance"]))
    results["settings"] = {"drafter": args.drafter, "adapter": args.adapter, "dtype": args.dtype, "greedy": args.temperature == 0,
                           "temperature": args.temperature, "seed": args.seed, "batch_size": args.batch_size,
                           "max_new_tokens": args.max_new_tokens, "num_prompts": args.num_prompts,
                           "markov": not args.no_markov, "draft_tree_size": args.draft_tree_size,
                           "prompt_lookup_num_tokens": args.prompt_lookup_num_tokens, "copy_ngram": args.copy_ngram}
    if args.out:
        write_json_atomic(args.out, results)
    print(json.dumps(results, indent=1))
    return 0


def _add_eval_common(p) -> None:
    p.add_argument("--drafter", required=True, help="drafter folder (save_pretrained format) or Hub repo")
    p.add_argument("--adapter", default=None, help="optional LoRA adapter folder from finetune")
    _add_target(p)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)


def _add_calibrate(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit Sequential Temperature Scaling of the confidence head on held-out prompts",
        description="Run drafter + target greedily on held-out prompts (full-block verification), collect "
        "per-position confidence logits and prefix-acceptance labels, fit STS and write calibration.json "
        "(temperatures; ECE/AUROC/Brier before and after) and reliability.png next to it.",
    )
    _add_eval_common(p)
    p.add_argument("--prompts", default="heldout", help="'heldout' (ShareGPT prompts make-data never reaches) or a prompt file")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--out", default=None, help="default: <drafter>/calibration.json")
    p.set_defaults(func=_calibrate)


def _add_eval_tau(sub) -> None:
    p = sub.add_parser(
        "eval-tau",
        help="measure tau (mean accepted length incl. bonus, full block) on eval sets",
        description="DSpark decoding with full-block verification on the first N prompts of each set: greedy, or "
        "sampled with --temperature.",
    )
    _add_eval_common(p)
    p.add_argument("--sets", default="gsm8k,humaneval,mtbench", help="comma list of gsm8k, humaneval, mtbench, heldout")
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--no-markov", action="store_true", help="draft without the Markov head")
    p.add_argument("--draft-tree-size", type=int, default=None, metavar="N",
                   help="verify a tree of N drafts instead of the drafter's best chain: its most likely drafts and a "
                        "prompt-lookup branch among them, as generate() does (tau then counts the tree's accepted path)")
    p.add_argument("--prompt-lookup-num-tokens", type=int, default=None, metavar="K",
                   help="transformers' prompt_lookup_num_tokens: cap a tree's prompt-lookup branch at K tokens (0: no "
                        "branch, the drafter's nodes alone); without --draft-tree-size, graft a branch of K onto the chain")
    p.add_argument("--copy-ngram", type=int, default=None, metavar="N",
                   help="copy drafting: where the last 8 down to N tokens occurred earlier in the prompt or output, "
                        "draft the token that followed them (a chain's slot instead of the drafter's pick, one more "
                        "child of each expanded node in a tree; 0: the drafter's picks alone; default: generate()'s, 3)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy; > 0: sample at this temperature (seeded by --seed; the target's "
                        "generation config sets the rest, e.g. top_k)")
    p.add_argument("--out", default=None, help="write the results as JSON")
    p.set_defaults(func=_eval_tau)


# ------------------------------------------------------------------------------------------- finetune (LoRA)
def _finetune(args) -> int:
    from .data import TokenDataset
    from .peft import add_lora, save_adapter
    from .trainer import TrainConfig, Trainer

    model, tok = _load(args)
    data = TokenDataset(args.data, model, tok)
    eval_data = _eval_dataset(args, data, model, tok)
    from ..modeling import DSparkDrafter

    base = DSparkDrafter.from_pretrained(args.drafter, target=model, dtype=model.dtype)
    peft_model = add_lora(base, r=args.lora_r, alpha=args.lora_alpha)
    peft_model.print_trainable_parameters()
    # train's default losses (KL + the confidence BCE, which the losses skip for a drafter without a confidence head)
    cfg = TrainConfig(**_loop_config(args))
    trainer = Trainer(base, model, data, cfg, pad_id=tok.pad_token_id or 0, eval_dataset=eval_data,
                      export=lambda out: save_adapter(peft_model, out / "adapter"))
    last = trainer.run(progress=not args.no_progress)
    print(f"[finetune] adapter in {args.out}/adapter; held-out tau_tf {last.get('eval_tau_tf')}")
    return 0


def _add_finetune(sub) -> None:
    p = sub.add_parser(
        "finetune",
        help="LoRA fine-tune a trained drafter on a domain data directory (peft)",
        description="LoRA (peft) on q/k/v/o, gate/up/down and fc of a trained drafter, trained with the same "
        "online losses on a make-data directory of the domain. Writes <out>/adapter (load it with "
        "hf_dspark.training.peft.load_adapter, or pass --adapter to eval-tau; merge with merge_and_unload).",
    )
    p.add_argument("--drafter", required=True)
    p.add_argument("--data", required=True, help="domain data directory from make-data; several: a,b")
    p.add_argument("--out", required=True)
    _add_target(p)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    _add_loop_args(p, max_steps=100, lr=3e-4, eval_every=0, eval_sequences=4)
    p.set_defaults(func=_finetune)


def add_subcommands(subparsers) -> None:
    """Register make-data, cache-hidden, train, calibrate, finetune and eval-tau on an argparse `subparsers` object."""
    _add_make_data(subparsers)
    for extra in _EXTRA:
        extra(subparsers)


_EXTRA: list = [_add_cache_hidden, _add_train, _add_calibrate, _add_finetune, _add_eval_tau]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-dspark", description="DSpark drafter training tools")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
