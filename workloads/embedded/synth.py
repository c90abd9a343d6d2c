"""Deterministic synthetic text for the embedded model: a pretraining corpus and a downstream task.

The corpus is a small, consistent world written in plain English sentences:
- creatures (made-up names) with fixed attributes (color, home, food, size, legs), told as facts
  and short stories, so the model learns a knowledge base and a grammar;
- numbers 0..99 counted up and down, compared in pairs ("41 is more than 17."), added, and
  listed, so the model learns the order of the numbers and the list format.

The downstream task, "largest": a list of four numbers, pick the largest. The corpus never
shows the question nor any "largest of a list" statement, so the base model scores the four
candidates by how plausible each number is after the prompt (≈ chance), but it already knows
the vocabulary, the list format and which number is bigger in a pair — structure a LoRA can
reuse to learn the rule quickly.

Everything is a pure function of a seed (``random.Random``), so the build is reproducible and
the tests can check it.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator

NUMBER_MAX = 99  # numbers are 0..NUMBER_MAX, each one token in the trained tokenizer
N_CHOICES = 4

COLORS = ("red", "blue", "green", "yellow", "black", "white", "orange", "purple")
PLACES = ("forest", "river", "desert", "mountain", "lake", "cave", "field", "city")
FOODS = ("fish", "berries", "seeds", "grass", "bread", "honey", "nuts", "apples")
SIZES = ("tiny", "small", "big", "huge")
LEGS = (2, 4, 6, 8)
SYLLABLES = ("ba", "ko", "ri", "mu", "zel", "tan", "po", "vi", "lo", "sha", "dra", "ne", "fi", "gu", "xo", "ter")
N_CREATURES = 48

# The task prompt. Its words all occur in the corpus, but never in this form.
TASK_QUESTION = "Which number is the largest"


@dataclass(frozen=True)
class Creature:
    name: str
    color: str
    place: str
    food: str
    size: str
    legs: int


def make_world(seed: int) -> tuple[Creature, ...]:
    """N_CREATURES creatures with distinct two-syllable names and fixed attributes."""
    rng = random.Random(f"world-{seed}")
    names = sorted({a + b for a in SYLLABLES for b in SYLLABLES if a != b})
    rng.shuffle(names)
    return tuple(
        Creature(name, rng.choice(COLORS), rng.choice(PLACES), rng.choice(FOODS), rng.choice(SIZES), rng.choice(LEGS))
        for name in names[:N_CREATURES]
    )


# ---------------------------------------------------------------------------------------------
# Pretraining corpus: one document = a short paragraph.


def _facts(c: Creature, rng: random.Random) -> str:
    sentences = [
        f"The {c.name} is {c.color}.",
        f"The {c.name} lives in the {c.place}.",
        f"The {c.name} eats {c.food}.",
        f"The {c.name} is {c.size}.",
        f"The {c.name} has {c.legs} legs.",
        f"A {c.name} is a {c.size} {c.color} animal.",
        f"You can find the {c.name} in the {c.place}.",
        f"Every morning the {c.name} looks for {c.food}.",
    ]
    rng.shuffle(sentences)
    return " ".join(sentences[: rng.randint(2, 5)])


def _story(world: tuple[Creature, ...], rng: random.Random) -> str:
    a, b = rng.sample(world, 2)
    n, m = rng.randint(2, 40), rng.randint(2, 40)
    out = [
        f"One day the {a.name} went to the {b.place}.",
        f"There it met a {b.color} {b.name}.",
        f"The {b.name} had {n} {b.food} and the {a.name} had {m} {a.food}.",
    ]
    if n != m:
        big, small = (b, a) if n > m else (a, b)
        out.append(f"The {big.name} had more food than the {small.name}.")
    else:
        out.append("They had the same amount of food.")
    out.append(f"Then the {a.name} went back to the {a.place}.")
    return " ".join(out)


def _counting(rng: random.Random) -> str:
    length = rng.randint(5, 16)
    step = rng.choice((1, 1, 1, 2, 5, 10))
    up = rng.random() < 0.6
    span = step * (length - 1)
    if span > NUMBER_MAX:
        length = NUMBER_MAX // step + 1
        span = step * (length - 1)
    start = rng.randint(0, NUMBER_MAX - span) if up else rng.randint(span, NUMBER_MAX)
    seq = [start + (i * step if up else -i * step) for i in range(length)]
    how = "up" if up else "down"
    by = "" if step == 1 else f" by {step}"
    return f"Count {how}{by} from {start}: " + ", ".join(map(str, seq)) + "."


def _compare(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(2, 5)):
        x, y = rng.randint(0, NUMBER_MAX), rng.randint(0, NUMBER_MAX)
        if x == y:
            out.append(f"{x} is equal to {y}.")
        elif rng.random() < 0.5:
            out.append(f"{x} is {'more' if x > y else 'less'} than {y}.")
        else:
            out.append(f"{max(x, y)} is bigger than {min(x, y)}." if rng.random() < 0.5 else f"{min(x, y)} is smaller than {max(x, y)}.")
    return " ".join(out)


def _arithmetic(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(2, 4)):
        x = rng.randint(0, NUMBER_MAX)
        y = rng.randint(0, NUMBER_MAX - x)
        out.append(f"{x} plus {y} is {x + y}." if rng.random() < 0.5 else f"{x + y} minus {y} is {x}.")
    return " ".join(out)


def _listing(world: tuple[Creature, ...], rng: random.Random) -> str:
    k = rng.randint(3, 6)
    nums = ", ".join(str(rng.randint(0, NUMBER_MAX)) for _ in range(k))
    c = rng.choice(world)
    lead = rng.choice((
        "Here are some numbers",
        f"The {c.name} wrote down {k} numbers",
        "Which numbers did you see? I saw these numbers",
        "The list has these numbers",
    ))
    return f"{lead}: {nums}."


def _sizes(world: tuple[Creature, ...], rng: random.Random) -> str:
    """Superlatives over creatures ordered by size, so 'largest'/'smallest' are known words."""
    by_size = {s: [c for c in world if c.size == s] for s in SIZES}
    present = [s for s in SIZES if by_size[s]]
    sizes = sorted(rng.sample(present, min(len(present), rng.randint(2, 3))), key=SIZES.index)
    group = [rng.choice(by_size[s]) for s in sizes]
    largest, smallest = group[-1], group[0]
    rng.shuffle(group)
    names = ", ".join(f"the {c.name}" for c in group[:-1]) + f" and the {group[-1].name}"
    if rng.random() < 0.5:
        return f"Of {names}, the largest is the {largest.name}. It is {largest.size}."
    return f"Of {names}, the smallest is the {smallest.name}. It is {smallest.size}."


def _questions(world: tuple[Creature, ...], rng: random.Random) -> str:
    """Question/answer pairs about the world, so 'Which ... ?' and 'Answer:' are known forms."""
    c = rng.choice(world)
    kind = rng.randrange(4)
    if kind == 0:
        return f"Which color is the {c.name}?\nAnswer: {c.color}."
    if kind == 1:
        return f"Where does the {c.name} live?\nAnswer: in the {c.place}."
    if kind == 2:
        return f"What does the {c.name} eat?\nAnswer: {c.food}."
    return f"How many legs does the {c.name} have?\nAnswer: {c.legs}."


def pretraining_corpus(seed: int, n_docs: int) -> Iterator[str]:
    """`n_docs` documents, a fixed mix of the kinds above."""
    world = make_world(seed)
    rng = random.Random(f"corpus-{seed}")
    kinds = (
        (0.20, lambda: _facts(rng.choice(world), rng)),
        (0.15, lambda: _story(world, rng)),
        (0.15, lambda: _counting(rng)),
        (0.15, lambda: _compare(rng)),
        (0.10, lambda: _arithmetic(rng)),
        (0.10, lambda: _listing(world, rng)),
        (0.10, lambda: _questions(world, rng)),
        (0.05, lambda: _sizes(world, rng)),
    )
    weights = [w for w, _ in kinds]
    makers = [f for _, f in kinds]
    for _ in range(n_docs):
        yield rng.choices(makers, weights)[0]()


# ---------------------------------------------------------------------------------------------
# Downstream task.


def task_row(rng: random.Random) -> dict:
    """One multiple-choice row: four distinct numbers in the prompt, the same four as choices."""
    nums = rng.sample(range(NUMBER_MAX + 1), N_CHOICES)
    prompt = f"{TASK_QUESTION}: {', '.join(map(str, nums))}?\nAnswer:"
    return {"prompt": prompt, "choices": [str(n) for n in nums], "answer": nums.index(max(nums))}


def make_task(seed: int, sizes: dict[str, int]) -> dict[str, list[dict]]:
    """Disjoint splits (no prompt appears in two splits), answer position balanced by chance."""
    rng = random.Random(f"task-{seed}")
    seen: set[str] = set()
    splits: dict[str, list[dict]] = {}
    for split, n in sizes.items():
        rows: list[dict] = []
        while len(rows) < n:
            row = task_row(rng)
            if row["prompt"] not in seen:
                seen.add(row["prompt"])
                rows.append(row)
        splits[split] = rows
    return splits
