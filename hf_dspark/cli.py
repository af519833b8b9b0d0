"""`hf-dspark`: the command line.

    hf-dspark bench ...                 side-by-side benchmark (also `python -m hf_dspark.bench`)
    hf-dspark profile ...               measure (and cache) the device's step-time table for a target
    hf-dspark export ...                write the DeepSpec-native layout that vLLM / SGLang load
    hf-dspark make-data | train | calibrate | eval-tau | finetune   build your own drafter
"""

from __future__ import annotations

import argparse
import sys


def _profile(args: argparse.Namespace) -> int:
    from .step_table import load_or_profile
    from .targets import load_target

    model, _ = load_target(args.target, dtype=args.dtype)
    table = load_or_profile(
        model,
        drafter_repo=args.drafter,
        target_id=args.target,
        profile_kwargs={"num_requests": tuple(int(x) for x in args.num_requests.split(",")), "context_len": args.context_len, "repeats": args.repeats},
    )
    print(table.to_json())
    return 0


def _export(args: argparse.Namespace) -> int:
    from .checkpoints import export_deepspec, export_speculators
    from .modeling import DSparkDrafter
    from .targets import load_target

    model, _ = load_target(args.target, dtype=args.dtype)
    drafter = DSparkDrafter.from_pretrained(args.drafter, target=model)
    if args.format == "speculators":
        export_speculators(drafter, args.out)
        print(f"wrote the speculators checkpoint to {args.out}")
    else:
        export_deepspec(drafter, args.out)
        print(f"wrote the DeepSpec-native checkpoint to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import bench
    from .training.cli import add_subcommands

    parser = argparse.ArgumentParser(prog="hf-dspark", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("bench", help="side-by-side benchmark against plain generate and transformers' speculative paths")
    bench.add_arguments(p)
    p.set_defaults(func=bench.run_cli)

    p = sub.add_parser("profile", help="measure the target's step-time table on this device (cached)")
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--drafter", default=None, help="drafter folder/repo whose step_tables/ are checked first")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--num-requests", default="1,4,16,32,64", help="request counts R to probe")
    p.add_argument("--context-len", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.set_defaults(func=_profile)

    p = sub.add_parser("export", help="write the DeepSpec-native or speculators layout for vLLM / SGLang")
    p.add_argument("--drafter", required=True)
    p.add_argument("--format", default="deepspec", choices=["deepspec", "speculators"],
                   help="speculators also expresses reduced draft vocabularies and sliding-window layers")
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--out", required=True)
    p.set_defaults(func=_export)

    add_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, ModuleNotFoundError, NotImplementedError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
