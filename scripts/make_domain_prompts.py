"""Write training prompts in the evaluation sets' domains without touching the evaluation sets.

- math: grade-school word problems built from templates here (names, items and numbers drawn at random), in the
  shape of GSM8K questions but none of its text; `--stories` draws multi-step narrative ones from ~30 more families;
- code: function stubs (signature + docstring) of the Python standard library's own functions, in the shape of
  HumanEval prompts (read with `ast`, never imported); `--tasks` writes small programming tasks from ~32 families
  (requests with a worked example, signature + docstring stubs, code to complete; no doctests);
- chat: `--chat` writes instructions in MT-Bench's first-turn shapes (writing, roleplay, reasoning, math, STEM and
  humanities, extraction) from templates here, none of its text (ShareGPT's ~10k first turns were all self-distilled
  by session 20, and MT-Bench stayed the weakest set).

The output is JSONL with a `text` field, ready for `hf-dspark make-data --prompts FILE` (which decontaminates it
against GSM8K, HumanEval and MT-Bench as for any prompt file).

    python scripts/make_domain_prompts.py --out runs/prompts-domain.jsonl --math 1500 --code 1500
    python scripts/make_domain_prompts.py --out runs/prompts-domain2.jsonl --math 1000 --code 0 --methods 2164 \
        --seed 1 --exclude runs/prompts-domain.jsonl
    python scripts/make_domain_prompts.py --out runs/prompts-domain3.jsonl --math 0 --code 0 --methods 2164 --stories 1300 \
        --seed 2 --exclude runs/prompts-domain.jsonl --exclude runs/prompts-domain2.jsonl
    python scripts/make_domain_prompts.py --out runs/prompts-domain4.jsonl --math 0 --code 0 --stories 1500 --tasks 3000 \
        --seed 3 --exclude runs/prompts-domain3.jsonl
    python scripts/make_domain_prompts.py --out runs/prompts-chat1.jsonl --math 0 --code 0 --chat 3000 --seed 9
"""

from __future__ import annotations

import argparse
import ast
import collections
import functools
import itertools
import json
import random
import sysconfig
from math import gcd
from pathlib import Path
from typing import Callable

NAMES = ["Maria", "James", "Aisha", "Tom", "Lena", "Carlos", "Mei", "Omar", "Sofia", "Ravi", "Nina", "Jack", "Emma",
         "Liam", "Zoe", "Ben", "Priya", "Hugo", "Ana", "Kofi", "Yuki", "Sam", "Eva", "Noah"]
ITEMS = [("apple", "apples"), ("pencil", "pencils"), ("sticker", "stickers"), ("book", "books"), ("cookie", "cookies"),
         ("marble", "marbles"), ("card", "cards"), ("flower", "flowers"), ("egg", "eggs"), ("shell", "shells")]
WORDS = ["river", "apple", "garden", "silver", "cloud", "window", "tiger", "orange", "pencil", "mountain", "echo",
         "lamp", "violet", "island", "rocket", "bread", "ocean", "maple", "candle", "forest", "idea", "amber", "storm",
         "lemon", "castle", "eagle", "umbrella", "spark", "coffee", "music", "basket", "engine", "olive", "desert"]
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


PEOPLE = [("Melanie", "she", "her"), ("Jordan", "he", "his"), ("Priya", "she", "her"), ("Marcus", "he", "his"),
          ("Harald", "he", "his"), ("Keiko", "she", "her"), ("Diego", "he", "his"), ("Fatima", "she", "her"),
          ("Olga", "she", "her"), ("Tyrone", "he", "his"), ("Bianca", "she", "her"), ("Samir", "he", "his"),
          ("Greta", "she", "her"), ("Wesley", "he", "his"), ("Imani", "she", "her"), ("Mateo", "he", "his"),
          ("Rosa", "she", "her"), ("Felix", "he", "his"), ("Chloe", "she", "her"), ("Arjun", "he", "his"),
          ("Hannah", "she", "her"), ("Victor", "he", "his"), ("Leila", "she", "her"), ("Dmitri", "he", "his"),
          ("Nadia", "she", "her"), ("Grant", "he", "his"), ("Ingrid", "she", "her"), ("Kwame", "he", "his"),
          ("Paloma", "she", "her"), ("Elliot", "he", "his"), ("Tessa", "she", "her"), ("Bruno", "he", "his")]
JOBS = ["baker", "florist", "carpenter", "tutor", "dog walker", "painter", "gardener", "photographer", "tailor",
        "lifeguard", "barista", "mechanic", "babysitter", "plumber", "delivery driver"]
GOODS = [("cupcake", "cupcakes", 3), ("notebook", "notebooks", 4), ("candle", "candles", 12), ("jar of jam", "jars of jam", 6),
         ("bracelet", "bracelets", 15), ("pie", "pies", 14), ("scarf", "scarves", 22), ("birdhouse", "birdhouses", 35),
         ("mug", "mugs", 9), ("plant", "plants", 8), ("loaf of bread", "loaves of bread", 5), ("kite", "kites", 18),
         ("comic book", "comic books", 7), ("pair of socks", "pairs of socks", 6), ("puzzle", "puzzles", 16)]
