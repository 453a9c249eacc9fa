#!/usr/bin/env bash
# Install the PACS servers and tools used by the PACS tests and scripts/bench_pacs.py:
# Debian's `orthanc` (a real PACS server), `orthanc-dicomweb` (its DICOMweb plugin) and `dcmtk`
# (storescp/storescu). Idempotent: does nothing when all three are present; runs `apt-get update`
# once and installs only what is missing. Needs root (apt-get) when something is missing;
# otherwise it says so and exits with status 1 (the PACS tests then skip, naming this script).
set -euo pipefail
source "$(dirname "$0")/_apt_install.sh"

plugin=/usr/share/orthanc/plugins/libOrthancDicomWeb.so
missing=()
command -v Orthanc > /dev/null 2>&1 || missing+=(orthanc)
[ -f "$plugin" ] || missing+=(orthanc-dicomweb)
command -v storescp > /dev/null 2>&1 || missing+=(dcmtk)
[ ${#missing[@]} -eq 0 ] && exit 0
# another apt-get or dpkg may hold the package lock for a while: try again a few times before giving up
for attempt in 1 2 3 4; do
  apt_install install_pacs_tools.sh "${missing[@]}" && break
  [ "$attempt" -eq 4 ] && exit 1
  [ "$(id -u)" -ne 0 ] && exit 1
  echo "install_pacs_tools.sh: apt-get failed (attempt $attempt of 4; the package lock may be held); retrying in 20 s" >&2
  sleep 20
done
command -v Orthanc > /dev/null 2>&1 || { echo "install_pacs_tools.sh: Orthanc still missing after installing ${missing[*]}" >&2; exit 1; }
[ -f "$plugin" ] || { echo "install_pacs_tools.sh: $plugin still missing after installing ${missing[*]}" >&2; exit 1; }
command -v storescp > /dev/null 2>&1 || { echo "install_pacs_tools.sh: storescp still missing after installing ${missing[*]}" >&2; exit 1; }
echo "install_pacs_tools.sh: installed ${missing[*]}"
