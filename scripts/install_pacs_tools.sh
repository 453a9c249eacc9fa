#!/usr/bin/env bash
# Install the PACS servers and tools used by the PACS tests and scripts/bench_pacs.py:
# Debian's `orthanc` (a real PACS server), `orthanc-dicomweb` (its DICOMweb plugin) and `dcmtk`
# (storescp/storescu). Idempotent: does nothing when all three are present; runs `apt-get update`
# once and installs only what is missing. Needs root (apt-get) when something is missing;
# otherwise it says so and exits with status 1 (the PACS tests then skip, naming this script).
set -euo pipefail

plugin=/usr/share/orthanc/plugins/libOrthancDicomWeb.so
missing=()
command -v Orthanc > /dev/null 2>&1 || missing+=(orthanc)
[ -f "$plugin" ] || missing+=(orthanc-dicomweb)
command -v storescp > /dev/null 2>&1 || missing+=(dcmtk)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_pacs_tools.sh: ${missing[*]} missing and not running as root;" \
       "install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
if ! command -v apt-get > /dev/null 2>&1; then
  echo "install_pacs_tools.sh: ${missing[*]} missing and apt-get not found (not a Debian-based system);" \
       "install orthanc, orthanc-dicomweb and dcmtk with the system's package manager" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The packages' maintainer scripts may try to start a service: not wanted here (tests start Orthanc themselves).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  made_policy=1
fi
status=0
{ apt-get update -qq && apt-get install -qq -y --no-install-recommends "${missing[@]}"; } > "$log" 2>&1 || status=$?
if [ "$made_policy" -eq 1 ]; then
  rm -f "$policy"
fi
if [ "$status" -ne 0 ]; then
  cat "$log" >&2
  echo "install_pacs_tools.sh: apt-get could not install ${missing[*]}" >&2
  exit 1
fi
command -v Orthanc > /dev/null 2>&1 || { echo "install_pacs_tools.sh: Orthanc still missing after installing ${missing[*]}" >&2; exit 1; }
[ -f "$plugin" ] || { echo "install_pacs_tools.sh: $plugin still missing after installing ${missing[*]}" >&2; exit 1; }
command -v storescp > /dev/null 2>&1 || { echo "install_pacs_tools.sh: storescp still missing after installing ${missing[*]}" >&2; exit 1; }
echo "install_pacs_tools.sh: installed ${missing[*]}"