ANIMALS = ["chickens", "cows", "ducks", "goats", "pigs", "sheep", "horses"]
VEHICLES = ["bike", "car", "boat", "bus", "scooter", "train"]
EVENTS = ["bake sale", "school fair", "garage sale", "farmers market", "charity run", "craft fair", "book drive"]
CONTAINERS = [("crate", "crates"), ("basket", "baskets"), ("box", "boxes"), ("bag", "bags"), ("tray", "trays")]
ROOMS = ["living room", "kitchen", "bedroom", "classroom", "hallway", "garage", "patio"]
FRACS = ["half", "a third", "a quarter", "a fifth"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October"]


def _story_problem(rng: random.Random) -> str:
    """One multi-step word problem from ~30 narrative families (people with pronouns, jobs, goods, rates, fractions,
    percentages, ratios, ages, time, geometry), several phrasings each."""
    (a, s, p), (b, _, p2), (c, _, _) = rng.sample(PEOPLE, 3)
    o = "him" if s == "he" else "her"
    one, many, price = rng.choice(GOODS)
    job, event, room = rng.choice(JOBS), rng.choice(EVENTS), rng.choice(ROOMS)
    box, boxes = rng.choice(CONTAINERS)
    fw = rng.choice(FRACS)
    n, m, k = rng.randint(4, 90), rng.randint(2, 15), rng.randint(2, 9)
    pct = rng.choice([5, 10, 12, 15, 20, 25, 30, 40, 60, 75, 80])
    hrs, rate = rng.randint(2, 12), rng.randint(9, 45)
    S = s.capitalize()
    ask = rng.choice(["How many", "How many total", "In all, how many"])
    money = rng.choice(["How much money", "How many dollars", "How much"])
    fam = [
        lambda: f"{a} sold {fw} of {p} {many} at the {event}, {m} more to {p} neighbor, and half of what was left to "
                f"{b}. If {a} has {k} {many} left, how many did {s} start with?",
        lambda: f"{a} is a {job}. {S} charges ${rate} an hour and worked {hrs} hours on Monday, {hrs + m} hours on "
                f"Wednesday and {k} hours on Saturday. {money} did {a} earn this week?",
        lambda: f"{a} makes {many} to sell at the {event}. Each one costs ${price} to make and sells for "
                f"${price + k}. If {s} sells {n} {many}, how much profit does {s} make?",
        lambda: f"{a}'s {VEHICLES[n % 6]} travels at {rate} miles per hour. {S} travels from {k} to {k + hrs % 5 + 1} PM. "
                f"{S} then travels back at {max(2, rate - m)} miles per hour. How long does it take {a} to get back?",
        lambda: f"{a} buys a {one} for {p} friend. {S} pays ${price * 20} for the materials and then another "
                f"${price * 30} for the labor. After that, {s} pays {pct}% of that to have it wrapped and shipped. "
                f"{money} did {s} pay in total?",
        lambda: f"{a} spends {k} hours practicing piano and then reads for half as long. {S} does this {m % 5 + 2} "
                f"times a week. How many hours does {s} spend practicing and reading in {hrs} weeks?",
        lambda: f"{a}'s first album sold {k} times as many copies as {b}'s. If they sold {(k + 1) * n * 1000:,} copies "
                f"combined, how many copies did {b} sell?",
        lambda: f"A farmer has {n} {ANIMALS[m % 7]} and {k * 3} {ANIMALS[(m + 3) % 7]}. How many legs do the "
                f"animals have altogether?",
        lambda: f"{a}'s hens lay {n} eggs a day. {S} eats {k % 4 + 1} every morning and bakes with {m % 6 + 2} "
                f"every day. {S} sells the rest at the {event} for ${k % 3 + 2} per dozen. How much does {s} make "
                f"every week?",
        lambda: f"The ratio of boys to girls in a {rng.choice(['dance', 'chess', 'art', 'swimming', 'coding', 'cooking'])} class is {k}:{m}. If there are {(k + m) * (n % 6 + 2)} "
                f"students in the class, how many girls are there?",
        lambda: f"{a} wants to buy a {VEHICLES[k % 6]} that costs ${rate * 20}. {S} already has ${rate * 4} and "
                f"earns ${rate} a week as a {job}. {S} also gets ${m * 5} from {p} grandmother every {k} weeks. How many "
                f"weeks will it take {a} to have enough money?",
        lambda: f"A {room} is {m + 8} feet long and {k + 6} feet wide. Carpet costs ${k % 5 + 2} per square foot and "
                f"installation costs a flat ${n * 3}. How much will it cost to carpet the {room}?",
        lambda: f"{a} scored {60 + n % 35}, {55 + m * 3}, {70 + k * 2} and {50 + rate} on {p} first four tests. What "
                f"score does {s} need on the fifth test to have an average of {80 + k}?",
        lambda: f"In {k} years, {a} will be {m % 3 + 2} times as old as {b} is now. If {b} is {n % 20 + 5} years old "
                f"now, how old is {a} now?",
        lambda: f"A dinner for {k} people costs ${n * k}. They add a {pct}% tip and split the bill evenly. How much "
                f"does each person pay?",
        lambda: f"A store sells a {one} for ${price * 10}. During a sale the price is cut by {pct}%, and then "
                f"{a} uses a coupon for ${m} off the sale price. How much does {a} pay?",
        lambda: f"A basketball team scored {n % 30 + 10} two-pointers, {m} three-pointers and {k * 2} free throws. "
                f"Their opponents scored half as many two-pointers and twice as many three-pointers but no free throws. "
                f"What is the total number of points scored by both teams?",
        lambda: f"A tank holds {n * 10} gallons of water. It is {fw} full. A pipe fills it at {k} gallons per minute. "
                f"How many minutes will it take to fill the tank?",
        lambda: f"{a} runs {k} laps around a track that is {m * 50} meters long every day except Sunday. How many "
                f"kilometers does {s} run in {hrs % 4 + 1} weeks?",
        lambda: f"{a} packs {n * k} {many} into {boxes}. Each {box} holds {k} {many}. {S} gives {m % k + 1} {boxes} "
                f"to {b} and sells the rest for ${price * k} per {box}. How much money does {s} get?",
        lambda: f"{a} ordered {k + 2} pizzas with {rng.choice([6, 8, 10, 12])} slices each for a party. {b} ate {m % 4 + 2} "
                f"slices, {c} ate twice as many as {b}, and the other {n % 12 + 5} guests ate 2 slices each. How many "
                f"slices were left?",
        lambda: f"{a} got a raise of {pct}% on {p} salary of ${rate * 1000:,} a year. {S} then spends a {fw[2:] if fw.startswith('a ') else 'half'} "
                f"of {p} new salary on rent. How much is left for {a} each year after rent?",
        lambda: f"It takes {a} {k * 5} minutes to walk to school and {b} {min(m * 2, k * 5 - 3)} minutes less to ride {p2} bike. "
                f"If they both leave at 7:{10 + k} AM, how many minutes earlier does {b} arrive?",
        lambda: f"{a} reads {m * 5} pages on weekdays and {n % 40 + 20} pages on each weekend day. How many weeks "
                f"does it take {o} to finish a {(m * 25 + 2 * (n % 40 + 20)) * k} page book?",
        lambda: f"{a} has {n} marbles. {b} has {k} times as many marbles as {a}, and {c} has {m} fewer than {b}. "
                f"{ask} marbles do the three of them have?",
        lambda: f"A subscription costs ${rate % 15 + 5} a month or ${(rate % 15 + 5) * 10} a year. How much does {a} "
                f"save in {k} years by paying yearly instead of monthly?",
        lambda: f"{a} plants {m} rows of tomatoes with {k + 4} plants in each row. Each plant gives {n % 20 + 5} "
                f"tomatoes, but {pct}% of the tomatoes are eaten by birds. How many tomatoes does {a} harvest?",
        lambda: f"The temperature at {k} AM was {n % 30 + 5} degrees. It rose {m} degrees every hour until noon and "
                f"then fell {k % 4 + 1} degrees every hour. What was the temperature at {hrs % 6 + 3} PM?",
        lambda: f"In {MONTHS[k]}, {a} saved ${n}. Each month after that {s} saved ${m * 5} more than the month "
                f"before. How much had {s} saved in total by the end of {MONTHS[k + 2 if k < 8 else 9]}?",
        lambda: f"{a} and {b} are painting a fence. {a} can paint it alone in {k * 2} hours and {b} in {k * 3} "
                f"hours. How long will it take them working together?",
        lambda: f"A recipe for {k * 2} {many} needs {m} cups of flour and {fw} cup of sugar. {a} wants to make "
                f"{k * 2 * (n % 5 + 2)} {many} for the {event}. How many cups of flour and sugar does {s} need?",
        lambda: f"{a} drove {rate * hrs} miles in {hrs} hours. {b} drove {rate * hrs + m * 10} miles in "
                f"{hrs + 1} hours. Who drove faster, and by how many miles per hour?",
    ]
    return rng.choice(fam)()


def _ints(rng: random.Random, n: int = 6, lo: int = -9, hi: int = 30) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(max(2, n - 2), n + 2))]


