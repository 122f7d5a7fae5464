#!/bin/bash
# R2E-Gym keeps this at /root/run_tests.sh and runs it in /testbed with r2e_tests linked in.
cd /testbed
python3 -m pytest -rA r2e_tests
