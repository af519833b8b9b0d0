"""Write training prompts in the evaluation sets' domains without touching the evaluation sets.

- math: grade-school word problems built from templates here (names, items and numbers drawn at random), in the
  shape of GSM8K questions but none of its text;
- code: function stubs (signature + docstring) of the Python standard library's own functions, in the shape of
  HumanEval prompts (read with `ast`, never imported);
- chat prompts are not made here: ShareGPT's first turns already cover MT-Bench's domain.

The output is JSONL with a `text` field, ready for `hf-dspark make-data --prompts FILE` (which decontaminates it
against GSM8K, HumanEval and MT-Bench as for any prompt file).

    python scripts/make_domain_prompts.py --out runs/prompts-domain.jsonl --math 1500 --code 1500
    python scripts/make_domain_prompts.py --out runs/prompts-domain2.jsonl --math 1500 --code 0 --methods 1500 \
        --seed 1 --exclude runs/prompts-domain.jsonl
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sysconfig
from pathlib import Path

NAMES = ["Maria", "James", "Aisha", "Tom", "Lena", "Carlos", "Mei", "Omar", "Sofia", "Ravi", "Nina", "Jack", "Emma",
         "Liam", "Zoe", "Ben", "Priya", "Hugo", "Ana", "Kofi", "Yuki", "Sam", "Eva", "Noah"]
ITEMS = [("apple", "apples"), ("pencil", "pencils"), ("sticker", "stickers"), ("book", "books"), ("cookie", "cookies"),
         ("marble", "marbles"), ("card", "cards"), ("flower", "flowers"), ("egg", "eggs"), ("shell", "shells")]
PLACES = ["the market", "the bakery", "the bookstore", "the fair", "the garden center", "the toy shop"]


def _math_problem(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    one, many = rng.choice(ITEMS)
    n, m, k = rng.randint(3, 60), rng.randint(2, 12), rng.randint(2, 9)
    price, hours, rate = rng.randint(2, 25), rng.randint(2, 10), rng.randint(8, 40)
    pct = rng.choice([10, 20, 25, 30, 40, 50, 75])
    templates = [
        f"{a} has {n} {many}. {b} gives {a} {m} bags with {k} {many} in each bag. How many {many} does {a} have now?",
        f"{a} buys {m} {many} at {PLACES[n % len(PLACES)]} for ${price} each and pays with a ${price * m + rng.randint(1, 50)} "
        f"bill. How much change does {a} get?",
        f"{a} earns ${rate} an hour and works {hours} hours a day for {k} days. How much money does {a} earn in total?",
        f"A box holds {k} {many}. {a} has {n * k} {many}. How many boxes does {a} need to pack all of them?",
        f"{a} had {n + m} {many}. {a} gave {m} to {b} and then bought {k} more. How many {many} does {a} have?",
        f"{a} reads {m} pages a day. The book has {m * k + n} pages. After {k} days, how many pages are left to read?",
        f"A shirt costs ${price * 4}. It is on sale for {pct}% off. How much does the shirt cost on sale?",
        f"{a} is {k + 10} years old. {b} is {m} years older than twice {a}'s age. How old is {b}?",
        f"{a} runs {k} kilometers every weekday and {m} kilometers on each weekend day. How many kilometers does {a} run "
        f"in {hours} weeks?",
        f"There are {n + 20} students in a class. {pct}% of them walk to school and the rest take the bus. How many "
        f"students take the bus?",
        f"{a} and {b} share {n * 2} {many} so that {a} gets {m} more than {b}. How many {many} does {b} get?",
        f"A baker makes {n} loaves of bread each morning and sells them for ${price} each. If {k} loaves are left unsold "
        f"each day, how much money does the baker make in a {m}-day week?",
        f"{a} saves ${rate} every week. How many weeks will it take {a} to save ${rate * (k + m)} for a new bike?",
        f"A train travels at {rate * 3} miles per hour for {hours} hours and then at {rate * 2} miles per hour for {k} "
        f"hours. How far does it travel in total?",
        f"{a} planted {m} rows of {one} seeds with {n} seeds in each row. If {pct}% of the seeds sprouted, how many "
        f"sprouted?",
        f"{a} has ${price * 10}. {a} spends a quarter of it on lunch and ${price} on a {one}. How much money is left?",
        f"A rectangle is {m} meters wide and {n} meters long. What is its perimeter and its area?",
        f"{a} collects {many}. {a} had {n} and every month collects {k} more. How many will {a} have after {m} months?",
        f"{a} can type {rate * 2} words per minute. How long will it take {a} to type an essay of {rate * 2 * hours * 10}"
        f" words?",
        f"At {PLACES[m % len(PLACES)]}, {many} cost ${price} each or ${price * 5 - k} for a pack of five. How much does "
        f"{a} save by buying {m * 5} {many} in packs instead of one by one?",
    ]
    return rng.choice(templates)


def _stdlib_modules(root: Path) -> list[ast.Module]:
    """The parsed modules of the standard library (tests, IDLE and lib2to3 left out; never imported)."""
    modules = []
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if any(part in {"test", "tests", "idlelib", "site-packages", "lib2to3"} for part in path.parts):
            continue
        try:
            modules.append(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
    return modules


def _stub(node: ast.FunctionDef, indent: str = "") -> str | None:
    """`def name(args):` + its docstring, or None when the function is private or its docstring unsuitable."""
    doc = ast.get_docstring(node)
    if node.name.startswith("_") or not doc or not 40 <= len(doc) <= 700 or ">>>" in doc:
        return None
    node.body, node.decorator_list = [ast.Pass()], []
    header = ast.unparse(node).rsplit("\n", 1)[0]  # "def name(args) -> T:"
    body = "\n".join((indent + "    " + line) if line else "" for line in doc.splitlines())
    return f'{indent}{header}\n{indent}    """{body.lstrip()}\n{indent}    """\n'


def _function_stubs(modules: list[ast.Module]) -> list[str]:
    """A stub for every documented public top-level function."""
    nodes = [n for tree in modules for n in tree.body if isinstance(n, ast.FunctionDef)]
    return [s for s in map(_stub, nodes) if s]


def _method_stubs(modules: list[ast.Module]) -> list[str]:
    """`class Name:` + one documented public method's stub, for every such method of a public top-level class."""
    stubs = []
    for tree in modules:
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")):
            for node in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                stub = _stub(node, indent="    ")
                if stub:
                    stubs.append(f"class {cls.name}:\n{stub}")
    return stubs


