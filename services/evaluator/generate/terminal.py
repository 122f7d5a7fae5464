"""Terminal instances: answer a question about a CSV file with shell tools (pure).

Two verdicts (equal weights, so one right file earns half): `result.txt` holds the sum, max or
min of a column, `rows.txt` the number of data rows. The check script compares exact text.

The prompt ends with the operation and the field (`... the max of field 4.`) and the reference
solution writes the result first, straight after it: the tokens the command must carry over sit
a fixed distance back, which a tiny model learns to attend to within a short warm start. With a
`head -3 data.csv` first and the field mid-prompt, a warm start of 40 steps wrote the right
field or the right operation, rarely both, and solved no held-out terminal task.
"""

from __future__ import annotations

from services.evaluator.generate.instance import Step, TaskInstance, rng_for

FAMILY = "terminal"
COLUMNS = ("qty", "price", "score", "age", "size", "weight", "amount", "level")
NAMES = ("ann", "bob", "cy", "dee", "eve", "fox", "gus", "hal")
OPS = {"sum": "the sum", "max": "the largest value", "min": "the smallest value"}


PIPES = {"sum": "awk '{s+=$1} END{print s}'", "max": "sort -n | tail -1", "min": "sort -n | head -1"}


def _pipeline(op: str, field: int) -> str:
    """One template for every question: the column's values (header cut), then the operation.

    Example: ("max", 3) -> "cut -d, -f3 data.csv | tail -n +2 | sort -n | tail -1 > result.txt"
    """
    return f"cut -d, -f{field} data.csv | tail -n +2 | {PIPES[op]} > result.txt"


def generate(*, name: str, seed: int, index: int) -> TaskInstance:
    rng = rng_for(FAMILY, seed, index)
    columns = rng.sample(COLUMNS, 3)
    target = rng.randrange(3)
    op = rng.choice(sorted(OPS))
    names = [rng.choice(NAMES) for _ in range(rng.randint(3, 7))]
    table = [[rng.randint(1, 50) for _ in columns] for _ in names]
    rows = [(n, *v) for n, v in zip(names, table, strict=True)]
    values = [v[target] for v in table]
    answer = {"sum": sum(values), "max": max(values), "min": min(values)}[op]
    header = ",".join(("name", *columns))
    csv = "\n".join([header, *(",".join(map(str, r)) for r in rows)]) + "\n"
    check = (
        "#!/bin/sh\n# Prints one verdict per check: `PASS <name>` or `FAIL <name>`.\n"
        f'if [ "$(tr -d \' \\n\' < result.txt 2>/dev/null)" = "{answer}" ]; '
        'then echo "PASS result"; else echo "FAIL result"; fi\n'
        f'if [ "$(tr -d \' \\n\' < rows.txt 2>/dev/null)" = "{len(rows)}" ]; '
        'then echo "PASS rows"; else echo "FAIL rows"; fi\n'
    )
    prompt = (
        f"data.csv has columns {header}. Write rows.txt holding the number of data rows, and "
        f"result.txt holding {OPS[op]} of the {columns[target]} column (just the number): "
        f"the {op} of field {target + 2}."
    )
    return TaskInstance(
        name=name,
        family=FAMILY,
        prompt=prompt,
        requires=("data.csv",),
        workspace={"data.csv": csv},
        hidden={"hidden/check.sh": check},
        check_script="hidden/check.sh",
        verdicts=("result", "rows"),
        grader_timeout_s=30,
        solution=(
            Step(tool="shell", arguments={"command": _pipeline(op, target + 2)}),
            Step(tool="shell", arguments={"command": "awk 'END{print NR-1}' data.csv > rows.txt"}),
        ),
        meta={"op": op, "answer": answer},
    )
