"""Importers: public task datasets (SWE-bench family, R2E-Gym, Harbor) into Gyre task folders.

The row and folder readers are pure (`swebench_rows`, `r2e_rows`, `harbor_folders`); `sources`
reads a SOURCE path and `writer` writes the set, all or nothing. The folder layout is the
contract in docs/datasets.md, section "Importing a dataset".
"""
