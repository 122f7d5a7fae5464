#!/bin/bash
mkdir -p /logs/verifier
cd /tests && python3 -m pytest -q test_greet.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
