#!/bin/sh
# Prints one verdict per check: `PASS <name>` or `FAIL <name>`.
if [ "$(tr -d ' \n' < total.txt 2>/dev/null)" = "12" ]; then echo "PASS total"; else echo "FAIL total"; fi
if [ "$(cat names.txt 2>/dev/null)" = "$(printf 'ann\nbob')" ]; then echo "PASS names"; else echo "FAIL names"; fi
