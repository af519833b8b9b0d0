"""Merge `hf-dspark bench --json` files into one JSON, a markdown table and the plots.

    python scripts/merge_bench.py outputs/sweep/real_bs1.json outputs/sweep/real_bs4-16.json --out outputs/sweep/real

writes outputs/sweep/real.json, outputs/sweep/real.md and outputs/sweep/real/*.png. Where both ran, the .md also
gives the scheduler against the full block: the median of the paired per-call ratios dspark_adaptive / dspark with
its [min-max], and the one-sided Wilcoxon p that the scheduler is slower than the full block.
"""

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from hf_dspark.bench import Record, compare_with_plain, markdown_table, paired_speedup, plot, slower_p_value
from hf_dspark.io_utils import write_json_atomic


def against_full_block(records: list[Record]) -> str:
    """Lines comparing dspark_adaptive with dspark (the full block) on the same calls, per set and batch size."""
    by = {(r.prompt_set, r.batch_size, r.contender): r for r in records if r.calls_s}
    lines = []
    for (prompt_set, batch, contender), rec in by.items():
        full = by.get((prompt_set, batch, "dspark"))
        if contender == "dspark_adaptive" and full is not None:
            med, lo, hi = paired_speedup(full.calls_s, rec.calls_s)
            p = slower_p_value(full.calls_s, rec.calls_s)
            lines.append(f"- {prompt_set} batch {batch}: adaptive / full block {med:.2f} [{lo:.2f}-{hi:.2f}], p slower {p:.3f}")
    return "\n\n" + "\n".join(lines) if lines else ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="JSON files written by hf-dspark bench --json")
    p.add_argument("--out", required=True, help="output prefix: <out>.json, <out>.md and the folder <out>/ for plots")
    args = p.parse_args()
    records = [Record(**r) for f in args.inputs for r in json.loads(Path(f).read_text())]
    compare_with_plain(records)  # fills in statistics that older files lack (p_slower)
    write_json_atomic(f"{args.out}.json", [asdict(r) for r in records])
    table = markdown_table(records) + against_full_block(records)
    Path(f"{args.out}.md").write_text(table + "\n")
    print(table)
    for path in plot(records, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
