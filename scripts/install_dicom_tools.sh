#!/usr/bin/env bash
# Install the DICOM validators used by the DICOM-output tests: `dciodvfy` (Debian's dicom3tools)
# and `dsrdump` (Debian's dcmtk). Idempotent: does nothing when both are on PATH.
# Needs root (apt-get) when one is missing; otherwise it says so and exits with status 1.
set -euo pipefail

missing=()
command -v dciodvfy > /dev/null 2>&1 || missing+=(dicom3tools)
command -v dsrdump > /dev/null 2>&1 || missing+=(dcmtk)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_dicom_tools.sh: ${missing[*]} missing (dciodvfy/dsrdump) and not running as root;" \
       "install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
if ! command -v apt-get > /dev/null 2>&1; then
  echo "install_dicom_tools.sh: ${missing[*]} missing and apt-get not found (not a Debian-based system);" \
       "install dicom3tools and dcmtk with the system's package manager" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { apt-get update -qq && apt-get install -qq -y --no-install-recommends "${missing[@]}"; } > "$log" 2>&1; then
  cat "$log" >&2
  echo "install_dicom_tools.sh: apt-get could not install ${missing[*]}" >&2
  exit 1
fi
for tool in dciodvfy dsrdump; do
  if ! command -v "$tool" > /dev/null 2>&1; then
    echo "install_dicom_tools.sh: $tool still missing after installing ${missing[*]}" >&2
    exit 1
  fi
done
echo "install_dicom_tools.sh: installed ${missing[*]}"
