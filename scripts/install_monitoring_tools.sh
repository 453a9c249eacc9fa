#!/usr/bin/env bash
# Install the monitoring tools used by tests/test_runner_prometheus.py: Debian's `prometheus`
# (the server that scrapes `ctpipe run --metrics-port`) and its `promtool` (lints the metrics
# textfile). Idempotent: does nothing when both are present; runs `apt-get update` once and
# installs only what is missing. Needs root (apt-get) when something is missing; otherwise it
# says so and exits with status 1 (the Prometheus tests then skip, naming this script).
set -euo pipefail
source "$(dirname "$0")/_apt_install.sh"

if command -v prometheus > /dev/null 2>&1 && command -v promtool > /dev/null 2>&1; then
  exit 0
fi
apt_install install_monitoring_tools.sh prometheus || exit 1
for tool in prometheus promtool; do
  command -v "$tool" > /dev/null 2>&1 || { echo "install_monitoring_tools.sh: $tool still missing after installing prometheus" >&2; exit 1; }
done
echo "install_monitoring_tools.sh: installed prometheus"
