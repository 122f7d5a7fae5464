"""Small container-task fixtures built on this machine: repos, images, task folders, patches (shell).

Each fixture is a tiny repository with a bug, in the shape of a SWE-bench instance (or a Harbor
task): an image `FROM` the offline base with the repository committed at its workdir, a task
folder as `gyre tasks import` writes it (docs/datasets.md), and four diffs whose grade is known:

    gold   the fix                           -> resolved (1.0)
    empty  no change                         -> F2P fail, P2P pass
    wrong  a fix that is half right          -> partial, strictly between empty and gold
    cheat  edits the tests so they pass      -> the test patch wins: graded as `empty`

Used by tests/test_container_grading.py and `python -m bench.datasets`.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gyre_app.images import DEFAULT_BASE, build_repo_image

CALC = {
    "mini/__init__.py": "",
    "mini/calc.py": (
        "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n\n\n"
        "def neg(a):\n    return -a\n"
    ),
    "tests/__init__.py": "",
    "tests/test_calc.py": (
        "from mini.calc import add, neg\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_neg():\n    assert neg(2) == -2\n"
    ),
}
CALC_TESTS = {
    "tests/test_calc.py": CALC["tests/test_calc.py"].replace("add, neg", "add, mul, neg")
    + "\n\ndef test_mul():\n    assert mul(3, 4) == 12\n\n\ndef test_mul_zero():\n    assert mul(5, 0) == 0\n"
}
SLUG = {
    "slugs/__init__.py": "",
    "slugs/slug.py": (
        "def slugify(text):\n    return '-'.join(text.lower().split())\n\n\n"
        "def unslug(slug):\n    return slug.replace('-', ' ')\n"
    ),
    "tests/test_slug.py": (
        "from slugs.slug import slugify, unslug\n\n\n"
        "def test_basic():\n    assert slugify('A b') == 'a-b'\n\n\n"
        "def test_unslug():\n    assert unslug('a-b') == 'a b'\n"
    ),
}
SLUG_TESTS = {
    "tests/test_slug.py": SLUG["tests/test_slug.py"]
    + "\n\ndef test_punctuation():\n    assert slugify('Hi, there!') == 'hi-there'\n\n\n"
    "def test_digits_kept():\n    assert slugify('Top 10') == 'top-10'\n\n\n"
    "def test_dashes_collapse():\n    assert slugify('a - b') == 'a-b'\n"
}
TABLE = {
    "table/__init__.py": "",
    "table/lookup.py": (
        "from pathlib import Path\n\nDATA = Path(__file__).with_name('table.bin')\n\n\n"
        "def size():\n    return DATA.stat().st_size if DATA.exists() else 0\n\n\n"
        "def first_byte():\n    return DATA.read_bytes()[0]\n"
    ),
    "tests/test_lookup.py": (
        "from table.lookup import size\n\n\ndef test_size_known():\n    assert size() >= 0\n"
    ),
}
TABLE_TESTS = {
    "tests/test_lookup.py": TABLE["tests/test_lookup.py"].replace("import size", "import first_byte, size")
    + "\n\ndef test_size():\n    assert size() == 256\n\n\n"
    "def test_first_byte():\n    assert first_byte() == 0xFF\n"
}
BINARY_TABLE = bytes(range(255, -1, -1))


@dataclass(frozen=True, slots=True, kw_only=True)
class Fixture:
    name: str
    family: str
    base: Mapping[str, str | bytes]
    test_files: Mapping[str, str | bytes]
    """The files after the dataset's test patch (swebench) or the hidden tests/ (harbor)."""
    gold: Mapping[str, str | bytes]
    wrong: Mapping[str, str | bytes]
    cheat: Mapping[str, str | bytes]
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    test_command: str = "python3 -m pytest -rA -p no:cacheprovider tests"
    workdir: str = "/testbed"
    prompt: str = "Fix the bug the issue describes."
    expected: Mapping[str, float] = field(default_factory=dict)
    """Case -> the score it must get."""


HARBOR_TEST = (
    "#!/bin/bash\nmkdir -p /logs/verifier\n"
    'if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then echo 1 > /logs/verifier/reward.txt;'
    " elif [ -f /app/answer.txt ]; then echo 0.25 > /logs/verifier/reward.txt;"
    " else echo 0 > /logs/verifier/reward.txt; fi\n"
)

