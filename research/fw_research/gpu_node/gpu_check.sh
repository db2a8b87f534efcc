#!/usr/bin/env bash
# The GPU check on an offline node, in one command (options: research/fw_research/gpu_node/gpu_check.sh --help).
# Needs the node's python3 with torch, and the kit from `make gpu-kit` (default: ./gpu_kit). The node installs
# nothing of the checkout: it runs from the repository root, with the research package put on the path.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD/research${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -m fw_research.gpu_node.gpu_check "$@"
