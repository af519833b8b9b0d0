"""eval-tau with another tree expansion width: python topk_eval.py K N OUT"""
import sys
from hf_dspark import drafting
k, n, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
assert drafting.draft_tree.__defaults__ == (4,)
drafting.draft_tree.__defaults__ = (k,)
from hf_dspark.cli import main
sys.argv = ["hf-dspark", "eval-tau", "--drafter", "/work/main/model_cards/dspark-smollm2-135m-instruct", "--sets", "gsm8k,humaneval,mtbench",
            "--num-prompts", "40", "--max-new-tokens", "128", "--draft-tree-size", n, "--out", out]
sys.exit(main())
