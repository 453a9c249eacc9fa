#!/usr/bin/env bash
# Download, into .whl/ (git-ignored, about 17 MB), the wheels that scripts/gpu_check.sh needs on a GPU
# machine whose Python (3.12) has torch, numpy, scipy, scikit-image, pandas, matplotlib, pyyaml,
# prometheus-client and tqdm but not the DICOM and MONAI packages (pydicom, highdicom for the DICOM results,
# nibabel for MONAI's Orientation transform). The GPU tests and benchmarks do not
# need SimpleITK (only the CPU comparisons with it do).
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${GPU_PYTHON_VERSION:-3.12}
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  "${platforms[@]}" -d .whl \
  monai pydicom pylibjpeg pylibjpeg-openjpeg pylibjpeg-rle pylibjpeg-libjpeg trimesh highdicom pyjpegls nibabel
du -sh .whl