def _words(rng: random.Random) -> list[str]:
    return rng.sample(WORDS, rng.randint(3, 6))


def _sentence(rng: random.Random) -> str:
    return " ".join(_words(rng))


def _task_families(rng: random.Random) -> list:
    """Small programming tasks: (function names, params, return type, imperative verb, the rest of the description,
    the reference implementation, an example input generator). Constants are drawn here so one family gives many
    tasks; the example's result is computed by the reference, so it is right."""
    k, t = rng.randint(2, 9), rng.randint(3, 20)
    c = rng.choice("aeiobcdlmst")
    lo, hi = sorted(rng.sample(range(-10, 40), 2))
    d = rng.randint(1, 3)
    nums, text, words = "numbers: list[int]", "text: str", "words: list[str]"
    return [
        (["count_multiples", f"count_divisible_by_{k}"], nums, "int", "Count",
         f"how many numbers in the list are divisible by {k}", lambda xs: sum(x % k == 0 for x in xs), lambda: (_ints(rng),)),
        (["sum_above", "total_over_threshold"], nums, "int", "Return",
         f"the sum of the numbers greater than {t}", lambda xs: sum(x for x in xs if x > t), lambda: (_ints(rng),)),
        (["long_words", "filter_long_words"], words, "list[str]", "Return",
         f"the words longer than {k % 5 + 2} characters, in their original order",
         lambda ws: [w for w in ws if len(w) > k % 5 + 2], lambda: (_words(rng),)),
        (["words_starting_with", "select_by_initial"], words, "list[str]", "Return",
         f"the words that start with the letter {c!r}, ignoring case", lambda ws: [w for w in ws if w.lower().startswith(c)],
         lambda: (_words(rng),)),
        (["reverse_each_word", "mirror_words"], text, "str", "Reverse",
         "every word of the text but keep the words in their order (words are separated by single spaces)",
         lambda s: " ".join(w[::-1] for w in s.split(" ")), lambda: (_sentence(rng),)),
        (["count_vowels", "vowel_count"], text, "int", "Count",
         "the vowels (a, e, i, o, u, upper or lower case) in the text", lambda s: sum(ch in "aeiouAEIOU" for ch in s),
         lambda: (_sentence(rng).capitalize(),)),
        (["digit_sum", "sum_of_digits"], "n: int", "int", "Return",
         "the sum of the decimal digits of a non-negative integer", lambda n: sum(map(int, str(n))),
         lambda: (rng.randint(10, 99999),)),
        (["running_max", "prefix_maximum"], nums, "list[int]", "Return",
         "a list whose i-th element is the largest of the first i + 1 numbers",
         lambda xs: [max(xs[: i + 1]) for i in range(len(xs))], lambda: (_ints(rng),)),
        (["differences", "consecutive_gaps"], nums, "list[int]", "Return",
         "the differences between each number and the one before it (one element shorter than the input)",
         lambda xs: [b - a for a, b in zip(xs, xs[1:])], lambda: (_ints(rng),)),
        (["unique_in_order", "dedupe"], nums, "list[int]", "Remove",
         "repeated numbers from the list, keeping the first occurrence of each and the original order",
         lambda xs: list(dict.fromkeys(xs)), lambda: ([rng.randint(0, 6) for _ in range(8)],)),
        (["rotate_left", "rotate"], f"{nums}, steps: int", "list[int]", "Rotate",
         "the list left by `steps` positions (steps may be larger than the list)",
         lambda xs, s: xs[s % len(xs):] + xs[: s % len(xs)], lambda: (_ints(rng), rng.randint(1, 9))),
        (["chunks", "split_into_groups"], f"{nums}, size: int", "list[list[int]]", "Split",
         "the list into consecutive groups of `size` numbers; the last group may be shorter",
         lambda xs, n: [xs[i : i + n] for i in range(0, len(xs), n)], lambda: (_ints(rng, 8), rng.randint(2, 4))),
        (["second_largest", "runner_up"], nums, "int | None", "Return",
         "the second largest distinct number, or None when there is no such number",
         lambda xs: sorted(set(xs))[-2] if len(set(xs)) > 1 else None, lambda: (_ints(rng),)),
        (["word_frequencies", "count_words"], text, "dict[str, int]", "Count",
         "how often each word occurs in the text, case-insensitively, as a dictionary from word to count",
         lambda s: dict(collections.Counter(s.lower().split())),
         lambda: (" ".join(rng.choice(WORDS[:6]) for _ in range(6)),)),
        (["title_case", "capitalize_words"], text, "str", "Capitalize",
         "the first letter of every word and lower-case the rest", lambda s: " ".join(w.capitalize() for w in s.split()),
         lambda: (_sentence(rng).upper(),)),
        (["caesar_shift", f"shift_letters_by_{k}"], text, "str", "Shift",
         f"every lower-case letter {k} places forward in the alphabet, wrapping from z to a; leave other characters as they are",
         lambda s: "".join(chr((ord(ch) - 97 + k) % 26 + 97) if "a" <= ch <= "z" else ch for ch in s),
         lambda: (_sentence(rng) + "!",)),
        (["fizz_labels", "label_multiples"], "n: int", "list[str]", "Return",
         f"the numbers 1 to n as strings, with multiples of {k} replaced by 'Fizz', multiples of {k + 2} by 'Buzz', "
         "and multiples of both by 'FizzBuzz'",
         lambda n: ["FizzBuzz" if i % k == 0 and i % (k + 2) == 0 else "Fizz" if i % k == 0 else "Buzz" if i % (k + 2) == 0
                    else str(i) for i in range(1, n + 1)], lambda: (rng.randint(6, 12),)),
        (["gcd_of_list", "common_divisor"], nums, "int", "Return",
         "the greatest common divisor of a list of positive integers", lambda xs: gcd(*xs),
         lambda: ([k * rng.randint(1, 12) for _ in range(4)],)),
        (["prime_check", "check_prime"], "n: int", "bool", "Check",
         "whether n is a prime number", lambda n: n > 1 and all(n % i for i in range(2, int(n**0.5) + 1)),
         lambda: (rng.randint(2, 200),)),
        (["sequence_term", "nth_term"], "n: int", "int", "Return",
         f"the n-th term (0-based) of the sequence that starts {k}, {t} and continues with the sum of the two terms before",
         lambda n: _two_term_sum(k, t, n), lambda: (rng.randint(3, 12),)),
        (["collatz_steps", "steps_to_one"], "n: int", "int", "Count",
         "the steps it takes to reach 1 from n when an even number is halved and an odd one becomes 3 * n + 1",
         _collatz, lambda: (rng.randint(2, 60),)),
        (["merge_sorted", "merge_lists"], "a: list[int], b: list[int]", "list[int]", "Merge",
         "two sorted lists into one sorted list without calling sort", lambda a, b: sorted(a + b),
         lambda: (sorted(_ints(rng, 4)), sorted(_ints(rng, 4)))),
        (["flatten", "flatten_once"], "nested: list[list[int]]", "list[int]", "Flatten",
         "a list of lists into one list, in order", lambda xs: [x for row in xs for x in row],
         lambda: ([_ints(rng, 2) for _ in range(3)],)),
        (["count_pairs_with_sum", "pairs_summing_to"], f"{nums}, target: int", "int", "Count",
         "the pairs of positions i < j whose numbers add up to target",
         lambda xs, s: sum(xs[i] + xs[j] == s for i in range(len(xs)) for j in range(i + 1, len(xs))),
         lambda: ([rng.randint(0, 9) for _ in range(7)], rng.randint(5, 12))),
        (["longest_run", "max_streak"], nums, "int", "Return",
         "the length of the longest run of equal consecutive numbers",
         lambda xs: max(len(list(g)) for _, g in itertools.groupby(xs)), lambda: ([rng.randint(0, 3) for _ in range(9)],)),
        (["most_common_char", "top_letter"], text, "str", "Return",
         "the letter that occurs most often in the text, ignoring spaces; on a tie, the one that occurs first",
         lambda s: max(s.replace(" ", ""), key=s.replace(" ", "").count), lambda: (_sentence(rng),)),
        (["to_snake_case", "camel_to_snake"], "name: str", "str", "Convert",
         "a camelCase name to snake_case", lambda s: "".join("_" + ch.lower() if ch.isupper() else ch for ch in s),
         lambda: ("".join(w.capitalize() if i else w for i, w in enumerate(_words(rng)[:3])),)),
        (["average", "mean_rounded"], nums, "float", "Return",
         f"the mean of the numbers rounded to {d} decimal places", lambda xs: round(sum(xs) / len(xs), d),
         lambda: (_ints(rng),)),
        (["clamp_all", "clip_values"], nums, "list[int]", "Clamp",
         f"every number to the range [{lo}, {hi}]", lambda xs: [min(max(x, lo), hi) for x in xs],
         lambda: (_ints(rng, 6, -20, 50),)),
        (["interleave", "zip_strings"], "a: str, b: str", "str", "Interleave",
         "the characters of two strings, starting with a; the rest of the longer string goes at the end",
         lambda a, b: "".join(x + y for x, y in zip(a, b)) + a[len(b):] + b[len(a):],
         lambda: tuple(rng.sample(WORDS, 2))),
        (["count_set_bits", "ones_in_binary"], "n: int", "int", "Count",
         "the 1 bits in the binary representation of a non-negative integer", lambda n: bin(n).count("1"),
         lambda: (rng.randint(1, 1000),)),
        (["positions_of", "find_all"], f"{nums}, value: int", "list[int]", "Return",
         "the indices at which value occurs in the list", lambda xs, v: [i for i, x in enumerate(xs) if x == v],
         lambda: ([rng.randint(0, 4) for _ in range(8)], rng.randint(0, 4))),
    ]


