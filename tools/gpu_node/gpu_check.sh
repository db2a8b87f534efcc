#!/usr/bin/env bash
# The GPU check on an offline GPU node, in one command (options: tools/gpu_node/gpu_check.sh --help).
# Needs the node's python3 with torch, and the kit from `make gpu-kit` (default: ./gpu_kit).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 tools/gpu_node/gpu_check.py "$@"