FIXTURES = (
    Fixture(
        name="mini-calc-1",
        family="swebench",
        base=CALC,
        test_files=CALC_TESTS,
        gold={
            "mini/calc.py": CALC["mini/calc.py"].replace(
                "    return a + b\n\n\ndef neg", "    return a * b\n\n\ndef neg"
            )
        },
        wrong={
            "mini/calc.py": CALC["mini/calc.py"].replace(
                "    return a + b\n\n\ndef neg", "    return a * b or 1\n\n\ndef neg"
            )
        },
        cheat={
            "tests/test_calc.py": CALC["tests/test_calc.py"]
            + "\n\ndef test_mul():\n    assert True\n\n\ndef test_mul_zero():\n    assert True\n"
        },
        fail_to_pass=("tests/test_calc.py::test_mul", "tests/test_calc.py::test_mul_zero"),
        pass_to_pass=("tests/test_calc.py::test_add", "tests/test_calc.py::test_neg"),
        expected={"gold": 1.0, "empty": 0.3, "wrong": 0.65, "cheat": 0.3},
    ),
    Fixture(
        name="slugs-slug-2",
        family="swebench",
        base=SLUG,
        test_files=SLUG_TESTS,
        gold={
            "slugs/slug.py": SLUG["slugs/slug.py"].replace(
                "    return '-'.join(text.lower().split())",
                "    kept = ''.join(c if c.isalnum() else ' ' for c in text.lower())\n"
                "    return '-'.join(kept.split())",
            )
        },
        wrong={
            "slugs/slug.py": SLUG["slugs/slug.py"].replace(
                "    return '-'.join(text.lower().split())",
                "    return '-'.join(text.lower().replace(',', '').replace('!', '').split())",
            )
        },
        cheat={
            "tests/test_slug.py": SLUG["tests/test_slug.py"].replace(
                "'a-b'\n\n\n", "'a-b'\n\n\ndef test_punctuation():\n    pass\n\n\n", 1
            )
        },
        fail_to_pass=("tests/test_slug.py::test_punctuation", "tests/test_slug.py::test_dashes_collapse"),
        pass_to_pass=(
            "tests/test_slug.py::test_basic",
            "tests/test_slug.py::test_unslug",
            "tests/test_slug.py::test_digits_kept",
        ),
        expected={"gold": 1.0, "empty": 0.3, "wrong": 0.65, "cheat": 0.3},
    ),
    Fixture(
        name="table-binary-3",
        family="swebench",
        base=TABLE,
        test_files=TABLE_TESTS,
        gold={"table/table.bin": BINARY_TABLE},
        wrong={"table/table.bin": bytes(256)},
        cheat={
            "tests/test_lookup.py": TABLE_TESTS["tests/test_lookup.py"]
            .replace("== 256", ">= 0")
            .replace("== 0xFF", "is not None")
        },
        fail_to_pass=("tests/test_lookup.py::test_size", "tests/test_lookup.py::test_first_byte"),
        pass_to_pass=("tests/test_lookup.py::test_size_known",),
        expected={"gold": 1.0, "empty": 0.3, "wrong": 0.65, "cheat": 0.3},
    ),
    Fixture(
        name="answer-harbor-4",
        family="harbor",
        base={"README": "Write the answer to /app/answer.txt\n"},
        test_files={"test.sh": HARBOR_TEST},
        gold={"answer.txt": "42\n"},
        wrong={"answer.txt": "41\n"},
        # Planting a reward or a fake test script is wiped: /tests and /logs/verifier are reset.
        cheat={"tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n"},
        test_command="bash /tests/test.sh",
        workdir="/app",
        expected={"gold": 1.0, "empty": 0.0, "wrong": 0.25, "cheat": 0.0},
    ),
)
CASES = ("gold", "empty", "wrong", "cheat")


def image_tag(fixture: Fixture) -> str:
    return f"localhost/gyre-fixture-{fixture.name}:1"


def _write(root: Path, files: Mapping[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def _git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout


def make_diff(base: Mapping[str, str | bytes], changed: Mapping[str, str | bytes]) -> bytes:
    """A binary-safe git diff that turns `base` into `base` overlaid with `changed`."""
    with tempfile.TemporaryDirectory(prefix="gyre-fixture-") as tmp:
        repo = Path(tmp)
        _git(repo, "init", "-q")
        _write(repo, base)
        _git(repo, "add", "-A")
        _git(repo, "-c", "user.email=g@l", "-c", "user.name=g", "commit", "-q", "-m", "base")
        _write(repo, changed)
        _git(repo, "add", "-A")
        return _git(repo, "diff", "--cached", "--binary", "HEAD")


def write_task(fixture: Fixture, out: Path) -> Path:
    """The task folder `gyre tasks import` would write for this fixture; returns it."""
    folder = out / fixture.name
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "hidden").mkdir(parents=True)
    lines = [
        f'name = "{fixture.name}"',
        f'family = "{fixture.family}"',
        f"prompt = {fixture.prompt!r}",
        "grader_timeout_s = 300.0",
        "",
        "[source]",
        f'format = "{fixture.family}"',
        f'id = "{fixture.name}"',
        "",
        "[environment]",
        f'image = "{image_tag(fixture)}"',
        f'workdir = "{fixture.workdir}"',
        "cpus = 1.0",
        "memory_mb = 1024",
        "storage_mb = 512",
        "",
        "[grading]",
        f"test_command = {fixture.test_command!r}",
    ]
    if fixture.family == "swebench":
        lines += [
            'log_parser = "pytest"',
            f"fail_to_pass = {list(fixture.fail_to_pass)!r}",
            f"pass_to_pass = {list(fixture.pass_to_pass)!r}",
            "weights = { fail_to_pass = 0.7, pass_to_pass = 0.3 }",
        ]
        (folder / "hidden" / "test.patch").write_bytes(make_diff(fixture.base, fixture.test_files))
        (folder / "hidden" / "gold.patch").write_bytes(make_diff(fixture.base, fixture.gold))
    else:
        lines += ['tests_dir = "hidden/tests"', "timeout_s = 60.0"]
        _write(folder / "hidden" / "tests", fixture.test_files)
        _write(folder / "hidden" / "solution", fixture.gold)
    (folder / "task.toml").write_text("\n".join(lines) + "\n")
    return folder


def case_diff(fixture: Fixture, case: str) -> bytes:
    changed = {"gold": fixture.gold, "wrong": fixture.wrong, "cheat": fixture.cheat, "empty": {}}[case]
    return make_diff(fixture.base, changed) if changed else b""


def build_image(fixture: Fixture, *, base: str = DEFAULT_BASE) -> bool:
    with tempfile.TemporaryDirectory(prefix="gyre-fixture-repo-") as tmp:
        _write(Path(tmp), fixture.base)
        return build_repo_image(base=base, tag=image_tag(fixture), repo=Path(tmp), workdir=fixture.workdir)