def _two_term_sum(a: int, b: int, n: int) -> int:
    """The n-th term (0-based) of a, b, a + b, ..."""
    for _ in range(n):
        a, b = b, a + b
    return a


def _collatz(n: int) -> int:
    steps = 0
    while n != 1:
        n, steps = (n // 2 if n % 2 == 0 else 3 * n + 1), steps + 1
    return steps


def _code_task(rng: random.Random) -> str:
    """One small programming task from ~32 families in one of five shapes: a request with a worked example, a
    signature + docstring stub, a request to implement and test, a casual question, or code to complete. No doctest
    prompts (`>>>`): those read as HumanEval's and the decontamination drops them."""
    names, params, ret, verb, rest, ref, example = rng.choice(_task_families(rng))
    name = rng.choice(names)
    args = example()
    call, result = f"{name}({', '.join(map(repr, args))})", repr(ref(*args))
    sig, does = f"{name}({params}) -> {ret}", f"{verb.lower()}s {rest}"
    stub = f'def {sig}:\n    """{verb} {rest}.\n\n    Example: {call} returns {result}.\n    """\n'
    shapes = [
        lambda: f"Write a Python function `{sig}` that {does}. For example, `{call}` should return `{result}`.",
        lambda: stub,
        lambda: f"Implement `{name}` in Python: it takes ({params}) and {does}. Add a docstring and show "
                f"what `{call}` gives.",
        lambda: f"I need a Python function called {name} that {does}. Can you write it and explain how it works?",
        lambda: f"Complete the following Python function:\n\n```python\n{stub}```",
    ]
    return rng.choice(shapes)()


TOPICS = ["remote work", "city cycling", "learning a second language", "urban gardening", "public libraries",
          "night trains", "board games", "volunteering", "minimalism", "space exploration", "home cooking",
          "street food", "solar power", "morning routines", "museum visits", "hiking alone", "digital privacy",
          "electric cars", "handwritten letters", "local theatre", "birdwatching", "recycling", "jazz", "chess",
          "sleep", "coral reefs", "ancient libraries", "tea ceremonies", "mountain villages", "public transport"]
TRIPS = ["Lisbon", "Kyoto", "Iceland", "the Scottish Highlands", "Patagonia", "Marrakech", "Vancouver", "Crete",
         "the Amalfi Coast", "Hanoi", "New Zealand's South Island", "Prague", "Cape Town", "Oaxaca", "Norway's fjords"]
READERS = ["a ten-year-old", "a busy parent", "a first-year university student", "a retired engineer",
           "a small-business owner", "someone who has never used a computer", "a high-school class", "a new employee"]
STYLES = ["formal", "friendly", "humorous", "concise", "enthusiastic", "persuasive", "poetic", "neutral"]
PERSONAS = ["a medieval blacksmith", "a ship's captain in 1850", "a detective in 1920s Chicago", "a friendly robot",
            "a wise old tree", "a Renaissance painter", "a travel guide in Rome", "a pirate who loves books",
            "a professional chef", "a football coach", "a librarian in a magic school", "an astronaut on Mars",
            "a dragon who is afraid of fire", "a personal fitness trainer", "a stand-up comedian", "a museum curator"]
PROBLEMS = ["my neighbours are too loud at night", "I can't stick to a study schedule", "my houseplants keep dying",
            "I am nervous about a job interview", "my team misses deadlines", "I spend too much on takeaway food",
            "my teenager won't talk to me", "I want to run my first 10k", "I keep forgetting people's names",
            "my small shop gets few customers on weekdays"]
CONCEPTS = ["photosynthesis", "compound interest", "supply and demand", "the water cycle", "vaccines", "inflation",
            "black holes", "machine learning", "plate tectonics", "natural selection", "the greenhouse effect",
            "how a bill becomes law", "the placebo effect", "entropy", "blockchain", "the immune system", "tides",
            "opportunity cost", "the Renaissance", "the Industrial Revolution", "democracy in ancient Athens",
            "the scientific method", "antibiotic resistance", "the stock market", "nuclear fission", "DNA replication"]
PAIRS = [("capitalism", "socialism"), ("renting", "buying a home"), ("cats", "dogs as pets"), ("e-books", "paper books"),
         ("nuclear", "wind power"), ("public", "private schools"), ("trains", "planes for short trips"),
         ("Stoicism", "Epicureanism"), ("impressionism", "realism in painting"), ("classical", "operant conditioning"),
         ("weather", "climate"), ("viruses", "bacteria"), ("mitosis", "meiosis"), ("stocks", "bonds")]
NAMES2 = ["Alice", "Ben", "Chloe", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Leo"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
PRODUCTS = [("a wireless kettle", "kitchen"), ("a solar phone charger", "outdoor"), ("noise-cancelling earbuds", "audio"),
            ("a reusable notebook", "stationery"), ("a standing desk", "office"), ("a smart plant pot", "garden"),
            ("a foldable e-bike", "transport"), ("a weighted blanket", "home")]


def _writing_prompt(rng: random.Random) -> str:
    topic, trip, reader, style = rng.choice(TOPICS), rng.choice(TRIPS), rng.choice(READERS), rng.choice(STYLES)
    n = rng.choice([100, 150, 200, 250, 300])
    product, kind = rng.choice(PRODUCTS)
    a, b = rng.sample(NAMES2, 2)
    templates = [
        f"Write a travel blog post about a week in {trip}, with the sights, the food and one tip for visitors.",
        f"Write a {style} email to your manager asking for two days off next month to attend a friend's wedding.",
        f"Write a short poem about {topic}.",
        f"Write a {n}-word persuasive essay arguing that more people should try {topic}.",
        f"Write a product description for {product} for an online {kind} store.",
        f"Write the opening paragraph of a mystery story set in {trip}.",
        f"Write a {style} speech for a school graduation about {topic}.",
        f"Rewrite this sentence in a {style} tone: \"{a} told {b} that the meeting was moved to {rng.choice(DAYS)}.\"",
        f"Write a polite complaint letter to a hotel in {trip} about a noisy room.",
        f"Write a social media post announcing a community event about {topic}.",
        f"Write a short cover letter for a job as a {rng.choice(JOBS)}.",
        f"Write a review of a restaurant in {trip} that had great food but slow service.",
        f"Write a limerick about {topic}.",
        f"Draft a {style} message to a neighbour inviting them to a barbecue on {rng.choice(DAYS)}.",
        f"Write a short story of about {n} words in which {a} discovers something surprising about {topic}.",
        f"Write a {style} introduction for a podcast episode about {topic}.",
        f"Write a letter to your future self about {topic}.",
        f"Write a haiku sequence of three haikus about {trip}.",
    ]
    return rng.choice(templates)


def _roleplay_prompt(rng: random.Random) -> str:
    persona, problem, topic = rng.choice(PERSONAS), rng.choice(PROBLEMS), rng.choice(TOPICS)
    templates = [
        f"Pretend you are {persona}. Describe a typical day in your life.",
        f"Act as {persona} and give me your honest opinion on {topic}.",
        f"You are {persona}. Someone asks you for advice: {problem}. What do you say?",
        f"Imagine you are {persona} visiting a modern city for the first time. What surprises you most?",
        f"Play the role of a {rng.choice(JOBS)} interviewing me for a job. Ask me your first three questions.",
        f"Take on the role of {persona} and explain {rng.choice(CONCEPTS)} in your own words.",
        f"Pretend to be a career counsellor. {problem.capitalize()}. How should I handle it?",
        f"As {persona}, write a short diary entry about an unusual day.",
        f"Act as a friendly tour guide and welcome a group of visitors to {rng.choice(TRIPS)}.",
        f"You are {persona}. Convince me to take up {topic}.",
    ]
    return rng.choice(templates)


def _reasoning_prompt(rng: random.Random) -> str:
    a, b, c, d = rng.sample(NAMES2, 4)
    n, k = rng.randint(5, 40), rng.randint(2, 9)
    day = rng.randrange(7)
    templates = [
        f"{a} is taller than {b}, and {b} is taller than {c}. Is {c} taller than {a}? Explain your reasoning.",
        f"In a race, you overtake the person in position {k}. What position are you in now?",
        f"If today is {DAYS[day]}, what day of the week will it be in {n} days?",
        f"There are {n} people at a party and everyone shakes hands with everyone else once. How many handshakes are there?",
        f"{a} is {b}'s parent, and {c} is {a}'s parent. How is {c} related to {b}?",
        f"{a} walks {k} km north, then {k + 3} km east, then {k} km south. How far is {a} from the starting point?",
        f"All {rng.choice(['bloops', 'zinks', 'trolls', 'quibs'])} are green, and some green things are round. Can we "
        f"conclude that some of them are round? Explain.",
        f"{a}, {b} and {c} each have a different pet: a cat, a dog and a fish. {a} does not have the cat, and {b} has "
        f"the fish. Who has which pet?",
        f"A clock shows 3:15. What is the angle between the hour hand and the minute hand?",
        f"{a} is older than {b} but younger than {c}. {d} is older than {c}. Who is the youngest?",
        f"A farmer has {n} sheep and all but {k} run away. How many are left?",
        f"If it takes {k} machines {k} minutes to make {k} widgets, how long would it take {n} machines to make {n} widgets?",
    ]
    return rng.choice(templates)


def _math_question(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 12), rng.randint(1, 30), rng.randint(31, 120)
    x1, y1, x2, y2, x3, y3 = (rng.randint(-5, 9) for _ in range(6))
    n, m = rng.randint(20, 500), rng.randint(3, 13)
    templates = [
        f"Solve for x: {a}x + {b} = {c}.",
        f"Find the area of the triangle with vertices ({x1}, {y1}), ({x2}, {y2}) and ({x3}, {y3}).",
        f"What is the remainder when {n} is divided by {m}?",
        f"When rolling two fair dice, what is the probability that the sum is {rng.randint(3, 11)}?",
        f"Solve the system of equations: x + y = {b + c}, x - y = {c - b}.",
        f"If f(x) = {a}x^2 - {b}x + {m}, what is f({rng.randint(-4, 6)})?",
        f"The first term of an arithmetic sequence is {b} and the common difference is {a}. What is the {m}th term?",
        f"A price rises from ${n} to ${n + b * 3}. What is the percentage increase?",
        f"How many positive integers less than {n} are divisible by {m}?",
        f"Find the distance between the points ({x1}, {y1}) and ({x2}, {y2}).",
        f"What is the sum of the interior angles of a polygon with {m} sides?",
        f"Solve the inequality {a}x - {b} > {c}.",
    ]
    return rng.choice(templates)


def _knowledge_prompt(rng: random.Random) -> str:
    concept, reader, (p, q) = rng.choice(CONCEPTS), rng.choice(READERS), rng.choice(PAIRS)
    k = rng.choice([3, 4, 5])
    templates = [
        f"Explain {concept} to {reader}.",
        f"Compare {p} and {q}: what are the main differences?",
        f"What are the pros and cons of {rng.choice(TOPICS)}?",
        f"Describe {concept} in {k} short steps.",
        f"Give {k} real-world examples of {concept}.",
        f"Why does {concept} matter for everyday life? Answer in one paragraph.",
        f"What are common misconceptions about {concept}?",
        f"Summarize the history of {rng.choice(TOPICS)} in a few sentences.",
        f"Give me {k} tips for getting better at {rng.choice(TOPICS)}, in short bullet points.",
    ]
    return rng.choice(templates)


def _extraction_prompt(rng: random.Random) -> str:
    people = rng.sample(NAMES2, 3)
    items = rng.sample(PRODUCTS, 3)
    prices = [rng.randint(15, 300) for _ in items]
    text = " ".join(f"{p} bought {it} for ${pr} on {rng.choice(DAYS)}." for p, (it, _), pr in zip(people, items, prices))
    templates = [
        f"Extract every person, product and price from this text and return them as JSON: {text}",
        f"From the following text, list who spent the most and how much: {text}",
        f"Turn this text into a table with columns name, item, price and day: {text}",
        f"Summarize this text in one sentence: {text}",
    ]
    return rng.choice(templates)


def _chat_prompt(rng: random.Random) -> str:
    """One instruction in MT-Bench's first-turn shapes from our own templates (writing, roleplay, reasoning, math,
    STEM and humanities, extraction), none of its text."""
    family = rng.choices([_writing_prompt, _roleplay_prompt, _reasoning_prompt, _math_question, _knowledge_prompt,
                          _extraction_prompt], weights=[3, 2, 2, 2, 2, 1])[0]
    return family(rng)


def _chat_prompts(n: int, seed: int) -> list[str]:
    """`n` distinct chat instructions (seeded)."""
    return _distinct(_chat_prompt, random.Random(seed + 7), n)


def _code_tasks(n: int, seed: int) -> list[str]:
    """`n` distinct programming tasks (seeded)."""
    return _distinct(_code_task, random.Random(seed + 5), n)


def _distinct(make: Callable[[random.Random], str], rng: random.Random, n: int) -> list[str]:
    """Up to `n` distinct prompts, first occurrences in order, from 2n draws of `make(rng)`."""
    return list(dict.fromkeys(make(rng) for _ in range(n * 2)))[:n]


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


@functools.lru_cache(maxsize=1)
def _stdlib_stubs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(function stubs, method stubs) of the standard library, parsed once per process (~20 s)."""
    modules = _stdlib_modules(Path(sysconfig.get_paths()["stdlib"]))
    return tuple(_function_stubs(modules)), tuple(_method_stubs(modules))


def domain_prompts(
    math: int, code: int, seed: int = 0, methods: int = 0, stories: int = 0, tasks: int = 0, chat: int = 0
) -> list[str]:
    """`math` word problems, up to `code` standard-library function stubs, up to `methods` method stubs, `stories`
    narrative word problems and `tasks` programming tasks, shuffled together (seeded; `methods=0, stories=0, tasks=0`
    give the same list as before those existed)."""
    rng = random.Random(seed)
    problems = _distinct(_math_problem, rng, math)
    function_stubs, method_stubs = _stdlib_stubs()
    stubs = list(function_stubs)
    rng.shuffle(stubs)
    rows = problems + stubs[:code]
    rng.shuffle(rows)
    if methods:
        extra = list(method_stubs)
        random.Random(seed + 1).shuffle(extra)
        rows += extra[:methods]
        random.Random(seed + 2).shuffle(rows)
    if stories:
        rows += _distinct(_story_problem, random.Random(seed + 3), stories)
        random.Random(seed + 4).shuffle(rows)
    if tasks:
        rows += _code_tasks(tasks, seed)
        random.Random(seed + 6).shuffle(rows)
    if chat:
        rows += _chat_prompts(chat, seed)
        random.Random(seed + 8).shuffle(rows)
    return rows


def _texts(path: Path) -> set[str]:
    return {json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSONL file to write (text field)")
    p.add_argument("--math", type=int, default=1500, help="how many math word problems")
    p.add_argument("--code", type=int, default=1500, help="how many stdlib function stubs (at most what exists)")
    p.add_argument("--methods", type=int, default=0, help="how many stdlib class-method stubs (at most what exists)")
    p.add_argument("--stories", type=int, default=0,
                   help="how many narrative multi-step word problems (~30 families, several phrasings each)")
    p.add_argument("--tasks", type=int, default=0,
                   help="how many small programming tasks (~32 families, five shapes: requests, stubs, code to complete)")
    p.add_argument("--chat", type=int, default=0,
                   help="how many chat instructions in MT-Bench's first-turn shapes (writing, roleplay, reasoning, math, "
                        "STEM/humanities, extraction)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exclude", type=Path, action="append", default=[], metavar="JSONL",
                   help="leave out prompts already in this file (an earlier run's output); repeatable")
    args = p.parse_args()
    seen = set().union(*map(_texts, args.exclude))
    rows = domain_prompts(args.math, args.code, args.seed, args.methods, args.stories, args.tasks, args.chat)
    rows = [r for r in rows if r not in seen]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    tmp.replace(out)
    tasks = set(_code_tasks(args.tasks, args.seed)) if args.tasks else set()
    code = sum(r.startswith("def ") and r not in tasks for r in rows)
    methods, n_tasks = sum(r.startswith("class ") for r in rows), sum(r in tasks for r in rows)
    n_chat = len(set(_chat_prompts(args.chat, args.seed)) & set(rows)) if args.chat else 0
    print(f"wrote {len(rows)} prompts to {out}: {len(rows) - code - methods - n_tasks - n_chat} math word problems, {code} "
          f"standard-library function stubs, {methods} method stubs, {n_tasks} programming tasks, {n_chat} chat instructions"
          + (f" (left out {len(seen)} prompts of {len(args.exclude)} files)" if seen else ""))


if __name__ == "__main__":
    main()
