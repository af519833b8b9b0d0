"""Merge `hf-dspark bench --json` files into one JSON, a markdown table and the plots.

    python scripts/merge_bench.py bench_results/load_bs1.json bench_results/load_bs4-64.json --out bench_results/load

writes bench_results/load.json, bench_results/load.md and bench_results/load/*.png.
"""

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from hf_dspark.bench import Record, compare_with_plain, markdown_table, plot
from hf_dspark.io_utils import write_json_atomic


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="JSON files written by hf-dspark bench --json")
    p.add_argument("--out", required=True, help="output prefix: <out>.json, <out>.md and the folder <out>/ for plots")
    args = p.parse_args()
    records = [Record(**r) for f in args.inputs for r in json.loads(Path(f).read_text())]
    compare_with_plain(records)  # fills in statistics that older files lack (p_slower)
    write_json_atomic(f"{args.out}.json", [asdict(r) for r in records])
    table = markdown_table(records)
    Path(f"{args.out}.md").write_text(table + "\n")
    print(table)
    for path in plot(records, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
