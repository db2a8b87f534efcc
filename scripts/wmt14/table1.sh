#!/usr/bin/env bash
# The paper's Table 1 in one command (options: scripts/wmt14/table1.sh --help;
# fw_research.wmt14.table1_run says what it does).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[[ -x $REPO/.venv/bin/python ]] && PATH=$REPO/.venv/bin:$PATH
exec python3 -m fw_research.wmt14.table1_run "$@"