def domain_prompts(math: int, code: int, seed: int = 0, methods: int = 0) -> list[str]:
    """`math` word problems, up to `code` standard-library function stubs and up to `methods` method stubs, shuffled
    together (seeded; `methods=0` gives the same list as before method stubs existed)."""
    rng = random.Random(seed)
    problems = list(dict.fromkeys(_math_problem(rng) for _ in range(math * 2)))[:math]
    modules = _stdlib_modules(Path(sysconfig.get_paths()["stdlib"]))
    stubs = _function_stubs(modules)
    rng.shuffle(stubs)
    rows = problems + stubs[:code]
    rng.shuffle(rows)
    if methods:
        extra = _method_stubs(modules)
        random.Random(seed + 1).shuffle(extra)
        rows += extra[:methods]
        random.Random(seed + 2).shuffle(rows)
    return rows


def _texts(path: Path) -> set[str]:
    return {json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSONL file to write (text field)")
    p.add_argument("--math", type=int, default=1500, help="how many math word problems")
    p.add_argument("--code", type=int, default=1500, help="how many stdlib function stubs (at most what exists)")
    p.add_argument("--methods", type=int, default=0, help="how many stdlib class-method stubs (at most what exists)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exclude", type=Path, action="append", default=[], metavar="JSONL",
                   help="leave out prompts already in this file (an earlier run's output); repeatable")
    args = p.parse_args()
    seen = set().union(*map(_texts, args.exclude))
    rows = [r for r in domain_prompts(args.math, args.code, args.seed, args.methods) if r not in seen]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    tmp.replace(out)
    code, methods = sum(r.startswith("def ") for r in rows), sum(r.startswith("class ") for r in rows)
    print(f"wrote {len(rows)} prompts to {out}: {len(rows) - code - methods} math word problems, {code} standard-library "
          f"function stubs, {methods} method stubs" + (f" (left out {len(seen)} prompts of {len(args.exclude)} files)" if seen else ""))


if __name__ == "__main__":
    main()
