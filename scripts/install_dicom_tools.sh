#!/usr/bin/env bash
# Install the DICOM validators used by the DICOM-output tests: `dciodvfy` (Debian's dicom3tools)
# and `dsrdump` (Debian's dcmtk). Idempotent: does nothing when both are on PATH.
# Needs root (apt-get) when one is missing; otherwise it says so and exits with status 1.
set -euo pipefail
source "$(dirname "$0")/_apt_install.sh"

missing=()
command -v dciodvfy > /dev/null 2>&1 || missing+=(dicom3tools)
command -v dsrdump > /dev/null 2>&1 || missing+=(dcmtk)
[ ${#missing[@]} -eq 0 ] && exit 0
apt_install install_dicom_tools.sh "${missing[@]}" || exit 1
for tool in dciodvfy dsrdump; do
  command -v "$tool" > /dev/null 2>&1 || { echo "install_dicom_tools.sh: $tool still missing after installing ${missing[*]}" >&2; exit 1; }
done
echo "install_dicom_tools.sh: installed ${missing[*]}"
