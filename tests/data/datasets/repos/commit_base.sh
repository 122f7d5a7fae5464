#!/bin/sh
# Commit the files of the current folder as the fixture repositories' base commit, with a fixed
# author, date and message, so the commit's sha is the `base_commit` the fixture rows name.
# Usage (in an image build or a test): cp -r repos/calc /testbed && cd /testbed && sh commit_base.sh
set -eu
export GIT_AUTHOR_NAME=gyre GIT_AUTHOR_EMAIL=gyre@localhost GIT_AUTHOR_DATE="2026-01-01T00:00:00+0000"
export GIT_COMMITTER_NAME=gyre GIT_COMMITTER_EMAIL=gyre@localhost GIT_COMMITTER_DATE="2026-01-01T00:00:00+0000"
git init -q
git config user.name gyre
git config user.email gyre@localhost
git config commit.gpgsign false
git add -A
git commit -q -m base
git rev-parse HEAD
