"""Generate the Python contracts from `proto/` (shell: runs protoc).

The generated modules are committed under `gyre/<package>/v1/` (protoc derives the import path
from the proto path, `gyre.<service>.v1`), so a fresh checkout imports without a build step.
`python -m gyre.codegen --check` regenerates into a scratch folder and fails when the committed
files differ: the stale-contract test runs it. grpcio-tools and mypy-protobuf are pinned exactly
in `pyproject.toml`, which is what makes the output reproducible.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def _plugin(name: str) -> str:
    scripts = Path(sysconfig.get_path("scripts"))
    path = scripts / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            raise SystemExit(f"{name} not found: install the dev extra (pip install -e '.[dev]')")
        path = Path(found)
    return str(path)


def generate(out_dir: Path) -> list[Path]:
    """Run protoc over every proto file into out_dir; return the generated files."""
    from grpc_tools import protoc  # dev-only dependency, imported late on purpose

    includes = Path(protoc.__file__).parent / "_proto"
    rel = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{includes}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *rel,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    generated = [p for p in out_dir.rglob("*") if p.name.endswith(GENERATED_SUFFIXES)]
    # protoc writes no package markers; the generated folders are regular packages.
    folders = {parent for p in generated for parent in p.parents if out_dir in parent.parents}
    for folder in folders:
        marker = folder / "__init__.py"
        if not marker.exists():
            marker.write_text('"""Generated from proto/ by gyre.codegen; do not edit."""\n')
            generated.append(marker)
    return sorted(generated)


def committed_files(root: Path) -> list[Path]:
    """Generated files as they stand in a tree (the proto packages under gyre/)."""
    folders = {root / proto.relative_to(PROTO_ROOT).parent for proto in proto_files()}
    found = [
        p
        for folder in folders
        if folder.is_dir()
        for p in folder.iterdir()
        if p.name.endswith(GENERATED_SUFFIXES)
    ]
    return sorted(found)


def stale_files() -> list[str]:
    """Paths (relative to the repo) whose committed contents differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh_root = Path(tmp)
        fresh = {p.relative_to(fresh_root) for p in generate(fresh_root) if p.name != "__init__.py"}
        current = {p.relative_to(REPO_ROOT) for p in committed_files(REPO_ROOT)}
        differ = sorted(str(p) for p in fresh ^ current)
        for rel in sorted(fresh & current):
            if not filecmp.cmp(fresh_root / rel, REPO_ROOT / rel, shallow=False):
                differ.append(str(rel))
        return differ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.codegen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed contracts are stale")
    ns = parser.parse_args(argv)
    if ns.check:
        stale = stale_files()
        if stale:
            print("stale generated contracts (run `make proto`):", *stale, sep="\n  ")
            return 1
        print("generated contracts are up to date")
        return 0
    for old in committed_files(REPO_ROOT):
        old.unlink()
    written = generate(REPO_ROOT)
    print(f"generated {len(written)} files from {len(proto_files())} proto files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
