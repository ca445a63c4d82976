#!/usr/bin/env bash
# checkdocs.sh: README.md's documentation index names every page of docs/
# (make lint runs it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
missing=0
for page in docs/*.md; do
	if ! grep -qF "]($page)" README.md; then
		echo "README.md's documentation index does not list $page" >&2
		missing=1
	fi
done
exit $missing
