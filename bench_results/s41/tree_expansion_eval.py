"""`hf-dspark eval-tau` of the shipped drafter (40 prompts per set x 128 tokens, greedy, bf16) with another tree
expansion width: K nodes expanded per level, K children each (hf_dspark.draft_tree.TREE_TOP_K is 4).

    OMP_NUM_THREADS=1 python bench_results/s41/tree_expansion_eval.py K N OUT.json    # N: the tree's size
"""
import sys

from hf_dspark import drafting
from hf_dspark.bench import default_drafter
from hf_dspark.cli import main

k, size, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
drafting.draft_tree.__defaults__ = (k,)  # draft_tree's only default: top_k
sys.exit(main(["eval-tau", "--drafter", str(default_drafter()), "--sets", "gsm8k,humaneval,mtbench", "--num-prompts",
               "40", "--max-new-tokens", "128", "--draft-tree-size", size, "--out", out]))
