#!/usr/bin/env bash
# The wheels the bare GPU machine lacks, into .gpu-wheels/ (git-ignored; travels with the device
# tool's `carry`). Run it here, where the package registry is reachable.
#
# The set is pip's own dependency closure of diffusers, open_clip_torch and ftfy for Python 3.12,
# resolved against the GPU machine's torch 2.11.0 / torchvision 0.26.0 / triton 3.6.0. Those three are
# recorded as installed in a scratch venv (metadata only), so pip neither fetches them nor lets a
# dependency replace them; everything else the closure needs is downloaded, whatever the GPU machine
# happens to have (pip keeps an installed version that satisfies). The closure is then installed
# offline into a second fresh venv, the way run.sh installs it, to prove it complete.
#
#   bash benchmarks/gpu/fetch_wheels.sh            # PY312=/path/to/python3.12 to choose the interpreter
set -euo pipefail
cd "$(dirname "$0")/../.."
PY312=${PY312:-python3.12}
PACKAGES=(diffusers open_clip_torch ftfy)
PROVIDED=(torch==2.11.0 torchvision==0.26.0 triton==3.6.0)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

venv_with_provided() {  # venv_with_provided DIR: a Python 3.12 venv that "has" the GPU machine's builds
  "$PY312" -m venv "$1"
  local site
  site=$("$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  for dist in "${PROVIDED[@]}"; do
    local name=${dist%%==*} version=${dist##*==}
    mkdir -p "$site/$name-$version.dist-info"
    printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$name" "$version" >"$site/$name-$version.dist-info/METADATA"
    : >"$site/$name-$version.dist-info/RECORD"
  done
}

venv_with_provided "$WORK/resolve"
"$WORK/resolve/bin/python" -m pip install --quiet --dry-run --only-binary=:all: --report "$WORK/report.json" "${PACKAGES[@]}"
"$WORK/resolve/bin/python" - "$WORK/report.json" >"$WORK/pins.txt" <<'PY'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    print(f"{item['metadata']['name']}=={item['metadata']['version']}")
PY
echo "closure: $(tr '\n' ' ' <"$WORK/pins.txt")"
rm -rf .gpu-wheels
mkdir -p .gpu-wheels
"$WORK/resolve/bin/python" -m pip download --quiet --no-deps --only-binary=:all: -d .gpu-wheels -r "$WORK/pins.txt"

venv_with_provided "$WORK/check"
"$WORK/check/bin/python" -m pip install --quiet --no-index --find-links .gpu-wheels "${PACKAGES[@]}"
echo "offline install into a fresh Python 3.12 venv: ok ($(ls .gpu-wheels | wc -l) wheels, $(du -sh .gpu-wheels | cut -f1))"
